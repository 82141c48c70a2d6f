"""Unmodified DistributedDataParallel over init_process_group("tributary"): an MLP and a small CNN
trained for 24 SGD steps on deterministic synthetic data, each rank on its quarter of every batch,
end with the parameters of a single-process run on the whole batch (fp32, per element
|a - b| <= 1e-5 * |b| + 1e-7) and identical on every rank."""

import copy
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import c10d_testing

STEPS = 24
BATCH = 32  # whole batch; each of the 4 ranks trains on 8 samples
RTOL = 1e-5
ATOL = 1e-7  # for parameters that are (close to) zero, where a relative bound means nothing


def mlp():
    return nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh(),
                         nn.Linear(32, 5))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 5))


def dataset(seed, input_shape):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn((STEPS, BATCH) + input_shape, generator=g)
    ys = torch.randn((STEPS, BATCH, 5), generator=g)
    return xs, ys


def train(model, xs, ys, step_fn=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


class DdpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rank, cls.world = c10d_testing.init()

    def check_equivalence(self, make_model, input_shape, seed, **ddp_kwargs):
        torch.manual_seed(seed)
        reference = make_model()
        model = copy.deepcopy(reference)
        if self.rank != 0:
            # DDP's constructor broadcasts rank 0's parameters: the other ranks start elsewhere.
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0 + self.rank)
        xs, ys = dataset(seed, input_shape)

        ddp = DDP(model, **ddp_kwargs)
        per_rank = BATCH // self.world
        part = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        train(ddp, xs[:, part], ys[:, part])
        train(reference, xs, ys)  # the single-process run on the whole batch

        got = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
        err = (got - want).abs()
        bound = RTOL * want.abs() + ATOL
        worst = int(torch.argmax(err - bound))
        if self.rank == 0:
            print("%s: max |a - b| %.3g, max |a - b| / |b| over |b| > 1e-3: %.3g" %
                  (self._testMethodName, float(err.max()),
                   float((err / want.abs())[want.abs() > 1e-3].max())))
        self.assertTrue(bool((err <= bound).all()),
                        "%d of %d parameters off; worst: got %r want %r" %
                        (int((err > bound).sum()), got.numel(), float(got[worst]),
                         float(want[worst])))

        # Identical on every rank, bit for bit.
        gathered = [torch.empty_like(got) for _ in range(self.world)]
        dist.all_gather(gathered, got)
        for r in range(self.world):
            self.assertTrue(torch.equal(gathered[r], got), "rank %d differs from rank %d" %
                            (r, self.rank))

    def test_mlp(self):
        self.check_equivalence(mlp, (20,), seed=1)

    def test_cnn_several_buckets(self):
        # Small buckets: several all-reduces in flight per step, completed through futures.
        self.check_equivalence(cnn, (3, 16, 16), seed=2, bucket_cap_mb=0.004)


if __name__ == "__main__":
    c10d_testing.main()
