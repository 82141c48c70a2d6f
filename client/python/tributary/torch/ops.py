"""Collectives on torch tensors over Tributary: session, staging pool, handles.

Thread safety: every function may be called from several threads (the state is guarded by a
lock; the client library is thread-safe), but one tensor must not be handed to two operations
at once, nor touched while an operation on it is in flight.
"""

import pickle
import queue
import threading
import weakref

import torch

from tributary import TributaryError, _tributary

# torch dtypes the data plane reduces, by their Tributary names.
_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
}

# Staging buffers come in power-of-two sizes from this one up.
_MIN_STAGING_BYTES = 4096


class _StagingPool:
    """SharedBuffers reused across operations, by power-of-two size class: a tensor that does
    not live in shared memory is copied into one before its operation and back after (one copy
    each way). A buffer goes back to the pool when its operation completed successfully; after
    a failure it is dropped (the agent may still be reading it)."""

    def __init__(self, client):
        self._client = client
        self._free = {}
        self._lock = threading.Lock()

    def acquire(self, nbytes):
        size = max(_MIN_STAGING_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        buffer = self._client.allocate(size)
        # One uint8 view per buffer; each operation takes a typed slice of it.
        return buffer, torch.frombuffer(buffer, dtype=torch.uint8)

    def release(self, entry):
        with self._lock:
            self._free.setdefault(entry[0].nbytes, []).append(entry)

    def clear(self):
        with self._lock:
            self._free.clear()


class _Waiter:
    """One thread that waits for handles in submission order and completes their futures
    (torch.futures.Future): the DDP hook's asynchrony without a thread per bucket. The wait
    releases the GIL and sleeps (futex / RPC), it does not spin."""

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tributary-waiter", daemon=True)
        self._thread.start()

    def submit(self, handle, future, transform=None):
        self._queue.put((handle, future, transform))

    def stop(self):
        self._queue.put(None)
        self._thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, future, transform = item
            try:
                result = handle.wait()
                if transform is not None:
                    result = transform(result)
            except BaseException as e:  # noqa: B902 -- the future carries any failure
                future.set_exception(e)
            else:
                future.set_result(result)


class _State:
    def __init__(self, client):
        self.client = client
        self.pool = _StagingPool(client)
        self.lock = threading.Lock()
        self.counters = {}
        self.in_flight = set()
        # Buffers of tributary.torch.empty tensors: address -> (weakref to buffer, bytes).
        self.shared = {}
        self.waiter = None
        self.op_timeout = None

    def auto_name(self, kind):
        with self.lock:
            n = self.counters.get(kind, 0)
            self.counters[kind] = n + 1
        return f"{kind}.noname.{n}"

    def claim(self, name, what):
        with self.lock:
            if name in self.in_flight:
                raise TributaryError(
                    f"{what}: an operation named {name!r} is still in flight on this rank; "
                    "names must be unique among operations in flight (synchronize it first)",
                    "ALREADY_EXISTS")
            self.in_flight.add(name)

    def unclaim(self, name):
        with self.lock:
            self.in_flight.discard(name)

    def find_shared(self, tensor):
        """(buffer, byte offset) when `tensor` lives in a buffer of tributary.torch.empty."""
        if not self.shared:
            return None
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        with self.lock:
            for address, (ref, nbytes) in list(self.shared.items()):
                buffer = ref()
                if buffer is None:
                    del self.shared[address]
                elif address <= start and end <= address + nbytes:
                    return buffer, start - address
        return None

    def get_waiter(self):
        with self.lock:
            if self.waiter is None:
                self.waiter = _Waiter()
            return self.waiter


_state = None
_state_lock = threading.Lock()


def _get():
    state = _state
    if state is None:
        raise TributaryError(
            "tributary.torch is not initialised: call tributary.torch.init() first",
            "FAILED_PRECONDITION")
    return state


def init(agent_address=None, job=None, local_rank=None, local_size=None, *, join_timeout=30.0,
         op_timeout=120.0):
    """Joins the job through the local agent. Arguments left as None come from the environment
    tributary-run sets (TRIBUTARY_AGENT_ADDRESS, TRIBUTARY_JOB, TRIBUTARY_LOCAL_RANK,
    TRIBUTARY_LOCAL_SIZE). Timeouts in seconds; op_timeout bounds the waits of the blocking
    calls (keep it above the job's --timeout-ms, whose error says more). Calling it again is a
    no-op."""
    global _state
    with _state_lock:
        if _state is not None:
            return
        client = _tributary.Client(agent_address, job, local_rank, local_size,
                                   join_timeout=join_timeout, op_timeout=op_timeout)
        state = _State(client)
        state.op_timeout = op_timeout
        _state = state


def shutdown():
    """Leaves the job (waits for the DDP waiter thread first). init() may be called again."""
    global _state
    with _state_lock:
        state, _state = _state, None
    if state is None:
        return
    if state.waiter is not None:
        state.waiter.stop()
    state.pool.clear()
    state.client.leave()


def resync():
    """After a tributary.MembershipChanged error: binds this process to the job's new membership
    generation (waiting up to the join timeout while the controller confirms it). Every process's
    iterations start again together, and so do the automatic names of unnamed operations. rank()
    and size() may change (elastic jobs). Returns (rank, size). Then restart the training step
    from a sync point, e.g. broadcast_parameters(model.state_dict(), root_rank=0). Call it with
    no operation in flight."""
    state = _get()
    state.client.resync()
    with state.lock:
        state.counters.clear()
        state.in_flight.clear()
    return state.client.rank, state.client.size


def is_initialized():
    return _state is not None


def rank():
    """Global rank of this process (node rank * local_size + local_rank)."""
    return _get().client.rank


def size():
    """Number of processes in the job."""
    return _get().client.size


def local_rank():
    return _get().client.local_rank


def local_size():
    return _get().client.local_size


def _dtype_name(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise TributaryError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}",
                             "INVALID_ARGUMENT")
    if tensor.device.type != "cpu":
        raise TributaryError(
            f"{what}: the tensor is on {tensor.device}; only CPU tensors are supported from "
            "Python so far (GPU memory goes through the C++ client's RegisterCudaBuffer; no "
            "silent host copy is made here): move it with .cpu()", "UNIMPLEMENTED")
    if tensor.layout != torch.strided:
        raise TributaryError(f"{what}: {tensor.layout} tensors are not supported; pass a dense "
                             "tensor", "INVALID_ARGUMENT")
    name = _DTYPES.get(tensor.dtype)
    if name is None:
        raise TributaryError(
            f"{what}: dtype {tensor.dtype} is not supported; use float32, float64, float16, "
            "bfloat16, int32 or int64", "INVALID_ARGUMENT")
    if not tensor.is_contiguous():
        raise TributaryError(
            f"{what}: the tensor is not contiguous (shape {tuple(tensor.shape)}, strides "
            f"{tensor.stride()}); pass tensor.contiguous()", "INVALID_ARGUMENT")
    if tensor.numel() == 0:
        raise TributaryError(f"{what}: the tensor is empty", "INVALID_ARGUMENT")
    return name


