"""A rank that exits in the middle of training: every other rank gets a TributaryError from
its next synchronize (DistributedOptimizer) within the job's op deadline, not a hang.

Run by ctest through the launcher with a short op deadline:
  tributary-run --np 4 --procs-per-node 2 --spares 2 --timeout-ms 3000 -- python3 failure_test.py
Rank 3 exits with status 0 after 3 steps (so that the launcher lets the others go on); every
other rank exits 0 only if it saw the error in time.
The ranks meet at a rendezvous outside Tributary before step 0 (rendezvous.py says why).
"""

import os
import sys
import time

import torch

import tributary.torch as trt
from rendezvous import rendezvous
from tributary import TributaryError

OP_DEADLINE_S = float(os.environ.get("TEST_OP_DEADLINE_S", "3"))
DYING_RANK = 3
DIES_AFTER = 3


def main():
    trt.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    # Local warm-up (autograd's first pass) before the optimizer hooks the gradients.
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    optimizer = trt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    rendezvous(trt.rank(), trt.size())
    for step in range(100):
        if trt.rank() == DYING_RANK and step == DIES_AFTER:
            print(f"rank {DYING_RANK} exits at step {step}", flush=True)
            os._exit(0)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        start = time.monotonic()
        try:
            optimizer.step()
        except TributaryError as e:
            waited = time.monotonic() - start
            print(f"step {step}: TributaryError {e.code} after {waited:.1f} s: {e}", flush=True)
            if step < DIES_AFTER:
                print("FAIL: the error came before the rank left", flush=True)
                return 1
            # The op deadline, plus the agent's own detection and scheduling slack.
            if waited > OP_DEADLINE_S + 10:
                print(f"FAIL: took {waited:.1f} s, deadline {OP_DEADLINE_S} s", flush=True)
                return 1
            print("PASS", flush=True)
            return 0
    print("FAIL: training went on without the dead rank", flush=True)
    return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no leave: the job is broken anyway
