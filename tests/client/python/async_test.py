"""Asynchronous parameter-server training end to end: real controller and agents, 4 ranks.

Run by ctest through the launcher on a job created asynchronous with staleness 2:
  tributary-run --np 4 --procs-per-node 2 --spares 2 --mode async --staleness 2 \
      --timeout-ms 5000 -- python3 async_test.py
Integer-valued inputs: every final parameter is exact.
"""

import os
import unittest
from unittest import mock

import torch

import tributary.torch as trt
from tributary.torch import ops as trt_ops
from rendezvous import rendezvous
from tributary import TributaryError

N = 5000  # float32 elements: several chunks over the job's summation servers
ROUNDS = 3


def initial():
    return (torch.arange(N) % 13).to(torch.float32)


def delta(rank, k):
    return ((torch.arange(N) + 3 * rank + 7 * k) % 5 - 2).to(torch.float32)


class AsyncTest(unittest.TestCase):

    def test_deltas_from_every_rank_are_applied_exactly_once(self):
        params = initial() if trt.rank() == 0 else torch.zeros(N)
        trt.init_params(params, "exact")
        # A rank's init returns the current values: without this barrier a fast rank's first
        # delta could already be in them (asynchronous training; found under load).
        trt.barrier()
        self.assertTrue(torch.equal(params, initial()), "every rank starts from rank 0's values")
        seen = 0
        for k in range(1, ROUNDS + 1):
            trt.push_delta(delta(trt.rank(), k), "exact")
            version = trt.pull_params(params, "exact")
            # Its own k deltas are in; at most 2 (staleness) behind the others' pace.
            self.assertGreaterEqual(version, seen, "versions never go back")
            self.assertGreaterEqual(version, k)
            seen = version
        trt.barrier()  # every rank has pushed all its deltas
        version = trt.pull_params(params, "exact")
        expected = initial()
        for r in range(trt.size()):
            for k in range(1, ROUNDS + 1):
                expected += delta(r, k)
        self.assertEqual(version, trt.size() * ROUNDS)
        self.assertTrue(torch.equal(params, expected),
                        f"max error {(params - expected).abs().max().item()}")

    def test_call_scale_and_async_handles(self):
        params = torch.full((N,), 100.0) if trt.rank() == 0 else torch.zeros(N)
        trt.synchronize(trt.init_params_async(params, "scaled"))
        trt.push_delta(torch.full((N,), 4.0), "scaled", scale=-0.5)  # -2 per rank
        trt.barrier()
        handle = trt.pull_params_async(params, "scaled")
        trt.synchronize(handle)
        self.assertEqual(handle.version, trt.size())
        self.assertTrue(torch.equal(params, torch.full((N,), 100.0 - 2.0 * trt.size())))

    def test_bad_calls_are_clear_errors(self):
        params = torch.ones(N) if trt.rank() == 0 else torch.zeros(N)
        trt.init_params(params, "shape")
        with self.assertRaises(TributaryError) as e:
            trt.pull_params(torch.zeros(N + 1), "shape")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("initialised as 5000 float32", str(e.exception))
        with self.assertRaises(TributaryError) as e:
            trt.pull_params(torch.zeros(N, dtype=torch.float64), "shape")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(TributaryError) as e:
            trt.push_delta(torch.ones(4), None)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(TributaryError) as e:
            trt.push_delta(torch.ones(N), "never-initialised")
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
        self.assertIn("push_delta before init_params", str(e.exception))
        trt.barrier()

    def test_async_distributed_optimizer(self):
        torch.manual_seed(1 + trt.rank())  # different local weights: init_params makes them one
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        with self.assertRaises(TributaryError) as e:
            trt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(), mode="async",
                                     staleness=5)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("created with staleness 2", str(e.exception))
        opt = trt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters(), mode="async",
                                       staleness=2)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = trt.allgather(flat.clone(), name="async.init")
        for r in range(trt.size()):
            self.assertTrue(torch.equal(gathered[r * flat.numel():(r + 1) * flat.numel()], flat))
        g = torch.Generator().manual_seed(7)
        x = torch.randn(64, 8, generator=g)
        y = x.sum(1, keepdim=True)
        losses = []
        for _ in range(30):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[trt.rank()::4]), y[trt.rank()::4])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertLess(losses[-1], losses[0])
        self.assertTrue(all(v > 0 for v in opt.versions.values()))
        # After everyone's last push, a pull gives every rank the same parameters.
        trt.barrier()
        for p, (name, _) in zip(model.parameters(), opt._params):
            trt.pull_params(p.data, name)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = trt.allgather(flat.clone(), name="async.final")
        for r in range(trt.size()):
            self.assertTrue(torch.equal(gathered[r * flat.numel():(r + 1) * flat.numel()], flat))

    def test_a_failed_step_waits_for_every_handle_before_initialising_again(self):
        # An UNAVAILABLE error (the plan changed) on the step's first push: the optimizer
        # initialises the parameters again, which reuses their names, so the step must first
        # wait for every other push it started (until session 37 it left them in flight, and
        # init_params failed with ALREADY_EXISTS for every parameter but the first).
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 1))
        opt = trt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=[(f"retry.{n}", p) for n, p in
                                                         model.named_parameters()],
                                       mode="async", staleness=2)
        real = trt_ops.synchronize
        calls = []

        def flaky(handle, timeout=None):
            result = real(handle, timeout)
            calls.append(handle)
            if len(calls) == 1:
                raise TributaryError("the plan changed (test)", "UNAVAILABLE")
            return result

        in_flight_at_init = []
        with mock.patch.object(trt_ops, "synchronize", flaky), \
                mock.patch.object(type(opt), "_init_params", lambda self: in_flight_at_init.append(
                    set(trt_ops._get().in_flight))):
            opt.zero_grad()
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
        self.assertEqual(opt.reinitialisations, 1)
        self.assertEqual(in_flight_at_init, [set()])
        self.assertEqual(len(calls), 4)  # every push waited for; no pull after the error
        opt.zero_grad()
        model(torch.ones(2, 8)).sum().backward()
        opt.step()  # the next step runs
        trt.barrier()


if __name__ == "__main__":
    assert os.environ.get("TRIBUTARY_MODE") == "async", "run through tributary-run --mode async"
    trt.init()
    rendezvous(trt.rank(), trt.size())
    result = unittest.main(exit=False, verbosity=1).result
    trt.shutdown()
    os._exit(0 if result.wasSuccessful() else 1)
