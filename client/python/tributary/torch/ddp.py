"""A DistributedDataParallel communication hook that sends DDP's buckets through Tributary."""

import torch

from tributary.torch import ops


def ddp_comm_hook(state, bucket):
    """model.register_comm_hook(state, tributary.torch.ddp_comm_hook): averages each gradient
    bucket over every process with push_pull. `state` may be None, or a string that prefixes
    the tensor names (to tell several DDP models apart). Returns a torch.futures.Future that
    a waiter thread completes when the all-reduce is done (its error fails the future)."""
    tensor = bucket.buffer()
    prefix = state if isinstance(state, str) else "ddp"
    # DDP rebuilds its buckets after the first iteration, identically on every rank: the size
    # in the name keeps a rebuilt bucket from continuing an old bucket's iterations.
    name = f"{prefix}.bucket.{bucket.index()}.{tensor.numel()}"
    future = torch.futures.Future()
    handle = ops.push_pull_async(tensor, average=True, name=name)
    ops._get().get_waiter().submit(handle, future)
    return future
