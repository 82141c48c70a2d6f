"""PyTorch on Tributary, Horovod/BytePS-shaped.

    import tributary.torch as trt
    trt.init()
    optimizer = trt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    trt.broadcast_parameters(model.state_dict(), root_rank=0)

Importing it also registers the torch.distributed backend "tributary"
(`torch.distributed.init_process_group("tributary")`, see tributary.distributed).

See client/python/README.md.
"""

import tributary.distributed  # noqa: F401  (registers the "tributary" torch.distributed backend)
from tributary import MembershipChanged, TributaryError
from tributary.torch.compression import Compression
from tributary.torch.ddp import ddp_comm_hook
from tributary.torch.ops import (Handle, allgather, allgather_async, barrier, broadcast,
                                 broadcast_async, broadcast_object, broadcast_optimizer_state,
                                 broadcast_parameters, empty, init, init_params,
                                 init_params_async, is_initialized, local_rank, local_size, poll,
                                 pull_params, pull_params_async, push_delta, push_delta_async,
                                 push_pull, push_pull_async, rank, reduce_scatter,
                                 reduce_scatter_async, resync, shutdown, size, synchronize)
from tributary.torch.optimizer import DistributedOptimizer

__all__ = [
    "TributaryError", "MembershipChanged", "Compression", "DistributedOptimizer", "Handle", "allgather",
    "allgather_async", "barrier", "broadcast", "broadcast_async", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "ddp_comm_hook", "empty", "init",
    "init_params", "init_params_async", "pull_params", "pull_params_async", "push_delta",
    "push_delta_async", "is_initialized", "local_rank", "local_size", "poll", "push_pull", "push_pull_async",
    "rank", "reduce_scatter", "reduce_scatter_async", "resync", "shutdown", "size", "synchronize",
]