class Handle:
    """An operation in flight. poll() says whether it is done; synchronize(handle) waits and
    returns its result."""

    __slots__ = ("_state", "_core", "_name", "_finish", "_staging", "_result", "_done")

    def __init__(self, state, core, name, finish, staging):
        self._state = state
        self._core = core
        self._name = name
        self._finish = finish
        self._staging = staging
        self._result = None
        self._done = False

    @property
    def name(self):
        return self._name

    @property
    def version(self):
        """pull_params_async / init_params_async, once done: the parameters' version (deltas
        applied on the servers)."""
        return self._core.version

    def poll(self):
        """True when the operation is done (its result is then in place), False while it
        runs; raises its TributaryError if it failed."""
        if self._done:
            return True
        try:
            done = self._core.poll()
        except BaseException:
            self._fail()
            raise
        if done:
            self._complete()
        return done

    def wait(self, timeout=None):
        """Waits (up to `timeout` seconds; None: the op_timeout of init) and returns the
        result. Ctrl-C interrupts the wait (the operation goes on; wait again)."""
        if not self._done:
            try:
                self._core.wait(self._state.op_timeout if timeout is None else timeout)
            except TributaryError as e:
                if e.code != "DEADLINE_EXCEEDED":
                    self._fail()
                    raise
                # The wait's timeout, or the operation's own deadline? Poll says which.
                try:
                    done = self._core.poll()
                except TributaryError:
                    self._fail()
                    raise e from None
                if not done:
                    raise  # Still running: wait again.
            self._complete()
        return self._result

    def _complete(self):
        with torch.no_grad():
            self._result = self._finish()
        self._finish = None
        if self._staging is not None:
            self._state.pool.release(self._staging)
            self._staging = None
        self._state.unclaim(self._name)
        self._done = True

    def _fail(self):
        # The staging buffer is dropped, not pooled: the agent may still use it.
        self._staging = None
        self._finish = None
        self._state.unclaim(self._name)


