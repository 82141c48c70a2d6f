"""Every call of tributary._tributary and tributary.torch, and their errors, on every rank.

Run by ctest through the launcher (every rank runs the same tests in the same order):
  tributary-run --np 4 --procs-per-node 2 --spares 2 --timeout-ms 5000 -- python3 api_test.py
Inputs have exact sums; every element is checked.
"""

import os
import signal
import threading
import time
import unittest

import torch

import tributary
import tributary.torch as trt
from rendezvous import rendezvous
from tributary import TributaryError

# The job's op deadline (tributary-run --timeout-ms) plus slack: a mismatch must fail by then.
OP_DEADLINE_S = float(os.environ.get("TEST_OP_DEADLINE_S", "5")) + 10

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def rank_values(rank, n, dtype):
    """Values whose sums over 4 ranks are exact in every dtype (small integers)."""
    return ((torch.arange(n) % 7 + 1) * (rank % 2 + 1)).to(dtype)


class CoreModuleTest(unittest.TestCase):
    """tributary._tributary on its own: a second session of this process (local rank 0 of 1
    is not a rank of the job, so the core tests use their own Client only where they can)."""

    def test_shared_buffer_is_a_writable_buffer(self):
        client = trt.ops._get().client
        buffer = client.allocate(64)
        self.assertEqual(buffer.nbytes, 64)
        self.assertEqual(len(buffer), 64)
        self.assertTrue(buffer.name.startswith("tributary-"))  # a memfd label, not a path
        view = memoryview(buffer)
        self.assertFalse(view.readonly)
        view[3] = 42
        self.assertEqual(torch.frombuffer(buffer, dtype=torch.uint8)[3].item(), 42)
        self.assertIn("64 bytes", repr(buffer))

    def test_client_properties_match_the_launcher(self):
        client = trt.ops._get().client
        self.assertEqual(client.rank, int(os.environ["TRIBUTARY_RANK"]))
        self.assertEqual(client.size, 4)
        self.assertEqual(client.local_rank, int(os.environ["TRIBUTARY_LOCAL_RANK"]))
        self.assertEqual(client.local_size, 2)
        self.assertEqual(client.job, os.environ["TRIBUTARY_JOB"])
        self.assertTrue(client.has_control_ring)

    def test_core_collectives_poll_and_wait(self):
        client = trt.ops._get().client
        n = 1000
        buffer = client.allocate(4 * trt.size() * n)
        view = torch.frombuffer(buffer, dtype=torch.float32)
        view[:n] = rank_values(trt.rank(), n, torch.float32)
        handle = client.all_reduce_async("core.sum", buffer, 0, n, "float32", "sum", 0)
        self.assertEqual(handle.name, "core.sum")
        handle.wait(OP_DEADLINE_S)
        self.assertTrue(handle.done)
        self.assertTrue(handle.poll())
        expected = sum(rank_values(r, n, torch.float32) for r in range(4))
        self.assertTrue(torch.equal(view[:n], expected))
        view[:n] = float(trt.rank() + 1)
        client.broadcast_async("core.bcast", buffer, 0, n, "float32", 2).wait(OP_DEADLINE_S)
        self.assertTrue(torch.equal(view[:n], torch.full((n,), 3.0)))
        view[trt.rank() * n:(trt.rank() + 1) * n] = float(trt.rank())
        client.all_gather_async("core.gather", buffer, 0, n, "float32").wait(OP_DEADLINE_S)
        for r in range(4):
            self.assertTrue(torch.equal(view[r * n:(r + 1) * n], torch.full((n,), float(r))))
        view[:] = 1.0
        client.reduce_scatter_async("core.rs", buffer, 0, n, "float32", "sum").wait(OP_DEADLINE_S)
        me = trt.rank()
        self.assertTrue(torch.equal(view[me * n:(me + 1) * n], torch.full((n,), 4.0)))

    def test_wait_with_a_timeout_raises_deadline_exceeded_and_can_be_resumed(self):
        client = trt.ops._get().client
        buffer = client.allocate(16)
        torch.frombuffer(buffer, dtype=torch.int32)[:] = 1
        handle = None
        if trt.rank() == 0:
            # The others submit only after the barrier: this one cannot finish yet.
            handle = client.all_reduce_async("core.late", buffer, 0, 4, "int32")
            start = time.monotonic()
            with self.assertRaises(TributaryError) as e:
                handle.wait(0.2)
            self.assertEqual(e.exception.code, "DEADLINE_EXCEEDED")
            self.assertIn("not done after", str(e.exception))
            self.assertLess(time.monotonic() - start, 2)
            self.assertFalse(handle.poll())
        trt.barrier()
        if trt.rank() != 0:
            handle = client.all_reduce_async("core.late", buffer, 0, 4, "int32")
        handle.wait(OP_DEADLINE_S)
        self.assertEqual(torch.frombuffer(buffer, dtype=torch.int32).tolist(), [4] * 4)

    def test_ctrl_c_interrupts_a_wait(self):
        client = trt.ops._get().client
        buffer = client.allocate(16)
        torch.frombuffer(buffer, dtype=torch.int32)[:] = 1
        handle = None
        if trt.rank() == 0:
            handle = client.all_reduce_async("core.interrupted", buffer, 0, 4, "int32")
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            start = time.monotonic()
            with self.assertRaises(KeyboardInterrupt):
                handle.wait()  # no timeout: only the signal ends it
            self.assertLess(time.monotonic() - start, 5)
            timer.join()
        trt.barrier()
        if trt.rank() != 0:
            handle = client.all_reduce_async("core.interrupted", buffer, 0, 4, "int32")
        handle.wait(OP_DEADLINE_S)  # the interrupted operation went on and completes
        self.assertEqual(torch.frombuffer(buffer, dtype=torch.int32).tolist(), [4] * 4)

    def test_core_argument_errors(self):
        client = trt.ops._get().client
        buffer = client.allocate(16)
        with self.assertRaises(TributaryError) as e:
            client.all_reduce_async("core.bad", buffer, 0, 4, "complex64")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("unknown dtype", str(e.exception))
        with self.assertRaises(TributaryError) as e:
            client.all_reduce_async("core.bad", buffer, 0, 4, "float32", "max")
        self.assertIn("unknown op", str(e.exception))
        with self.assertRaises(TributaryError) as e:
            client.all_reduce_async("core.bad", buffer, 0, 8, "float32")
        self.assertEqual(e.exception.code, "OUT_OF_RANGE")
        with self.assertRaises(TributaryError) as e:
            client.allocate(0)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(tributary.dtype_size("bfloat16"), 2)

    def test_client_without_environment_says_what_is_missing(self):
        saved = os.environ.pop("TRIBUTARY_AGENT_ADDRESS")
        try:
            with self.assertRaises(TributaryError) as e:
                tributary.Client()
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
            self.assertIn("TRIBUTARY_AGENT_ADDRESS is not set", str(e.exception))
        finally:
            os.environ["TRIBUTARY_AGENT_ADDRESS"] = saved


