"""DistributedOptimizer: Horovod's wrapper, with BytePS's priorities.

Each parameter's gradient starts its all-reduce (push_pull, average) from a hook on the
parameter's gradient accumulator, as soon as backward has produced it, so communication
overlaps the rest of backward. synchronize() (called by step() unless skipped) waits for every
gradient and writes it back into .grad.

With priorities (priorities=True; the default with overlap_forward) they follow layer order (the
first parameter of named_parameters, i.e. the first layer, gets priority 0, which goes first),
so the first layers' gradients, needed first by the next forward pass, come back first. That
pays only where the next forward pass can start before every gradient is back, that is with
overlap_forward (below). Without it step() waits for all of them, and by default every gradient
gets the same priority, so each agent sends them in the order backward produced them: the same
order on every rank. By layer order, each agent's order depends on what its own process had
produced when each chunk left (a later, higher-priority gradient jumps ahead of what is queued),
so the ranks push different tensors at the same time and a summation server returns a chunk's
sum only when the slowest rank has pushed it. On the emulated cluster (4 workers, 4 spares,
125 Mbit/s) a ResNet-50 iteration took 7.7-7.9 s by layer order and 7.4-7.7 s in backward order,
in 8 runs of each on an idle machine (bench/results/torch_priorities_125mbit_s36/, ab/ and
first_*/).

With overlap_forward=model (BytePS's cross-iteration overlap, ByteScheduler's "cross barrier"),
step() does not wait: it leaves every parameter's update pending, and a forward pre-hook on each
module of `model` waits for that module's parameters' all-reduces and applies their update just
before the module runs. The next iteration's forward pass then starts as soon as the first
layers' gradients are back (they go first, by priority) and overlaps the rest of the
communication. The updates are the same, in the same arithmetic, as without it. A module whose
pre-hook did not run in the last forward pass although its parameters are used (its parent reads
them, as nn.MultiheadAttention does its out_proj's) or runs after another pre-hook (which may read
them, as weight_norm's does) has its update applied at the start of the model's forward pass.

Zero copy: the gradients live in the agent's shared memory (one buffer per dtype, each .grad a
view of it, allocated once by the constructor; autograd accumulates into an existing .grad in
place and zero_grad() zeroes it in place), so their all-reduces run without staging copies. A
gradient that left it (zero_grad(set_to_none=True), a .grad assigned by the user) is staged: one
copy each way, as any tensor.

One optimizer per parameter and per name: a DistributedOptimizer made over a parameter that a
live one manages, or with a name that a live one uses, replaces it. The old one's hooks are
removed (else each backward pass would start two all-reduces into the same .grad, or two
models' all-reduces would be one tensor's iterations), its all-reduces in flight are waited for
and its pending updates applied; its step() and synchronize() are then FAILED_PRECONDITION,
saying why. A loop that makes a new model and optimizer each round needs nothing more; two
models trained at once (a GAN's generator and discriminator, both with a "0.weight") need their
own names: named_parameters=model.named_parameters(prefix="G"), and prefix="D".
"""

import contextlib
import weakref

import torch

from tributary import TributaryError
from tributary.torch import ops
from tributary.torch.compression import Compression


# The synchronous optimizers of this process that have not been replaced (see the module's
# docstring). Weak: an optimizer that is dropped and collected leaves it.
_live = weakref.WeakSet()


