"""Every supported call of the "tributary" backend with exact values on every element, and the
errors of the unsupported ones (4 ranks: 2 agents x 2 processes, 2 spare summation servers)."""

import time
import unittest

import torch
import torch.distributed as dist

import c10d_testing

N = 1000  # elements per tensor: the staged path, several chunks on the wire


def pattern(n, dtype=torch.float32):
    """i % 7 + 1: small integers, so every sum of the tests is exact in every dtype."""
    return (torch.arange(n, dtype=torch.int64) % 7 + 1).to(dtype)


class CollectivesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rank, cls.world = c10d_testing.init()

    def sum_of_ranks(self):
        return self.world * (self.world + 1) // 2  # sum over r of (r + 1)

    def test_backend_and_ranks(self):
        self.assertEqual(dist.get_backend(), "tributary")
        self.assertEqual(self.world, 4)
        pg = dist.distributed_c10d._get_default_group()
        self.assertEqual(pg.local_size, 2)
        self.assertEqual(self.rank, pg.local_rank + 2 * (self.rank // 2))

    def test_create_checks_rank_and_size(self):
        # The creator that init_process_group calls: (rank, size) must be where the job puts this
        # process; the session is the process's one (reused here, no new join).
        import datetime
        import tributary.distributed as td
        timeout = datetime.timedelta(seconds=5)
        self.assert_clear_error(lambda: td.create(None, self.rank, self.world - 1, timeout),
                                "whole job", "subgroups are not supported")
        self.assert_clear_error(lambda: td.create(None, (self.rank + 1) % self.world,
                                                  self.world, timeout),
                                "global rank %d" % self.rank)
        pg = td.create(None, self.rank, self.world, timeout)
        self.assertEqual(pg.job, dist.distributed_c10d._get_default_group().job)

    def test_allreduce_sum_every_dtype(self):
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                      torch.int64):
            with self.subTest(dtype=dtype):
                t = pattern(N, dtype) * (self.rank + 1)
                dist.all_reduce(t)
                self.assertEqual(t.dtype, dtype)
                expected = pattern(N, dtype) * self.sum_of_ranks()
                self.assertTrue(torch.equal(t, expected), "allreduce %s: %s" % (dtype, t[:8]))

    def test_allreduce_complex_through_real_view(self):
        t = torch.complex(pattern(N), -pattern(N)) * (self.rank + 1)
        dist.all_reduce(t)
        expected = torch.complex(pattern(N), -pattern(N)) * self.sum_of_ranks()
        self.assertTrue(torch.equal(t, expected))

    def test_allreduce_avg(self):
        t = pattern(N) * (self.rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        # (1 + 2 + 3 + 4) / 4 = 2.5: exact in float32.
        self.assertTrue(torch.equal(t, pattern(N) * 2.5), t[:8])
        # Of integers it would truncate: refused before anything is submitted (the ranks stay
        # in step).
        for dtype in (torch.int32, torch.int64):
            self.assert_clear_error(
                lambda: dist.all_reduce(pattern(N, dtype), op=dist.ReduceOp.AVG),
                "AVG of an integer tensor")

    def test_allreduce_non_contiguous(self):
        base = (pattern(2 * N) * (self.rank + 1)).reshape(N // 10, 20)
        t = base.t()[::2]  # a strided view: staged through a gathering copy
        self.assertFalse(t.is_contiguous())
        before_other = base.t()[1::2].clone()
        dist.all_reduce(t)
        full = (pattern(2 * N) * self.sum_of_ranks()).reshape(N // 10, 20).t()
        self.assertTrue(torch.equal(t, full[::2]))
        self.assertTrue(torch.equal(base.t()[1::2], before_other), "touched outside the view")

    def test_allreduce_in_inference_mode(self):
        # The result is copied into the tensor on the completion thread, outside the caller's
        # inference mode: an inference tensor that is not contiguous (staged, then copied back
        # with copy_) must still take it.
        with torch.inference_mode():
            base = (pattern(2 * N) * (self.rank + 1)).reshape(N // 10, 20)
            t = base.t()[::2]
            self.assertTrue(t.is_inference())
            self.assertFalse(t.is_contiguous())
            dist.all_reduce(t)
        full = (pattern(2 * N) * self.sum_of_ranks()).reshape(N // 10, 20).t()
        self.assertTrue(torch.equal(t, full[::2]))

    def test_allreduce_async_works_and_futures(self):
        # Several collectives in flight at once (different names and the same name twice), then
        # completed through wait(), get_future() and is_completed().
        tensors = [pattern(N + k) * (self.rank + 1) * (k + 1) for k in range(3)]
        tensors.append(pattern(N) * (self.rank + 1) * 4)  # same signature as tensors[0]
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        futures = [w.get_future() for w in works]
        result = futures[1].wait()
        self.assertIsInstance(result, list)
        self.assertIs(result[0], tensors[1])
        self.assertTrue(works[0].wait())
        self.assertTrue(works[0].is_completed())
        works[2].wait(timeout=c10d_testing.TIMEOUT)
        torch.futures.wait_all(futures)
        for k, t in enumerate(tensors[:3]):
            expected = pattern(N + k) * self.sum_of_ranks() * (k + 1)
            self.assertTrue(torch.equal(t, expected), "tensor %d: %s" % (k, t[:8]))
        self.assertTrue(torch.equal(tensors[3], pattern(N) * self.sum_of_ranks() * 4))

    def test_future_then_callback(self):
        t = pattern(N) * (self.rank + 1)
        fut = dist.all_reduce(t, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
        self.assertTrue(torch.equal(doubled, pattern(N) * self.sum_of_ranks() * 2))

    def test_a_future_callback_may_wait_on_another_collective(self):
        # As torch's PowerSGD hook does: a `then` callback starts an all-reduce and waits for
        # its future. Until session 37 the callback ran on the thread that completes every
        # collective of the group, so the inner one never completed (a hang without deadline).
        t = pattern(N) * (self.rank + 1)

        def nested(f):
            u = pattern(N)
            dist.all_reduce(u, async_op=True).get_future().wait()
            return f.value()[0] + u

        out = dist.all_reduce(t, async_op=True).get_future().then(nested).wait()
        self.assertTrue(torch.equal(out, pattern(N) * (self.sum_of_ranks() + self.world)))

    def test_a_waited_work_has_its_future_complete(self):
        t = pattern(N)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        self.assertTrue(work.get_future().done())
        self.assertTrue(torch.equal(work.get_future().value()[0], pattern(N) * self.world))

    def test_staging_buffers_are_pooled(self):
        pg = dist.distributed_c10d._get_default_group()
        t = pattern(N)
        dist.all_reduce(t)
        before = pg.staging_allocations
        for _ in range(5):
            dist.all_reduce(t)
        self.assertEqual(pg.staging_allocations, before)

    def test_a_wait_that_gives_up_does_not_pool_its_staging_buffer(self):
        # Ranks 1-3 give up on an all-reduce at a short group timeout while rank 0 has not
        # submitted it: their operations go on in the agents, on the staging buffers. Those
        # must not serve the next collective (until session 37 they went back to the pool, and
        # the late operation would read the next one's input and write over its result).
        import datetime
        import tributary.distributed as td
        big = 1 << 20  # floats: the 4 MiB staging size, which no other test uses
        short = td.create(None, self.rank, self.world, datetime.timedelta(seconds=2))
        default = dist.distributed_c10d._get_default_group()
        dist.barrier()  # the barrier's own staging buffer (64 KiB) exists before the count
        before = default.staging_allocations
        a = pattern(big) * (self.rank + 1)
        if self.rank != 0:
            with self.assertRaises(RuntimeError) as raised:
                short.allreduce([a]).wait()
            self.assertIn("DEADLINE_EXCEEDED", str(raised.exception))
        dist.barrier()
        if self.rank == 0:  # now the others' operation completes in the agents
            short.allreduce([a]).wait()
            self.assertTrue(torch.equal(a, pattern(big) * self.sum_of_ranks()))
        b = pattern(big) * (self.rank + 2)
        dist.all_reduce(b)
        self.assertTrue(torch.equal(b, pattern(big) * (self.sum_of_ranks() + self.world)))
        # Rank 0's buffer went back to the pool and served b; the others' was dropped.
        self.assertEqual(default.staging_allocations, before + (1 if self.rank == 0 else 2))
        dist.barrier()

    def test_works_queued_behind_a_stuck_one_time_out_from_their_submission(self):
        # Ranks 1-3 submit three all-reduces that rank 0 holds back: each fails at the group's
        # timeout from its own submission, not one timeout after the work before it (until
        # session 40 the third failed after three timeouts).
        import datetime
        import time
        import tributary.distributed as td
        short = td.create(None, self.rank, self.world, datetime.timedelta(seconds=2))
        dist.barrier()
        tensors = [pattern(n) * (self.rank + 1) for n in (11, 12, 13)]  # three names
        if self.rank != 0:
            start = time.monotonic()
            works = [short.allreduce([t]) for t in tensors]
            for w in works:
                with self.assertRaises(RuntimeError) as raised:
                    w.wait()
                self.assertIn("not done within the process group's timeout of 2000 ms from its "
                              "submission", str(raised.exception))
            self.assertLess(time.monotonic() - start, 4.0)
        dist.barrier()
        if self.rank == 0:  # now the others' operations complete in the agents
            for t, n in zip(tensors, (11, 12, 13)):
                short.allreduce([t]).wait()
                self.assertTrue(torch.equal(t, pattern(n) * self.sum_of_ranks()))
        dist.barrier()

    def test_a_group_timeout_meant_as_no_limit(self):
        # A timedelta of a thousand years overflowed the deadlines (in the clock's nanoseconds)
        # into the past, and every collective failed at once.
        import datetime
        import tributary.distributed as td
        forever = td.create(None, self.rank, self.world, datetime.timedelta(days=365 * 1000))
        t = pattern(N) * (self.rank + 1)
        work = forever.allreduce([t])
        self.assertTrue(work.wait())
        self.assertTrue(torch.equal(t, pattern(N) * self.sum_of_ranks()))

    def test_allreduce_coalesced(self):
        # Tensors of several sizes and shapes (one not contiguous), one all-reduce for all.
        base = pattern(2 * N).reshape(N // 10, 20) * (self.rank + 1)
        tensors = [pattern(1) * (self.rank + 1), pattern(N) * (self.rank + 1),
                   base.t()[::2], pattern(3 * N, torch.float32).reshape(3, N) * (self.rank + 1)]
        dist.all_reduce_coalesced(tensors)
        s = self.sum_of_ranks()
        self.assertTrue(torch.equal(tensors[0], pattern(1) * s))
        self.assertTrue(torch.equal(tensors[1], pattern(N) * s))
        self.assertTrue(torch.equal(tensors[2], (pattern(2 * N).reshape(N // 10, 20) * s).t()[::2]))
        self.assertTrue(torch.equal(tensors[3], pattern(3 * N).reshape(3, N) * s))
        avg = [pattern(N, torch.float64) * (self.rank + 1), pattern(7, torch.float64)]
        dist.all_reduce_coalesced(avg, op=dist.ReduceOp.AVG)
        self.assertTrue(torch.equal(avg[0], pattern(N, torch.float64) * 2.5))
        self.assertTrue(torch.equal(avg[1], pattern(7, torch.float64)))

    def test_allreduce_coalesced_errors(self):
        pg = dist.distributed_c10d._get_default_group()
        # (dist.all_reduce_coalesced refuses mixed dtypes itself; the group does too.)
        self.assert_clear_error(
            lambda: pg.allreduce_coalesced([torch.ones(4), torch.ones(4, dtype=torch.float64)]),
            "allreduce_coalesced", "same dtype")
        self.assert_clear_error(lambda: pg.allreduce_coalesced([]), "allreduce_coalesced",
                                "no tensors")
        self.assert_clear_error(
            lambda: dist.all_reduce_coalesced([torch.ones(4)], op=dist.ReduceOp.MAX), "MAX")

    def test_broadcast_from_every_root(self):
        for root in range(self.world):
            with self.subTest(root=root):
                if self.rank == root:
                    t = pattern(N, torch.float64) + 100 * root
                else:
                    t = torch.full((N,), -1.0, dtype=torch.float64)
                dist.broadcast(t, src=root)
                self.assertTrue(torch.equal(t, pattern(N, torch.float64) + 100 * root))

    def test_all_gather(self):
        t = pattern(N, torch.int64) + 1000 * self.rank
        out = [torch.full((N,), -1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(out, t)
        for r in range(self.world):
            self.assertTrue(torch.equal(out[r], pattern(N, torch.int64) + 1000 * r), "block %d" % r)

    def test_all_gather_base(self):
        t = (pattern(N) + 1000 * self.rank).reshape(10, N // 10)
        out = torch.full((self.world * 10, N // 10), -1.0)
        dist.all_gather_into_tensor(out, t)
        for r in range(self.world):
            block = out[10 * r:10 * (r + 1)].reshape(-1)
            self.assertTrue(torch.equal(block, pattern(N) + 1000 * r), "block %d" % r)

    def test_reduce_scatter(self):
        # Block i of rank r: (r + 1) * (i + 1) * pattern; rank i gets the sum of blocks i.
        inputs = [pattern(N) * (self.rank + 1) * (i + 1) for i in range(self.world)]
        out = torch.full((N,), -1.0)
        dist.reduce_scatter(out, inputs)
        self.assertTrue(torch.equal(out, pattern(N) * self.sum_of_ranks() * (self.rank + 1)))

    def test_reduce_scatter_base_avg(self):
        inp = torch.cat([pattern(N) * (self.rank + 1) * (i + 1) for i in range(self.world)])
        out = torch.full((N,), -1.0)
        dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
        self.assertTrue(torch.equal(out, pattern(N) * 2.5 * (self.rank + 1)))

    def test_barrier_waits_for_every_rank(self):
        store = dist.distributed_c10d._get_default_store()
        store.add("barrier_test/entered", 1)
        dist.barrier()
        # Every rank counted itself in before entering the barrier: once it returns, all have.
        self.assertEqual(store.add("barrier_test/entered", 0), self.world)

    def test_empty_tensor(self):
        t = torch.empty(0)
        dist.all_reduce(t)
        self.assertEqual(t.numel(), 0)

    def assert_clear_error(self, call, *words):
        start = time.monotonic()
        with self.assertRaises(RuntimeError) as cm:
            call()
        self.assertLess(time.monotonic() - start, 5.0, "an unsupported call must fail at once")
        for word in words:
            self.assertIn(word, str(cm.exception))
        return str(cm.exception)

    def test_unsupported_calls(self):
        t = pattern(N)
        self.assert_clear_error(lambda: dist.reduce(t, dst=0), "does not support reduce")
        self.assert_clear_error(lambda: dist.gather(t, [t.clone()] * self.world if self.rank == 0
                                                    else None, dst=0), "gather")
        self.assert_clear_error(lambda: dist.scatter(t, [t.clone()] * self.world
                                                     if self.rank == 0 else None, src=0),
                                "scatter")
        self.assert_clear_error(lambda: dist.all_to_all_single(t.clone(), t), "alltoall")
        self.assert_clear_error(lambda: dist.send(t, dst=(self.rank + 1) % self.world), "send")
        self.assert_clear_error(lambda: dist.recv(t, src=(self.rank + 1) % self.world), "recv")
        self.assert_clear_error(lambda: dist.monitored_barrier(), "monitored_barrier")

    def test_unsupported_reduce_ops(self):
        for op, name in ((dist.ReduceOp.MAX, "MAX"), (dist.ReduceOp.MIN, "MIN"),
                         (dist.ReduceOp.PRODUCT, "PRODUCT")):
            with self.subTest(op=name):
                self.assert_clear_error(lambda: dist.all_reduce(pattern(N), op=op), name,
                                        "allreduce")

    def test_bad_tensors(self):
        pg = dist.distributed_c10d._get_default_group()
        # dist.all_reduce hands complex tensors over as their real view; the group itself
        # refuses them.
        self.assert_clear_error(lambda: pg.allreduce([torch.ones(4, dtype=torch.complex64)]),
                                "ComplexFloat", "not supported")
        self.assert_clear_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint8)),
                                "Byte", "not supported")
        # (The device check cannot be reached from here: Debian's torch has no CUDA, and the
        # dispatcher refuses other devices before the group sees them.)
        self.assert_clear_error(lambda: dist.all_reduce(torch.ones(4).to_sparse()), "dense")
        self.assert_clear_error(lambda: pg.allreduce([torch.ones(4), torch.ones(4)]),
                                "exactly one tensor")
        out = [torch.empty(N) for _ in range(self.world - 1)]
        self.assert_clear_error(lambda: dist.all_gather(out, torch.ones(N)), "one tensor per rank")
        out = [torch.empty(N + 1) for _ in range(self.world)]
        self.assert_clear_error(lambda: dist.all_gather(out, torch.ones(N)), "number of elements")

    def test_works_are_usable_after_errors(self):
        # The rejected calls above submit nothing: the ranks stay in step.
        self.assert_clear_error(lambda: dist.reduce(pattern(N), dst=0), "reduce")
        t = pattern(N) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertTrue(torch.equal(t, pattern(N) * self.sum_of_ranks()))


if __name__ == "__main__":
    c10d_testing.main()