class TorchApiTest(unittest.TestCase):
    def test_ranks_and_sizes(self):
        self.assertTrue(trt.is_initialized())
        self.assertEqual(trt.size(), 4)
        self.assertEqual(trt.local_size(), 2)
        self.assertEqual(trt.rank(), int(os.environ["RANK"]))
        self.assertEqual(trt.local_rank(), int(os.environ["LOCAL_RANK"]))
        trt.init()  # a second init is a no-op

    def test_push_pull_sums_and_averages_every_dtype(self):
        for dtype in DTYPES:
            for n in (1, 3, 5000):
                t = rank_values(trt.rank(), n, dtype).reshape(-1, 1) if n > 1 else \
                    rank_values(trt.rank(), n, dtype)
                expected = sum(rank_values(r, n, torch.float64) for r in range(4))
                out = trt.push_pull(t, average=False, name=f"pp.sum.{dtype}.{n}")
                self.assertIs(out, t)
                self.assertTrue(torch.equal(t.reshape(-1).double(), expected), f"{dtype} {n}")
                if dtype.is_floating_point:
                    t = rank_values(trt.rank(), n, dtype)
                    trt.push_pull(t, average=True, name=f"pp.avg.{dtype}.{n}")
                    self.assertTrue(torch.equal(t.double(), expected / 4), f"{dtype} {n}")

    def test_push_pull_async_poll_synchronize_and_priorities(self):
        tensors = [torch.full((100 * (i + 1),), float(trt.rank() + i)) for i in range(5)]
        handles = [trt.push_pull_async(t, average=False, name=f"async.{i}", priority=4 - i)
                   for i, t in enumerate(tensors)]
        for i, h in enumerate(handles):
            self.assertIsInstance(h.poll(), bool)
            self.assertEqual(h.name, f"async.{i}")
            self.assertIs(trt.synchronize(h), tensors[i])
            self.assertTrue(trt.poll(h))
            self.assertTrue(torch.equal(tensors[i], torch.full((100 * (i + 1),),
                                                               float(6 + 4 * i))))

    def test_unnamed_calls_are_numbered_in_call_order(self):
        a = torch.full((10,), float(trt.rank()))
        b = torch.full((20,), 1.0)
        ha = trt.push_pull_async(a, average=False)
        hb = trt.push_pull_async(b, average=False)
        self.assertNotEqual(ha.name, hb.name)
        trt.synchronize(ha)
        trt.synchronize(hb)
        self.assertTrue(torch.equal(a, torch.full((10,), 6.0)))
        self.assertTrue(torch.equal(b, torch.full((20,), 4.0)))

    def test_broadcast(self):
        for root in range(4):
            t = torch.arange(300, dtype=torch.float64) * (trt.rank() + 1)
            self.assertIs(trt.broadcast(t, root, name=f"bcast.{root}"), t)
            self.assertTrue(torch.equal(t, torch.arange(300, dtype=torch.float64) * (root + 1)))
        h = trt.broadcast_async(torch.zeros(3) + trt.rank(), 1, name="bcast.async")
        self.assertTrue(torch.equal(trt.synchronize(h), torch.ones(3)))

    def test_allgather(self):
        t = torch.full((2, 3), float(trt.rank()), dtype=torch.float32)
        out = trt.allgather(t, name="gather.2d")
        self.assertEqual(tuple(out.shape), (8, 3))
        for r in range(4):
            self.assertTrue(torch.equal(out[2 * r:2 * r + 2], torch.full((2, 3), float(r))))
        out = trt.synchronize(trt.allgather_async(torch.tensor(trt.rank() * 10,
                                                               dtype=torch.int64)))
        self.assertEqual(out.tolist(), [0, 10, 20, 30])

    def test_reduce_scatter(self):
        t = torch.arange(8 * 5, dtype=torch.float32).reshape(8, 5) * (trt.rank() + 1)
        out = trt.reduce_scatter(t, average=False, name="rs.sum")
        full = torch.arange(8 * 5, dtype=torch.float32).reshape(8, 5) * 10
        me = trt.rank()
        self.assertEqual(tuple(out.shape), (2, 5))
        self.assertTrue(torch.equal(out, full[2 * me:2 * me + 2]))
        out = trt.synchronize(trt.reduce_scatter_async(t, average=True, name="rs.avg"))
        self.assertTrue(torch.equal(out, full[2 * me:2 * me + 2] / 4))
        with self.assertRaises(TributaryError) as e:
            trt.reduce_scatter(torch.zeros(6), name="rs.bad")
        self.assertIn("not a multiple of the job's size 4", str(e.exception))

    def test_barrier(self):
        for _ in range(3):
            trt.barrier()

    def test_empty_is_shared_memory_used_without_staging(self):
        t = trt.empty(4, 250, dtype=torch.float32)
        self.assertEqual(tuple(t.shape), (4, 250))
        t.copy_(torch.full((4, 250), float(trt.rank() + 1)))
        pool = trt.ops._get().pool
        pool.clear()
        trt.push_pull(t, average=False, name="zero_copy")
        self.assertTrue(torch.equal(t, torch.full((4, 250), 10.0)))
        self.assertEqual(pool._free, {}, "a zero-copy push_pull used a staging buffer")
        # A slice of it is zero-copy too.
        t[1].fill_(1.0)
        trt.push_pull(t[1], average=False, name="zero_copy.row")
        self.assertTrue(torch.equal(t[1], torch.full((250,), 4.0)))
        self.assertEqual(pool._free, {})
        trt.broadcast(t, 3, name="zero_copy.bcast")

    def test_broadcast_parameters_and_object_and_optimizer_state(self):
        torch.manual_seed(trt.rank())
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        trt.broadcast_parameters(model.state_dict(), root_rank=1)
        torch.manual_seed(1)
        reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b))
        trt.broadcast_parameters(list(model.named_parameters()), root_rank=0)
        obj = trt.broadcast_object({"rank": trt.rank(), "x": [1, 2]}, root_rank=2)
        self.assertEqual(obj, {"rank": 2, "x": [1, 2]})
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (trt.rank() + 1), momentum=0.9)
        if trt.rank() == 3:  # only the root has momentum buffers
            model(torch.ones(1, 4)).sum().backward()
            optimizer.step()
        trt.broadcast_optimizer_state(optimizer, root_rank=3)
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.4)
        self.assertEqual(len(optimizer.state_dict()["state"]), 4)
        with self.assertRaises(TributaryError):
            trt.broadcast_parameters([torch.zeros(1)], 0)

    def test_ddp_comm_hook_future(self):
        class Bucket:  # what DDP hands the hook
            def __init__(self, t):
                self.t = t

            def buffer(self):
                return self.t

            def index(self):
                return 0

        t = torch.full((64,), float(trt.rank()))
        future = trt.ddp_comm_hook("hooktest", Bucket(t))
        self.assertIsInstance(future, torch.futures.Future)
        self.assertTrue(torch.equal(future.wait(), torch.full((64,), 1.5)))