def _remove_hooks(*handle_lists):
    """Removes the hooks of the handles in each list (in place: the lists are emptied)."""
    for handles in handle_lists:
        for handle in handles:
            handle.remove()
        handles.clear()


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 overlap_forward=None, priorities=None):
        super(self.__class__, self).__init__(params)
        if backward_passes_per_step < 1:
            raise TributaryError("DistributedOptimizer: backward_passes_per_step must be >= 1",
                                 "INVALID_ARGUMENT")
        self._compression = compression
        self._passes = backward_passes_per_step
        self._replaced = None  # why, once a newer optimizer replaced this one
        # An error of the optimizer this one replaced, raised by the first step()/synchronize().
        self._inherited_error = None
        self._grad_hooks = []  # the handles of the hooks on the gradient accumulators
        params = [p for group in self.param_groups for p in group["params"]]
        named = _named(params, named_parameters)
        self._name = {id(p): f"DistributedOptimizer.grad.{n}" for n, p in named}
        if priorities is None:
            priorities = overlap_forward is not None
        if not isinstance(priorities, bool):
            raise TributaryError(
                f"DistributedOptimizer: priorities must be True, False or None (automatic), "
                f"not {priorities!r} ({type(priorities).__name__})", "INVALID_ARGUMENT")
        # Lower goes first. By layer order: the first parameter of named_parameters gets 0.
        self._priority = {id(p): i if priorities else 0 for i, (_, p) in enumerate(named)}
        self._params = [p for _, p in named if p.requires_grad and p.numel() > 0]
        for n, p in named if ops.size() > 1 else ():
            if p.requires_grad and p.device.type != "cpu":
                raise TributaryError(
                    f"DistributedOptimizer: parameter {n!r} is on {p.device}; only CPU "
                    "parameters are supported from Python so far (GPU memory goes through the "
                    "C++ client's RegisterCudaBuffer): move the model with .cpu()",
                    "UNIMPLEMENTED")
            if p.requires_grad and p.dtype not in ops._DTYPES:
                raise TributaryError(
                    f"DistributedOptimizer: parameter {n!r} has dtype {p.dtype}, which cannot "
                    "be all-reduced; use float32, float64, float16 or bfloat16",
                    "INVALID_ARGUMENT")
        self._handles = {}  # id(p) -> (p, handle, compression context, compressed tensor)
        self._delay = {id(p): self._passes for p in self._params}
        self._synchronized = False
        self._should_synchronize = True
        self._grad_accs = []
        self._pending = {}  # overlap_forward: id(p) -> _handles' entry, update not applied yet
        self._overlap = overlap_forward is not None
        self._forward_hooks = []
        # The hooks hold the optimizer weakly: once it is collected, they go too (left on the
        # model, its pre-hooks would make a later overlap_forward optimizer see every module as
        # one whose pre-hook runs second). Both lists are only ever changed in place.
        weakref.finalize(self, _remove_hooks, self._grad_hooks, self._forward_hooks)
        # overlap_forward: the modules whose pre-hook ran in the current (_fired_now) and the
        # last (_fired_last) forward pass of the model, and each module's own parameters.
        self._fired_now = set()
        self._fired_last = None
        self._module_params = []  # (module, its pre-hook's handle, its own parameters)
        if self._overlap and not isinstance(overlap_forward, torch.nn.Module):
            raise TributaryError(
                "DistributedOptimizer: overlap_forward must be the model (a torch.nn.Module) "
                "whose forward pass uses the parameters", "INVALID_ARGUMENT")
        self._take_over()
        if self._overlap:
            self._register_forward_hooks(overlap_forward)
        if ops.size() > 1:
            self._share_gradients()
            self._register_hooks()

    def _take_over(self):
        """Replaces the live optimizers that manage one of this one's parameters or use one of
        its names (see the module's docstring)."""
        mine = {id(p) for p in self._params}
        names = {self._name[id(p)] for p in self._params}
        for other in list(_live):
            if any(id(q) in mine for q in other._params):
                why = ("a newer DistributedOptimizer over the same parameters replaced it; use "
                       "the new one")
            else:
                # Names matter only where all-reduces run.
                clash = sorted(names & {other._name[id(q)] for q in other._params}
                               if ops.size() > 1 else ())
                if not clash:
                    continue
                shown = ", ".join(repr(n[len("DistributedOptimizer.grad."):]) for n in clash[:3])
                more = f" and {len(clash) - 3} more" if len(clash) > 3 else ""
                why = (f"a newer DistributedOptimizer over other parameters took its parameter "
                       f"names ({shown}{more}: their all-reduces would be one tensor's); to train "
                       "two models at once give each its own names, e.g. "
                       "named_parameters=model.named_parameters(prefix=\"G\")")
            try:
                other._hand_over(why)
            except TributaryError as e:
                # Its pending updates failed (e.g. MembershipChanged): this optimizer is made
                # all the same, and its first step() raises it, as the old one's would have.
                self._inherited_error = self._inherited_error or e
        _live.add(self)

    def _hand_over(self, why):
        """Replaced by a newer optimizer (`why`): removes this one's hooks, waits for its all-reduces in flight (the new optimizer's next step reduces those
        gradients again: averaging an average changes nothing) and applies its pending updates
        (those of a finished step)."""
        _live.discard(self)
        self._replaced = why
        _remove_hooks(self._grad_hooks, self._forward_hooks)
        self._grad_accs = []
        self._module_params = []
        try:
            self._apply_pending(None)
        finally:
            self._drain()

    def _check_not_replaced(self, call):
        if self._replaced:
            raise TributaryError(f"DistributedOptimizer: {call}() on a replaced optimizer: "
                                 f"{self._replaced}", "FAILED_PRECONDITION")
        if self._inherited_error is not None:
            # As a failed step: nothing left in flight, the error as it came (a
            # MembershipChanged stays one, for the caller's resync).
            e, self._inherited_error = self._inherited_error, None
            self._drain()
            raise e

    def _share_gradients(self):
        """Gives every dense CPU parameter of a supported dtype a .grad that is a view of one
        shared-memory buffer per dtype (existing gradient values kept)."""
        by_dtype = {}
        for p in self._params:
            if (p.device.type == "cpu" and p.layout == torch.strided and
                    p.dtype in ops._DTYPES and p.numel() > 0):
                by_dtype.setdefault(p.dtype, []).append(p)
        align = 16  # elements: every gradient starts 64-byte aligned for 4-byte dtypes
        for dtype, params in by_dtype.items():
            total = sum((p.numel() + align - 1) // align * align for p in params)
            flat = ops.empty(total, dtype=dtype)
            flat.zero_()
            offset = 0
            with torch.no_grad():
                for p in params:
                    view = flat[offset:offset + p.numel()].view(p.shape)
                    if p.grad is not None:
                        view.copy_(p.grad)
                    p.grad = view
                    offset += (p.numel() + align - 1) // align * align

    def _register_hooks(self):
        for p in self._params:
            # The AccumulateGrad node of p: its hook runs once p.grad holds the new gradient.
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            # Before it adds the new gradient into p.grad: refuse it while p.grad is in flight
            # (zero copy: the agent writes the average into it) or its update pending. A pre-hook
            # of the node, not of the tensor: torch.autograd.grad runs no accumulation.
            check = self._make_check(p)
            self._grad_hooks.append(
                grad_acc.register_prehook(lambda _grad_outputs, check=check: check()))
            self._grad_hooks.append(grad_acc.register_hook(self._make_hook(p)))
            self._grad_accs.append(grad_acc)

    def _register_forward_hooks(self, model):
        """overlap_forward: each module's pre-hook applies the pending updates of its own
        parameters just before it runs. The model's pre-hook applies first those of modules
        whose pre-hook did not run in the last forward pass (a parameter its parent uses
        directly, as nn.MultiheadAttention its out_proj's) or runs after another pre-hook (one
        that reads the parameters, as weight_norm's); the model's post-hook those of any
        parameter the forward did not reach, so that none is pending when backward accumulates
        into .grad again."""
        ref = weakref.ref(self)  # as the gradient hooks (_make_check)

        def call(method, *args):
            self = ref()
            if self is not None:
                getattr(self, method)(*args)

        self._start_hook = model.register_forward_pre_hook(
            lambda _module, _inputs: call("_on_forward_start"))
        self._forward_hooks.append(self._start_hook)
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False)]
            if own:
                handle = module.register_forward_pre_hook(
                    lambda module, _inputs, own=own: call("_on_module", module, own))
                self._forward_hooks.append(handle)
                self._module_params.append((module, handle, own))
        self._forward_hooks.append(model.register_forward_hook(
            lambda _module, _inputs, _output: call("_on_forward_end")))

    def _on_module(self, module, own):
        self._fired_now.add(id(module))
        self._apply_pending(own)

    def _early_params(self):
        """The parameters whose update the model's pre-hook applies (see
        _register_forward_hooks)."""
        early = []
        for module, handle, own in self._module_params:
            # The model's own pre-hook runs before its parameters' (it registered first).
            hooks = [k for k in module._forward_pre_hooks if k != self._start_hook.id]
            # No forward pass of the model seen since the optimizer was made: each is early.
            if (not hooks or hooks[0] != handle.id or self._fired_last is None or
                    id(module) not in self._fired_last):
                early.extend(own)
        return early

    def _on_forward_start(self):
        self._fired_now = set()
        if self._pending:
            self._apply_pending(self._early_params())

    def _on_forward_end(self):
        self._fired_last = self._fired_now
        self._apply_pending(None)

    # The hooks hold the optimizer weakly: the gradient accumulators that hold them are not
    # seen by Python's cycle collector, so a strong reference kept every optimizer, and its
    # model, alive for the life of the process.
    def _make_check(self, p):
        ref = weakref.ref(self)

        def check():
            self = ref()
            if self is None:
                return None
            key = id(p)
            if key in self._pending:
                raise TributaryError(
                    "DistributedOptimizer: a gradient was computed while the previous step's "
                    "update of its parameter was still pending; with overlap_forward every "
                    "forward pass must run through the model given to it (or call "
                    "synchronize() after step())", "FAILED_PRECONDITION")
            if key in self._handles:
                raise TributaryError(
                    "DistributedOptimizer: a gradient was computed more than "
                    "backward_passes_per_step times before step() / synchronize(); raise "
                    "backward_passes_per_step or call step() after each backward",
                    "FAILED_PRECONDITION")
            return None

        return check

    def _make_hook(self, p):
        ref = weakref.ref(self)

        def hook(*unused):
            self = ref()
            if self is None:
                return
            key = id(p)
            # A gradient computed since the last synchronize(): step() must wait for it.
            self._synchronized = False
            self._delay[key] -= 1
            if self._delay[key] == 0:
                self._submit_or_drain(p)

        return hook

    def _submit(self, p):
        if not p.grad.is_contiguous():  # e.g. a channels_last parameter's own gradient
            p.grad = p.grad.contiguous()
        compressed, ctx = self._compression.compress(p.grad)
        handle = ops.push_pull_async(compressed, average=True, name=self._name[id(p)],
                                     priority=self._priority[id(p)])
        self._handles[id(p)] = (p, handle, ctx, compressed)

    def _submit_or_drain(self, p):
        """_submit; when it fails (e.g. MembershipChanged), every all-reduce in flight is waited
        for (their errors dropped) and forgotten first, so that none is left in flight for
        resync() and the next iteration, and the error is raised."""
        try:
            self._submit(p)
        except BaseException:
            self._drain()
            raise

    def _drain(self):
        """Waits for every all-reduce in flight or pending, drops their results and errors,
        and starts every parameter's accumulation again."""
        entries = list(self._handles.values()) + list(self._pending.values())
        self._handles.clear()
        self._pending.clear()
        for _, handle, _, _ in entries:
            with contextlib.suppress(TributaryError):
                ops.synchronize(handle)
        for p in self._params:
            self._delay[id(p)] = self._passes

    def _submit_unfired(self):
        """Gradients whose hook did not fire (parameters unused in this pass) are reduced now,
        as zeros when they have none."""
        for p in self._params:
            if id(p) not in self._handles:
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                self._submit_or_drain(p)

    def _wait(self, entries):
        """Waits for every entry's all-reduce, even after one failed (none stays in flight;
        after a membership change the rest fail at once too), writes the averages into .grad
        and raises the first error."""
        error = None
        for p, handle, ctx, compressed in entries:
            try:
                result = ops.synchronize(handle)
            except TributaryError as e:
                error = error or e
                continue
            if error is None and (ctx is not None or result is not p.grad):
                with torch.no_grad():
                    p.grad.copy_(self._compression.decompress(result, ctx))
        if error is not None:
            raise error

    def _apply_pending(self, params):
        """overlap_forward: waits for the all-reduces of `params` (None: every parameter) whose
        update is pending and applies it: the wrapped optimizer's step over those parameters
        alone, then their gradients zeroed in place for the next backward pass. A failed
        all-reduce drops every pending update and raises."""
        if not self._pending:
            return
        keys = list(self._pending) if params is None else [id(p) for p in params
                                                           if id(p) in self._pending]
        if not keys:
            return
        entries = [self._pending.pop(k) for k in keys]
        try:
            self._wait(entries)
        except TributaryError:
            rest = list(self._pending.values())
            self._pending.clear()
            with contextlib.suppress(TributaryError):
                self._wait(rest)
            for p in self._params:
                self._delay[id(p)] = self._passes
            raise
        self._step_only([p for p, _, _, _ in entries])
        with torch.no_grad():
            for p, _, _, _ in entries:
                p.grad.zero_()
                self._delay[id(p)] = self._passes

    @contextlib.contextmanager
    def _only(self, keep):
        """Within it, the parameter groups hold only the parameters for which keep(p) holds
        (the wrapped optimizer's state per parameter is untouched)."""
        saved = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p for p in group["params"] if keep(p)]
            yield
        finally:
            for group, kept in zip(self.param_groups, saved):
                group["params"] = kept

    def _step_only(self, params):
        """The wrapped optimizer's step over `params` alone."""
        wanted = {id(p) for p in params}
        with self._only(lambda p: id(p) in wanted):
            super(self.__class__, self).step()

    def synchronize(self):
        """Waits for every gradient's all-reduce and writes the averages into .grad; gradients
        whose hook did not fire (parameters unused in this pass) are reduced now, as zeros
        when they have none. With overlap_forward it first applies every update still pending
        from the last step() (call it before reading the parameters outside a forward pass:
        checkpoints, optimizer state); then no backward pass has run since that step(), so
        there is nothing more to reduce (every rank is in the same place)."""
        self._check_not_replaced("synchronize")
        after_overlapped_step = bool(self._pending)
        self._apply_pending(None)
        if after_overlapped_step:
            # Until session 36 this went on to reduce every gradient again, as zeros: one more
            # all-reduce of the whole model for nothing. The next backward pass's hooks clear
            # _synchronized again, so its step() waits for its gradients (until session 37 a
            # synchronize() between step() and the next backward left it set, and that step()
            # updated from gradients still in flight).
            self._synchronized = True
            return
        if ops.size() > 1:
            self._submit_unfired()
            try:
                self._wait(list(self._handles.values()))
            finally:
                self._handles.clear()
                for p in self._params:
                    self._delay[id(p)] = self._passes
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, step() does not call synchronize() (call it yourself before, e.g. to
        clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        self._check_not_replaced("step")
        if (self._overlap and ops.size() > 1 and self._should_synchronize and
                not self._synchronized):
            if closure is not None:
                raise TributaryError(
                    "DistributedOptimizer: step(closure) with overlap_forward: the update is "
                    "applied during the next forward pass, after the closure would run",
                    "INVALID_ARGUMENT")
            # Left pending: the next forward pass applies each parameter's update (above).
            self._apply_pending(None)  # a step() without a forward pass since the last one
            self._submit_unfired()
            self._pending = dict(self._handles)
            self._handles.clear()
            return None
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=False):
        if self._handles:
            raise TributaryError(
                "DistributedOptimizer: zero_grad() while gradient all-reduces are in flight; "
                "call step() or synchronize() first", "FAILED_PRECONDITION")
        if not self._pending:
            return super(self.__class__, self).zero_grad(set_to_none=set_to_none)
        # overlap_forward: a pending parameter's .grad is zeroed once its update is applied.
        with self._only(lambda p: id(p) not in self._pending):
            return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def _named(params, named_parameters):
    """(name, parameter) pairs for the optimizer's parameters, checked (see DistributedOptimizer)."""
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    if not all(isinstance(n, tuple) and len(n) == 2 for n in named):
        raise TributaryError(
            "DistributedOptimizer: named_parameters must be (name, parameter) pairs, "
            "e.g. model.named_parameters()", "INVALID_ARGUMENT")
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TributaryError(f"DistributedOptimizer: parameter names are not unique: "
                             f"{duplicates}", "INVALID_ARGUMENT")
    known = {id(p) for _, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in known]
    if unnamed:
        raise TributaryError(
            f"DistributedOptimizer: {len(unnamed)} parameters of the optimizer are not "
            "in named_parameters; pass the model's named_parameters()", "INVALID_ARGUMENT")
    in_optimizer = {id(p) for p in params}
    return [(n, p) for n, p in named if id(p) in in_optimizer]


