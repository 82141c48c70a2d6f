"""Exact equivalence of distributed training: an MLP and a small CNN trained for 20 SGD steps
(momentum 0.9) on deterministic synthetic data, each of 4 ranks on its quarter of every batch,
(a) with tributary.torch.DistributedOptimizer (also with overlap_forward, each update applied
just before the next forward pass reaches its module) and (b) with DistributedDataParallel whose
gradients travel through tributary.torch.ddp_comm_hook, end with the parameters of one process
trained on the whole batches, and with identical parameters on every rank. Compression.fp16
ends with a loss close to fp32's.

Run by ctest through the launcher:
  tributary-run --np 4 --procs-per-node 2 --spares 2 -- python3 train_test.py
"""

import gc
import os
import unittest
import weakref
from unittest import mock

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import tributary.torch as trt
from tributary.torch import ops as trt_ops
from rendezvous import rendezvous

STEPS = 20
BATCH = 32
CLASSES = 4
# Per element: |distributed - single| <= RTOL * |single| + ATOL. The sums differ from the
# single process's only in rounding order (fp32), so both are far above what is observed.
RTOL = 1e-5
ATOL = 1e-7
# fp16 gradients (3 significant digits) move the final loss by far less than this, relative
# (observed: about 3e-6 on this model and data).
FP16_LOSS_RTOL = 1e-3


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, CLASSES))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 8, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4,
                                                                                    CLASSES))


class Attention(torch.nn.Module):
    """nn.MultiheadAttention uses its out_proj's parameters without running out_proj's forward,
    and weight_norm's pre-hook builds the last layer's weight from weight_g and weight_v: with
    overlap_forward, neither may be updated after the forward pass has used it."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, 32)
        self.attention = torch.nn.MultiheadAttention(8, 2)
        self.out = torch.nn.utils.weight_norm(torch.nn.Linear(8, CLASSES))

    def forward(self, x):
        h = torch.tanh(self.embed(x)).view(-1, 4, 8).transpose(0, 1)  # (sequence 4, batch, 8)
        h, _ = self.attention(h, h, h, need_weights=False)
        return self.out(h.mean(0))


def data(input_shape, seed=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((STEPS, BATCH) + input_shape, generator=g)
    y = torch.randint(0, CLASSES, (STEPS, BATCH), generator=g)
    return x, y


def make(model_fn, seed=1):
    torch.manual_seed(seed)
    return model_fn()


def train(model, optimizer, x, y, part=None):
    """SGD over the batches; `part` = (rank, size) trains on that quarter of each batch.
    Returns the last batch's loss on the whole batch after training."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(STEPS):
        xs, ys = x[step], y[step]
        if part is not None:
            r, n = part
            share = BATCH // n
            xs, ys = xs[r * share:(r + 1) * share], ys[r * share:(r + 1) * share]
        optimizer.zero_grad()
        loss_fn(model(xs), ys).backward()
        optimizer.step()
    with torch.no_grad():
        return loss_fn(model(x[-1]), y[-1]).item()


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(model_fn, x, y):
    model = make(model_fn)
    loss = train(model, sgd(model.parameters()), x, y)
    return model, loss