def synchronize(handle, timeout=None):
    """Waits for `handle` and returns the operation's result (the tensor it was given, for
    push_pull and broadcast)."""
    return handle.wait(timeout)


def poll(handle):
    return handle.poll()


def _submit(what, kind, tensor, name, build):
    """Common path: checks, names, stages `tensor` (unless it lives in shared memory) and
    submits. build(client, buffer, offset, staged_view) returns (core handle, finish) where
    finish() produces the result after completion."""
    state = _get()
    dtype = _dtype_name(tensor, what)
    name = state.auto_name(kind) if name is None else str(name)
    state.claim(name, what)
    try:
        return build(state, dtype, name)
    except BaseException:
        state.unclaim(name)
        raise


def _staged(state, tensor, region_elements, block):
    """A staging buffer with room for `region_elements` of tensor's dtype; the tensor's data is
    copied to element block * numel. Returns (entry, typed view of the region)."""
    nbytes = region_elements * tensor.element_size()
    entry = state.pool.acquire(nbytes)
    view = entry[1][:nbytes].view(tensor.dtype)
    n = tensor.numel()
    with torch.no_grad():
        view[block * n:(block + 1) * n].copy_(tensor.reshape(-1))
    return entry, view


def _in_place(state, tensor, name, start):
    """An in-place operation on `tensor` (push_pull, broadcast): start(buffer, byte offset)
    submits it on the tensor's own shared memory (zero copy) or on a staging buffer the
    tensor is copied into, and back from when it is done. Returns the Handle."""
    shared = state.find_shared(tensor)
    if shared is not None:  # Zero copy: the tensor lives in shared memory.
        return Handle(state, start(*shared), name, lambda: tensor, None)
    entry, view = _staged(state, tensor, tensor.numel(), 0)
    try:
        core = start(entry[0], 0)
    except BaseException:
        state.pool.release(entry)
        raise

    def finish():
        tensor.view(-1).copy_(view)
        return tensor

    return Handle(state, core, name, finish, entry)


def push_pull_async(tensor, average=True, name=None, priority=0):
    """Starts an all-reduce of `tensor` across all processes, in place (BytePS's push_pull):
    sum, or average when `average`. Every process must use the same name (default: one
    numbered per call, so all processes must make their unnamed calls in the same order),
    shape and dtype. Lower priority goes first. Returns a Handle."""
    op = "average" if average else "sum"

    def build(state, dtype, name):
        return _in_place(state, tensor, name, lambda buffer, offset: state.client.all_reduce_async(
            name, buffer, offset, tensor.numel(), dtype, op, priority))

    return _submit("push_pull", "push_pull", tensor, name, build)


def push_pull(tensor, average=True, name=None, priority=0):
    """All-reduce of `tensor` in place (see push_pull_async); returns `tensor`."""
    return synchronize(push_pull_async(tensor, average, name, priority))


def _ps_name(name, what):
    if name is None:
        raise TributaryError(f"{what}: name the parameter tensor (the same name on every rank)",
                             "INVALID_ARGUMENT")
    return str(name)