class _AsyncDistributedOptimizer(torch.optim.Optimizer):
    """Asynchronous parameter-server training (a job created with --mode async): the summation
    servers hold the parameters. The constructor initialises them from rank 0 (every rank
    starts from rank 0's values). Each step() runs the wrapped optimizer locally on the local
    gradients, pushes the change of every parameter (delta = new - old: any optimizer, its
    state kept locally, as BytePS's asynchronous mode) and pulls the current parameters into
    the model; no rank waits for another, except a pull held by the job's staleness bound."""

    def __init__(self, params, named_parameters, staleness):
        super(self.__class__, self).__init__(params)
        import os
        job_staleness = os.environ.get("TRIBUTARY_STALENESS")
        if (staleness is not None and job_staleness is not None and
                int(job_staleness) != staleness):
            raise TributaryError(
                f"DistributedOptimizer: staleness={staleness}, but the job was created with "
                f"staleness {job_staleness} (the servers enforce the job's bound: create the job "
                "with the one you want, e.g. tributary-run --mode async --staleness S)",
                "INVALID_ARGUMENT")
        params = [p for group in self.param_groups for p in group["params"]]
        named = _named(params, named_parameters)
        self._params = [(f"DistributedOptimizer.param.{n}", p) for n, p in named
                        if p.requires_grad]
        self.versions = {}  # parameter name -> version of the values last pulled
        self.reinitialisations = 0
        self._init_params()

    def _init_params(self):
        with torch.no_grad():
            for name, p in self._params:
                ops.init_params(p.data, name)
                self.versions[name] = 0

    def _run_all(self, starts):
        """Starts each (name, start) until one fails to start, then waits for every one started,
        even after one failed (none stays in flight, so the names are free for _init_params and
        the next step), records the pulls' versions (name not None) and raises the first
        error."""
        error = None
        started = []
        for name, start in starts:
            try:
                started.append((name, start()))
            except TributaryError as e:
                error = e
                break
        for name, h in started:
            try:
                ops.synchronize(h)
            except TributaryError as e:
                error = error or e
                continue
            if name is not None:
                self.versions[name] = h.version
        if error is not None:
            raise error

    def synchronize(self):
        """Nothing to wait for: step() pushes and pulls."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    def step(self, closure=None):
        with torch.no_grad():
            before = [p.detach().clone() for _, p in self._params]
        loss = super(self.__class__, self).step(closure)
        try:
            with torch.no_grad():
                deltas = [p.detach() - old for (_, p), old in zip(self._params, before)]
                self._run_all([(None, lambda d=d, name=name: ops.push_delta_async(d, name))
                               for (name, _), d in zip(self._params, deltas)])
                self._run_all([(name, lambda p=p, name=name: ops.pull_params_async(p.data, name))
                               for name, p in self._params])
        except TributaryError as e:
            if e.code != "UNAVAILABLE":
                raise
            # The plan changed: the servers lost the parameters with their epoch. Every rank
            # gets the same error and initialises them again from rank 0's current values;
            # this step's deltas are lost.
            self.reinitialisations += 1
            self._init_params()
        return loss


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, mode="sync", staleness=None,
                         overlap_forward=None, priorities=None):
    """Wraps `optimizer` (its class, parameter groups and hyper-parameters; not its state --
    use broadcast_optimizer_state) so that gradients are averaged over every process before
    each step. `named_parameters` (model.named_parameters()) gives the all-reduces stable names,
    the same on every rank; without it parameters are numbered in the optimizer's order.
    `compression`: Compression.none or Compression.fp16. With backward_passes_per_step = k,
    gradients accumulate locally over k backward passes before their all-reduce.

    mode="async" (a job created with --mode async): asynchronous parameter-server training
    instead (see _AsyncDistributedOptimizer): the constructor initialises the servers'
    parameters from rank 0; step() applies the wrapped optimizer locally, pushes each
    parameter's change and pulls the current parameters. `staleness` is the job's SSP bound
    (tributary-run --staleness / create-job --staleness, which the servers enforce); when
    given, it must match the job's. compression, backward_passes_per_step,
    overlap_forward and priorities are sync only.

    overlap_forward=model (sync only): step() returns without waiting, and each parameter's
    update is applied just before its module runs in the next forward pass of `model` (see the
    module's docstring); synchronize() applies whatever is still pending. Every forward pass
    must go through `model`.

    priorities (sync only): True sends the first layers' gradients first (priority by layer
    order, as BytePS), False sends every gradient in the order backward produces it; None (the
    default) is True with overlap_forward and False without (see the module's docstring)."""
    if mode not in ("sync", "async"):
        raise TributaryError(f"DistributedOptimizer: mode {mode!r} is neither 'sync' nor 'async'",
                             "INVALID_ARGUMENT")
    if mode == "async":
        if (compression is not Compression.none or backward_passes_per_step != 1 or
                overlap_forward is not None or priorities is not None):
            raise TributaryError("DistributedOptimizer: compression, backward_passes_per_step, "
                                 "overlap_forward and priorities apply to mode='sync' only",
                                 "INVALID_ARGUMENT")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_AsyncDistributedOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, staleness)
    if staleness is not None:
        raise TributaryError("DistributedOptimizer: staleness applies to mode='async' only",
                             "INVALID_ARGUMENT")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               overlap_forward, priorities)