class ExactTrainingTest(unittest.TestCase):
    def assertMatchesReference(self, model, ref):
        label = self.id().rsplit(".", 1)[-1]
        overall = 0.0
        for (name, a), b in zip(model.named_parameters(), ref.parameters()):
            a, b = a.detach(), b.detach()
            bound = RTOL * b.abs() + ATOL
            worst = ((a - b).abs() / bound).max().item()
            overall = max(overall, worst)
            self.assertLessEqual(worst, 1.0, f"{name}: off by {worst:.2f} x the bound "
                                 f"(max abs diff {(a - b).abs().max().item():.3g})")
        if trt.rank() == 0:
            print(f"{label}: largest |distributed - single| / (RTOL |single| + ATOL) = "
                  f"{overall:.3f}", flush=True)
        # Identical on every rank: rank 0's parameters, gathered, equal everyone's bit for bit.
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = trt.allgather(flat.reshape(1, -1), name=f"check.{label}")
        for r in range(trt.size()):
            self.assertTrue(torch.equal(everyone[r], flat), f"rank {r} differs")

    def _distributed_optimizer(self, model_fn, input_shape, compression=trt.Compression.none,
                               priorities=None):
        x, y = data(input_shape)
        ref, ref_loss = reference(model_fn, x, y)
        torch.manual_seed(100 + trt.rank())  # different initial weights on every rank...
        model = model_fn()
        trt.broadcast_parameters(model.state_dict(), root_rank=0)  # ...until the broadcast
        torch.manual_seed(1)
        initial = model_fn()
        root = trt.broadcast_object([p.detach() for p in model.parameters()], root_rank=0)
        for p, q in zip(model.parameters(), root):
            self.assertTrue(torch.equal(p, q))
        model.load_state_dict(initial.state_dict())  # the reference's initial weights
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             compression=compression, priorities=priorities)
        loss = train(model, optimizer, x, y, part=(trt.rank(), trt.size()))
        return model, ref, loss, ref_loss

    def test_mlp_distributed_optimizer(self):
        model, ref, _, _ = self._distributed_optimizer(mlp, (16,))
        self.assertMatchesReference(model, ref)

    def test_cnn_distributed_optimizer(self):
        model, ref, _, _ = self._distributed_optimizer(cnn, (1, 8, 8))
        self.assertMatchesReference(model, ref)

    def test_cnn_distributed_optimizer_with_layer_priorities(self):
        model, ref, _, _ = self._distributed_optimizer(cnn, (1, 8, 8), priorities=True)
        self.assertMatchesReference(model, ref)

    def _priorities_sent(self, overlap=False, **kwargs):
        """{name: priority} of the all-reduces one training step submits, and {name: layer
        position} (named_parameters' order)."""
        model = make(cnn)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             overlap_forward=model if overlap else None, **kwargs)
        x, y = data((1, 8, 8))
        sent = {}
        real = trt_ops.push_pull_async

        def spy(*args, **kw):
            sent[kw["name"]] = kw["priority"]
            return real(*args, **kw)

        with mock.patch.object(trt_ops, "push_pull_async", spy):
            optimizer.zero_grad()
            torch.nn.CrossEntropyLoss()(model(x[0]), y[0]).backward()
            optimizer.step()
            if overlap:
                optimizer.synchronize()  # applies the pending updates, sends nothing
        by_layer = {f"DistributedOptimizer.grad.{n}": i
                    for i, (n, _) in enumerate(model.named_parameters())}
        self.assertEqual(sorted(sent), sorted(by_layer))
        return sent, by_layer

    def test_priorities_by_layer_only_when_the_forward_pass_overlaps_or_asked(self):
        # Without overlap_forward step() waits for every gradient: one priority, so every agent
        # sends them in backward order, the same on every rank.
        for kwargs in ({}, {"priorities": False}, {"overlap": True, "priorities": False}):
            sent, _ = self._priorities_sent(**kwargs)
            self.assertEqual(set(sent.values()), {0}, kwargs)
        # By layer order (the first layer first) with overlap_forward, and when asked.
        for kwargs in ({"overlap": True}, {"priorities": True}):
            sent, by_layer = self._priorities_sent(**kwargs)
            self.assertEqual(sent, by_layer, kwargs)

    def test_priorities_must_be_a_bool_or_none_and_are_sync_only(self):
        model = make(mlp)
        for bad in ("layers", 1, 0):
            with self.assertRaises(trt.TributaryError) as raised:
                trt.DistributedOptimizer(sgd(model.parameters()), priorities=bad)
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
            self.assertIn("priorities", str(raised.exception))
        for value in (True, False):
            with self.assertRaises(trt.TributaryError) as raised:
                trt.DistributedOptimizer(sgd(model.parameters()), priorities=value, mode="async")
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")

    def test_distributed_optimizer_gradients_are_zero_copy(self):
        # The gradients live in shared memory: a whole training run stages nothing, and is
        # still exact. After zero_grad(set_to_none=True) the gradients are new tensors: they
        # are staged, and the result is the same.
        from tributary.torch import ops
        x, y = data((16,))
        ref, _ = reference(mlp, x, y)
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters())
        state = ops._get()
        for name, p in model.named_parameters():
            self.assertIsNotNone(state.find_shared(p.grad), f"{name}.grad is not shared")
        staged = []
        acquire = state.pool.acquire
        state.pool.acquire = lambda nbytes: staged.append(nbytes) or acquire(nbytes)
        try:
            train(model, optimizer, x, y, part=(trt.rank(), trt.size()))
        finally:
            state.pool.acquire = acquire
        self.assertEqual(staged, [], "gradients were staged")
        self.assertMatchesReference(model, ref)
        model2 = make(mlp)
        optimizer2 = trt.DistributedOptimizer(sgd(model2.parameters()),
                                              named_parameters=[(f"again.{n}", p) for n, p in
                                                                model2.named_parameters()])
        for p in model2.parameters():
            p.grad = None  # out of shared memory: staged from here on
        train(model2, optimizer2, x, y, part=(trt.rank(), trt.size()))
        self.assertMatchesReference(model2, ref)

    def test_mlp_fp16_compression_loss_close_to_fp32(self):
        _, _, loss, ref_loss = self._distributed_optimizer(mlp, (16,), trt.Compression.fp16)
        if trt.rank() == 0:
            print(f"fp16 loss {loss:.6f}, fp32 single-process loss {ref_loss:.6f}", flush=True)
        self.assertLessEqual(abs(loss - ref_loss), FP16_LOSS_RTOL * ref_loss,
                             f"fp16 loss {loss} vs fp32 {ref_loss}")

    def test_mlp_gradient_accumulation_and_skip_synchronize(self):
        # backward_passes_per_step=2: each rank runs two backward passes, on the two halves of
        # its quarter (loss halved, so the accumulated gradient is the quarter's mean); every
        # other step synchronizes by hand and steps inside skip_synchronize().
        x, y = data((16,))
        ref, _ = reference(mlp, x, y)
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             backward_passes_per_step=2)
        loss_fn = torch.nn.CrossEntropyLoss()
        share = BATCH // trt.size()
        for step in range(STEPS):
            lo = trt.rank() * share
            optimizer.zero_grad()
            for half in (0, 1):
                a, b = lo + half * share // 2, lo + (half + 1) * share // 2
                (loss_fn(model(x[step][a:b]), y[step][a:b]) / 2).backward()
            if step % 2:
                optimizer.synchronize()
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        self.assertMatchesReference(model, ref)

    def _overlap(self, model_fn, input_shape):
        x, y = data(input_shape)
        ref, ref_loss = reference(model_fn, x, y)
        model = make(model_fn)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             overlap_forward=model)
        # train() ends with a forward pass on the last batch, which applies the last updates.
        loss = train(model, optimizer, x, y, part=(trt.rank(), trt.size()))
        self.assertAlmostEqual(loss, ref_loss, delta=10 * RTOL * abs(ref_loss))
        return model, ref

    def test_mlp_overlap_forward(self):
        # Each update applied just before its module's next forward: the same training.
        self.assertMatchesReference(*self._overlap(mlp, (16,)))

    def test_cnn_overlap_forward(self):
        self.assertMatchesReference(*self._overlap(cnn, (1, 8, 8)))

    def test_overlap_forward_with_attention_and_weight_norm(self):
        # Until session 37 out_proj's update came after the forward pass had used it (backward
        # then failed: "modified by an inplace operation"), and weight_norm's pre-hook built the
        # weight from the previous step's weight_g and weight_v.
        self.assertMatchesReference(*self._overlap(Attention, (16,)))

    def test_synchronize_between_step_and_the_next_backward(self):
        # A checkpoint's synchronize() after each step(): the next step() still waits for its
        # own gradients (until session 37 it updated from gradients still in flight).
        for overlap in (False, True):
            with self.subTest(overlap=overlap):
                x, y = data((16,))
                ref, _ = reference(mlp, x, y)
                model = make(mlp)
                optimizer = trt.DistributedOptimizer(
                    sgd(model.parameters()), named_parameters=model.named_parameters(),
                    overlap_forward=model if overlap else None)
                loss_fn = torch.nn.CrossEntropyLoss()
                share = BATCH // trt.size()
                for step in range(STEPS):
                    xs = x[step][trt.rank() * share:(trt.rank() + 1) * share]
                    ys = y[step][trt.rank() * share:(trt.rank() + 1) * share]
                    optimizer.zero_grad()
                    loss_fn(model(xs), ys).backward()
                    optimizer.step()
                    optimizer.synchronize()
                self.assertMatchesReference(model, ref)

    def test_a_gradient_refused_while_in_flight_leaves_the_all_reduce_intact(self):
        # A second backward pass before step(): refused before autograd adds it into .grad,
        # whose all-reduce is in flight (zero copy), so synchronize() still gives the average of
        # the first pass (until session 37 the check ran after the accumulation).
        x, y = data((16,))
        ref = make(mlp)
        loss_fn = torch.nn.CrossEntropyLoss()
        loss_fn(ref(x[0]), y[0]).backward()
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters())
        share = BATCH // trt.size()
        xs = x[0][trt.rank() * share:(trt.rank() + 1) * share]
        ys = y[0][trt.rank() * share:(trt.rank() + 1) * share]
        loss_fn(model(xs), ys).backward()
        with self.assertRaises(trt.TributaryError) as raised:
            loss_fn(model(xs), ys).backward()
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        optimizer.synchronize()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            bound = RTOL * q.grad.abs() + ATOL
            self.assertLessEqual(((p.grad - q.grad).abs() / bound).max().item(), 1.0, name)
        optimizer.zero_grad()

    def test_autograd_grad_while_gradients_are_in_flight(self):
        # torch.autograd.grad accumulates nothing into .grad (SAM, gradient norms, meta-learning
        # call it between backward() and step()): it is no second backward pass, and the check
        # sits on the accumulation node, not on the tensor (whose hooks torch 2 runs for it).
        x, y = data((16,))
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters())
        loss_fn = torch.nn.CrossEntropyLoss()
        optimizer.zero_grad()
        loss_fn(model(x[0]), y[0]).backward()
        grads = torch.autograd.grad(loss_fn(model(x[1]), y[1]), list(model.parameters()))
        self.assertEqual(len(grads), len(list(model.parameters())))
        optimizer.step()

    def test_a_failed_submission_leaves_nothing_in_flight(self):
        # A submission refused in the middle of backward (here: the third gradient's, on every
        # rank): the gradients already submitted are waited for and forgotten, so zero_grad(),
        # resync() and the next iteration find nothing in flight.
        x, y = data((16,))
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters())
        loss_fn = torch.nn.CrossEntropyLoss()
        real = trt_ops.push_pull_async
        calls = []

        def refused(*args, **kwargs):
            calls.append(kwargs.get("name"))
            if len(calls) == 3:
                raise trt.TributaryError("refused (test)", "UNAVAILABLE")
            return real(*args, **kwargs)

        optimizer.zero_grad()
        with mock.patch.object(trt_ops, "push_pull_async", side_effect=refused):
            with self.assertRaises(trt.TributaryError) as raised:
                loss_fn(model(x[0]), y[0]).backward()
        self.assertEqual(raised.exception.code, "UNAVAILABLE")
        self.assertEqual(trt_ops._get().in_flight, set())
        optimizer.zero_grad()  # no FAILED_PRECONDITION: nothing in flight
        loss_fn(model(x[1]), y[1]).backward()
        optimizer.step()

    def test_two_models_need_their_own_names(self):
        # A GAN's generator and discriminator: the same layer names. Under one name, their
        # all-reduces would be one tensor's iterations: the second optimizer replaces the first,
        # whose step() then says how to give each model its own names. With a prefix each, one
        # backward pass through both trains each exactly.
        x, y = data((16,))
        ref, _ = reference(mlp, x, y)
        g, d = make(mlp), make(mlp)
        g_opt = trt.DistributedOptimizer(sgd(g.parameters()), named_parameters=g.named_parameters())
        trt.DistributedOptimizer(sgd(d.parameters()), named_parameters=d.named_parameters())
        with self.assertRaises(trt.TributaryError) as raised:
            g_opt.step()
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn("took its parameter names ('0.bias', '0.weight', '2.bias' and 3 more",
                      str(raised.exception))
        self.assertIn("prefix=", str(raised.exception))
        g_opt = trt.DistributedOptimizer(sgd(g.parameters()),
                                         named_parameters=g.named_parameters(prefix="G"))
        d_opt = trt.DistributedOptimizer(sgd(d.parameters()),
                                         named_parameters=d.named_parameters(prefix="D"))
        loss_fn = torch.nn.CrossEntropyLoss()
        share = BATCH // trt.size()
        for step in range(STEPS):
            xs = x[step][trt.rank() * share:(trt.rank() + 1) * share]
            ys = y[step][trt.rank() * share:(trt.rank() + 1) * share]
            g_opt.zero_grad()
            d_opt.zero_grad()
            (loss_fn(g(xs), ys) + loss_fn(d(xs), ys)).backward()  # both in flight at once
            g_opt.step()
            d_opt.step()
        self.assertMatchesReference(g, ref)
        self.assertMatchesReference(d, ref)

    def test_a_new_optimizer_over_the_same_parameters_replaces_the_old_one(self):
        # Made again over the same model (a new learning rate, a checkpoint loaded): the old
        # optimizer's hooks go, else each backward pass would start two all-reduces per
        # gradient. Here the old one has a backward pass in flight when it is replaced.
        x, y = data((16,))
        ref, _ = reference(mlp, x, y)
        model = make(mlp)
        old = trt.DistributedOptimizer(sgd(model.parameters()),
                                       named_parameters=model.named_parameters())
        loss_fn = torch.nn.CrossEntropyLoss()
        share = BATCH // trt.size()
        part = slice(trt.rank() * share, (trt.rank() + 1) * share)
        old.zero_grad()
        loss_fn(model(x[0][part]), y[0][part]).backward()
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters())
        real = trt_ops.push_pull_async
        names = []

        def counted(*args, **kwargs):
            names.append(kwargs.get("name"))
            return real(*args, **kwargs)

        with mock.patch.object(trt_ops, "push_pull_async", side_effect=counted):
            optimizer.step()  # reduces step 0's gradients again (the old ones were dropped)
            for step in range(1, STEPS):
                optimizer.zero_grad()
                loss_fn(model(x[step][part]), y[step][part]).backward()
                optimizer.step()
        params = len(list(model.parameters()))
        self.assertEqual(len(names), STEPS * params)  # one all-reduce per gradient and step
        self.assertEqual(len(set(names)), params)
        self.assertMatchesReference(model, ref)
        for call in (old.step, old.synchronize):
            with self.assertRaises(trt.TributaryError) as raised:
                call()
            self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
            self.assertIn("over the same parameters replaced it", str(raised.exception))

    def test_a_replaced_optimizers_failure_reaches_the_new_ones_first_step(self):
        # Applying the old optimizer's pending updates fails (here by hand; a membership change
        # would): the new optimizer is made all the same and its first step() raises that error,
        # with nothing left in flight; the next step works.
        x, y = data((16,))
        model = make(mlp)
        old = trt.DistributedOptimizer(sgd(model.parameters()),
                                       named_parameters=model.named_parameters())
        lost = trt.MembershipChanged("membership changed (test)", "ABORTED")
        with mock.patch.object(old, "_apply_pending", side_effect=lost):
            optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                                 named_parameters=model.named_parameters())
        loss_fn = torch.nn.CrossEntropyLoss()
        optimizer.zero_grad()
        loss_fn(model(x[0]), y[0]).backward()
        with self.assertRaises(trt.MembershipChanged):
            optimizer.step()
        self.assertEqual(trt_ops._get().in_flight, set())
        optimizer.zero_grad()
        loss_fn(model(x[1]), y[1]).backward()
        optimizer.step()

    def test_a_dropped_optimizer_takes_its_hooks_along(self):
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             overlap_forward=model)
        self.assertTrue(all(len(m._forward_pre_hooks) == 1 for m in model if
                            list(m.parameters(recurse=False))))
        ref = weakref.ref(optimizer)
        del optimizer
        gc.collect()
        self.assertIsNone(ref())
        self.assertEqual(sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                             for m in model.modules()), 0)

    def test_parameters_checked_when_the_optimizer_is_made(self):
        empty = torch.nn.Parameter(torch.empty(0))  # nothing to reduce: left out
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(list(model.parameters()) + [empty]),
                                             named_parameters=list(model.named_parameters()) +
                                             [("empty", empty)])
        x, y = data((16,))
        optimizer.zero_grad()
        torch.nn.CrossEntropyLoss()(model(x[0]), y[0]).backward()
        optimizer.step()
        for bad, code in ((torch.empty(2, device="meta"), "UNIMPLEMENTED"),
                          (torch.zeros(2, dtype=torch.complex64), "INVALID_ARGUMENT")):
            p = torch.nn.Parameter(bad)
            with self.assertRaises(trt.TributaryError) as raised:
                trt.DistributedOptimizer(sgd([p]), named_parameters=[("bad", p)])
            self.assertEqual(raised.exception.code, code)
            self.assertIn("'bad'", str(raised.exception))

    def test_overlap_forward_leaves_updates_pending_until_the_forward_pass(self):
        x, y = data((16,))
        ref, _ = reference(mlp, x, y)
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             overlap_forward=model)
        loss_fn = torch.nn.CrossEntropyLoss()
        share = BATCH // trt.size()
        for step in range(STEPS):
            xs = x[step][trt.rank() * share:(trt.rank() + 1) * share]
            ys = y[step][trt.rank() * share:(trt.rank() + 1) * share]
            optimizer.zero_grad()  # pending gradients are left for their update
            loss_fn(model(xs), ys).backward()
            before = [p.detach().clone() for p in model.parameters()]
            self.assertIsNone(optimizer.step())
            # Nothing moved yet: every update waits for the next forward pass.
            for p, q in zip(model.parameters(), before):
                self.assertTrue(torch.equal(p.detach(), q))
        # synchronize() applies the last step's updates without a forward pass, and sends
        # nothing: no backward pass ran since that step (it used to all-reduce every gradient
        # again, as zeros).
        with mock.patch.object(trt_ops, "push_pull_async",
                               side_effect=AssertionError("an all-reduce after the step")):
            optimizer.synchronize()
        self.assertMatchesReference(model, ref)
        self.assertTrue(all(float(p.grad.abs().sum()) == 0 for p in model.parameters()))

    def test_overlap_forward_refuses_a_forward_pass_around_the_model(self):
        x, y = data((16,))
        model = make(mlp)
        optimizer = trt.DistributedOptimizer(sgd(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             overlap_forward=model)
        loss_fn = torch.nn.CrossEntropyLoss()
        loss_fn(model(x[0]), y[0]).backward()
        optimizer.step()
        # The last layer by hand: its module's pre-hook never runs, its update is still
        # pending when backward reaches its gradient.
        last = model[-1]
        hidden = model[:-1]
        with torch.no_grad():
            h = hidden(x[1])  # applies the other layers' updates
        out = torch.nn.functional.linear(h, last.weight, last.bias)
        with self.assertRaises(trt.TributaryError) as raised:
            loss_fn(out, y[1]).backward()
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn("overlap_forward", str(raised.exception))
        optimizer.synchronize()  # every rank: the pending update, then the others (zeros)

    def test_overlap_forward_is_sync_only_and_needs_a_module(self):
        model = make(mlp)
        with self.assertRaises(trt.TributaryError) as raised:
            trt.DistributedOptimizer(sgd(model.parameters()), overlap_forward=model,
                                     mode="async")
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(trt.TributaryError) as raised:
            trt.DistributedOptimizer(sgd(model.parameters()), overlap_forward=[model])
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")

    def _ddp(self, model_fn, input_shape):
        x, y = data(input_shape)
        ref, _ = reference(model_fn, x, y)
        model = DistributedDataParallel(make(model_fn))
        model.register_comm_hook(f"ddp.{model_fn.__name__}", trt.ddp_comm_hook)
        train(model, sgd(model.parameters()), x, y, part=(trt.rank(), trt.size()))
        self.assertMatchesReference(model.module, ref)

    def test_mlp_ddp_comm_hook(self):
        self._ddp(mlp, (16,))

    def test_cnn_ddp_comm_hook(self):
        self._ddp(cnn, (1, 8, 8))

    def test_the_hook_carries_the_gradients(self):
        # A hook that does not communicate leaves the ranks apart: the gradients above did
        # travel through Tributary, not through DDP's process group.
        x, y = data((16,))
        model = DistributedDataParallel(make(mlp))
        model.register_comm_hook(None, lambda _, bucket: _completed(bucket.buffer()))
        train(model, sgd(model.parameters()), x, y, part=(trt.rank(), trt.size()))
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = trt.allgather(flat.reshape(1, -1), name="check.local_hook")
        self.assertFalse(all(torch.equal(everyone[r], flat) for r in range(trt.size())))


def _completed(tensor):
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


if __name__ == "__main__":
    trt.init()
    rendezvous(trt.rank(), trt.size())
    dist.init_process_group("gloo")  # DDP's required process group (env:// from the launcher)
    result = unittest.main(exit=False, verbosity=1).result
    dist.destroy_process_group()
    trt.shutdown()
    os._exit(0 if result.wasSuccessful() else 1)