def init_params_async(tensor, name):
    """Asynchronous jobs (created with --mode async): rank 0 pushes `tensor` as the initial
    parameters `name` held by the summation servers; every other rank waits (the job's
    timeout) until they are there and receives them into `tensor`. Every rank calls it, once
    per plan epoch (again after an UNAVAILABLE error: the servers lost the parameters)."""
    name = _ps_name(name, "init_params")

    def build(state, dtype, name):
        return _in_place(state, tensor, name, lambda buffer, offset: state.client.init_params_async(
            name, buffer, offset, tensor.numel(), dtype))

    return _submit("init_params", "init_params", tensor, name, build)


def init_params(tensor, name):
    """init_params_async, waited for; returns `tensor` (rank 0's values on every rank)."""
    return synchronize(init_params_async(tensor, name))


def push_delta_async(tensor, name, scale=0.0):
    """Asynchronous jobs: the servers apply params += scale * tensor, as each chunk arrives and
    exactly once, without waiting for the other ranks (scale 0: the job's --delta-scale,
    default 1). One push_delta of a name at a time per rank."""
    name = _ps_name(name, "push_delta")

    def build(state, dtype, name):
        return _in_place(state, tensor, name, lambda buffer, offset: state.client.push_delta_async(
            name, buffer, offset, tensor.numel(), dtype, scale))

    return _submit("push_delta", "push_delta", tensor, name, build)


def push_delta(tensor, name, scale=0.0):
    """push_delta_async, waited for."""
    synchronize(push_delta_async(tensor, name, scale))


def pull_params_async(tensor, name):
    """Asynchronous jobs: the current parameters `name` into `tensor`; Handle.version is their
    version once done. Waits while this rank has pushed more than the job's staleness deltas of
    `name` beyond the slowest rank (DEADLINE_EXCEEDED naming it at the job's timeout)."""
    name = _ps_name(name, "pull_params")

    def build(state, dtype, name):
        return _in_place(state, tensor, name, lambda buffer, offset: state.client.pull_params_async(
            name, buffer, offset, tensor.numel(), dtype))

    return _submit("pull_params", "pull_params", tensor, name, build)


def pull_params(tensor, name):
    """pull_params_async, waited for; returns the version (int) of the values now in `tensor`."""
    handle = pull_params_async(tensor, name)
    synchronize(handle)
    return handle.version


def broadcast_async(tensor, root_rank, name=None, priority=0):
    """Starts a broadcast of `tensor` from global rank `root_rank` to every process, in place."""
    def build(state, dtype, name):
        if not 0 <= root_rank < state.client.size:
            raise TributaryError(f"broadcast: root_rank {root_rank} is not a rank of this job "
                                 f"(size {state.client.size})", "INVALID_ARGUMENT")
        return _in_place(state, tensor, name, lambda buffer, offset: state.client.broadcast_async(
            name, buffer, offset, tensor.numel(), dtype, root_rank, priority))

    return _submit("broadcast", "broadcast", tensor, name, build)