class BadInputTest(unittest.TestCase):
    def assertError(self, code, text, fn, *args, **kwargs):
        with self.assertRaises(TributaryError) as e:
            fn(*args, **kwargs)
        self.assertEqual(e.exception.code, code, str(e.exception))
        self.assertIn(text, str(e.exception))
        return e.exception

    def test_parameter_server_calls_on_a_synchronous_job(self):
        self.assertError("FAILED_PRECONDITION", "need a job created with --mode async",
                         trt.pull_params, torch.zeros(4), "ps")
        self.assertError("FAILED_PRECONDITION", "need a job created with --mode async",
                         trt.DistributedOptimizer,
                         torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1),
                         mode="async")

    def test_distributed_optimizer_checks_named_parameters(self):
        a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
        sgd = lambda: torch.optim.SGD([a, b], lr=0.1)
        self.assertError("INVALID_ARGUMENT", "must be (name, parameter) pairs",
                         trt.DistributedOptimizer, sgd(), named_parameters=[a, b])
        self.assertError("INVALID_ARGUMENT", "not unique: ['x']", trt.DistributedOptimizer,
                         sgd(), named_parameters=[("x", a), ("x", b)])
        self.assertError("INVALID_ARGUMENT",
                         "1 parameters of the optimizer are not in named_parameters",
                         trt.DistributedOptimizer, sgd(), named_parameters=[("a", a)])

    def test_complex_dtype(self):
        self.assertError("INVALID_ARGUMENT", "dtype torch.complex64 is not supported",
                         trt.push_pull, torch.zeros(4, dtype=torch.complex64))
        self.assertError("INVALID_ARGUMENT", "dtype torch.uint8 is not supported",
                         trt.broadcast, torch.zeros(4, dtype=torch.uint8), 0)
        self.assertError("INVALID_ARGUMENT", "not supported", trt.empty, 3,
                         dtype=torch.complex128)

    def test_non_contiguous(self):
        t = torch.zeros(4, 6).t()
        self.assertError("INVALID_ARGUMENT", "not contiguous", trt.push_pull, t)
        self.assertError("INVALID_ARGUMENT", "not contiguous", trt.allgather, t[::2])

    def test_other_devices_and_bad_arguments(self):
        self.assertError("UNIMPLEMENTED", "only CPU tensors", trt.push_pull,
                         torch.zeros(4, device="meta"))
        self.assertError("INVALID_ARGUMENT", "expected a torch.Tensor", trt.push_pull, [1.0])
        self.assertError("INVALID_ARGUMENT", "empty", trt.push_pull, torch.zeros(0))
        self.assertError("INVALID_ARGUMENT", "root_rank 4 is not a rank", trt.broadcast,
                         torch.zeros(1), 4)

    def test_name_still_in_flight(self):
        a, b = torch.ones(4), torch.ones(4)
        h = trt.push_pull_async(a, name="dup", average=False)
        self.assertError("ALREADY_EXISTS", "still in flight", trt.push_pull_async, b,
                         name="dup")
        trt.synchronize(h)
        self.assertTrue(torch.equal(a, torch.full((4,), 4.0)))

    def _expect_mismatch(self, name, tensor):
        start = time.monotonic()
        error = self.assertError_any(trt.push_pull, tensor, name=name, average=False)
        self.assertLess(time.monotonic() - start, OP_DEADLINE_S)
        return error

    def assertError_any(self, fn, *args, **kwargs):
        with self.assertRaises(TributaryError) as e:
            fn(*args, **kwargs)
        return e.exception

    def test_mismatched_shapes_across_ranks_fail_on_every_rank(self):
        # Ranks 0 and 3 (different nodes) give 100 elements, the others 120.
        n = 100 if trt.rank() in (0, 3) else 120
        self._expect_mismatch("mismatch.shape", torch.ones(n))
        trt.barrier()  # the job goes on afterwards

    def test_mismatched_dtypes_across_ranks_fail_on_every_rank(self):
        dtype = torch.float32 if trt.rank() % 2 == 0 else torch.int32
        self._expect_mismatch("mismatch.dtype", torch.ones(64, dtype=dtype))
        trt.barrier()


if __name__ == "__main__":
    trt.init()
    rendezvous(trt.rank(), trt.size())
    result = unittest.main(exit=False, verbosity=1).result
    trt.shutdown()
    trt.shutdown()  # idempotent
    ok = result.wasSuccessful() and not trt.is_initialized()
    try:
        trt.rank()
        ok = False
        print("FAIL: rank() after shutdown() did not raise", flush=True)
    except TributaryError as e:
        ok = ok and e.code == "FAILED_PRECONDITION" and "not initialised" in str(e)
    os._exit(0 if ok else 1)