def broadcast(tensor, root_rank, name=None, priority=0):
    """Broadcast of `tensor` from `root_rank`, in place; returns `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name, priority))


def allgather_async(tensor, name=None, priority=0):
    """Starts an all-gather: every process gives a tensor of the same shape; the result (a new
    tensor) concatenates them along dimension 0 in rank order (shape [size * d0, ...]; a scalar
    gives [size])."""
    def build(state, dtype, name):
        world, me = state.client.size, state.client.rank
        entry, view = _staged(state, tensor, world * tensor.numel(), me)
        try:
            core = state.client.all_gather_async(name, entry[0], 0, tensor.numel(), dtype,
                                                 priority)
        except BaseException:
            state.pool.release(entry)
            raise
        shape = (world * tensor.shape[0],) + tuple(tensor.shape[1:]) if tensor.dim() else (world,)
        return Handle(state, core, name, lambda: view.clone().view(shape), entry)

    return _submit("allgather", "allgather", tensor, name, build)


def allgather(tensor, name=None, priority=0):
    return synchronize(allgather_async(tensor, name, priority))


def reduce_scatter_async(tensor, average=True, name=None, priority=0):
    """Starts a reduce-scatter: every process gives a tensor of the same shape whose dimension
    0 is a multiple of size(); the result (a new tensor) is this rank's block of dimension 0
    (shape [d0 / size, ...]) summed, or averaged, over the processes."""
    op = "average" if average else "sum"

    def build(state, dtype, name):
        world, me = state.client.size, state.client.rank
        if tensor.dim() == 0 or tensor.shape[0] % world != 0:
            raise TributaryError(
                f"reduce_scatter: dimension 0 of shape {tuple(tensor.shape)} is not a multiple "
                f"of the job's size {world}", "INVALID_ARGUMENT")
        count = tensor.numel() // world
        entry, view = _staged(state, tensor, tensor.numel(), 0)
        try:
            core = state.client.reduce_scatter_async(name, entry[0], 0, count, dtype, op,
                                                     priority)
        except BaseException:
            state.pool.release(entry)
            raise
        shape = (tensor.shape[0] // world,) + tuple(tensor.shape[1:])
        return Handle(state, core, name,
                      lambda: view[me * count:(me + 1) * count].clone().view(shape), entry)

    return _submit("reduce_scatter", "reduce_scatter", tensor, name, build)


def reduce_scatter(tensor, average=True, name=None, priority=0):
    return synchronize(reduce_scatter_async(tensor, average, name, priority))


def barrier():
    """Returns once every process of the job has called barrier()."""
    push_pull(torch.zeros(1, dtype=torch.int32), average=False, name=None)


def empty(*size, dtype=torch.float32):
    """A new tensor (uninitialised contents) backed by shared memory registered with the agent:
    push_pull and broadcast run on it without staging copies. Each call allocates one buffer
    (an agent RPC): allocate such tensors once and reuse them."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    state = _get()
    if dtype not in _DTYPES:
        raise TributaryError(f"empty: dtype {dtype} is not supported; use float32, float64, "
                             "float16, bfloat16, int32 or int64", "INVALID_ARGUMENT")
    numel = 1
    for d in size:
        numel *= int(d)
    element = torch.tensor([], dtype=dtype).element_size()
    buffer = state.client.allocate(max(numel * element, 1))
    tensor = torch.frombuffer(buffer, dtype=dtype, count=numel).view(size)
    with state.lock:
        state.shared[buffer.address] = (weakref.ref(buffer), buffer.nbytes)
    return tensor


def broadcast_object(obj, root_rank=0, name=None):
    """The root's `obj` (pickled) on every process; returns it."""
    state = _get()
    base = state.auto_name("broadcast_object") if name is None else str(name)
    payload = pickle.dumps(obj) if state.client.rank == root_rank else b""
    length = torch.tensor([len(payload)], dtype=torch.int64)
    broadcast(length, root_rank, name=f"{base}.length")
    n = int(length.item())
    words = torch.zeros((n + 7) // 8, dtype=torch.int64)
    if state.client.rank == root_rank:
        words.view(torch.uint8)[:n].copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    broadcast(words, root_rank, name=f"{base}.data")
    return pickle.loads(words.view(torch.uint8)[:n].numpy().tobytes())


def _named_tensors(params):
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = list(params)
        if items and not all(isinstance(i, tuple) and len(i) == 2 for i in items):
            raise TributaryError("broadcast_parameters: expected a state_dict or (name, tensor) "
                                 "pairs (model.named_parameters())", "INVALID_ARGUMENT")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise TributaryError("broadcast_parameters: parameter names are not unique",
                             "INVALID_ARGUMENT")
    return items


def broadcast_parameters(params, root_rank=0):
    """Overwrites every tensor of `params` (a state_dict, or (name, tensor) pairs such as
    model.named_parameters()) with root_rank's, in place."""
    handles = []
    with torch.no_grad():
        for name, tensor in _named_tensors(params):
            target = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
            handles.append(broadcast_async(target, root_rank, name=f"broadcast_parameters.{name}"))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Loads root_rank's optimizer state (optimizer.state_dict(): per-parameter state and
    hyper-parameters) into `optimizer` on every process."""
    state_dict = optimizer.state_dict() if rank() == root_rank else None
    state_dict = broadcast_object(state_dict, root_rank,
                                  name=f"broadcast_optimizer_state.{type(optimizer).__name__}")
    optimizer.load_state_dict(state_dict)

