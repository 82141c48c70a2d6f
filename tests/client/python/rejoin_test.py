"""A process that leaves the job and a new session that takes its place: the job goes on.

Run by ctest through the launcher (4 ranks: 2 agents x 2 processes, 2 spares):
  tributary-run --np 4 --procs-per-node 2 --spares 2 --timeout-ms 5000 -- python3 rejoin_test.py

Each step all-reduces integer-valued contributions of every rank into a state vector, so the
final state is exact. At step REJOIN_STEP rank 3 leaves (shutdown) and joins again (init), as a
restarted process would. The agent holds the new session back until the controller moves the
job's membership generation; every other rank then gets tributary.MembershipChanged once, calls
resync() and takes rank 0's (step, state) -- the sync point -- and the run ends with the same
state as an undisturbed one, on every rank.
"""

import os
import sys
import time

import torch

import tributary.torch as trt
from rendezvous import rendezvous
from tributary import MembershipChanged, TributaryError

N = 3000  # float32 elements: several chunks on every summation server
STEPS = 8
REJOIN_STEP = 3
REJOINING_RANK = 3
OP_DEADLINE_S = float(os.environ.get("TEST_OP_DEADLINE_S", "3"))


def contribution(rank, step):
    return ((torch.arange(N) + rank + step) % 5).to(torch.float32)


def expected_state(world):
    x = torch.zeros(N)
    for step in range(STEPS):
        for r in range(world):
            x += contribution(r, step)
    return x


def sync(step, x):
    """The sync point: rank 0's step and state on every rank."""
    step, state = trt.broadcast_object((step, x.tolist()), root_rank=0, name="sync")
    return step, torch.tensor(state, dtype=torch.float32)


def main():
    trt.init()
    rank, world = trt.rank(), trt.size()
    rendezvous(rank, world)
    step, x = 0, torch.zeros(N)
    need_sync = True
    changes = 0
    rejoined = False
    deadline = time.monotonic() + 20 * OP_DEADLINE_S + 60
    while step < STEPS or need_sync:
        if time.monotonic() > deadline:
            print(f"FAIL: rank {rank} stuck at step {step}", flush=True)
            return 1
        if rank == REJOINING_RANK and step == REJOIN_STEP and not rejoined:
            print(f"rank {rank} leaves at step {step} and joins again", flush=True)
            trt.shutdown()
            trt.init()  # held back until the job's new membership generation
            rejoined = True
            if (trt.rank(), trt.size()) != (rank, world):
                print(f"FAIL: rejoined as {trt.rank()} of {trt.size()}", flush=True)
                return 1
            need_sync = True
        try:
            if need_sync:
                step, x = sync(step, x)
                need_sync = False
                continue
            g = contribution(rank, step)
            trt.push_pull(g, average=False, name="grad")
        except MembershipChanged as e:
            changes += 1
            print(f"rank {rank} step {step}: membership changed: {e}", flush=True)
            if e.code != "ABORTED":
                print(f"FAIL: code {e.code}", flush=True)
                return 1
            if trt.resync() != (rank, world):
                print("FAIL: resync changed the rank or size of a non-elastic job", flush=True)
                return 1
            need_sync = True
            continue
        except TributaryError as e:
            if need_sync:
                print(f"FAIL: rank {rank}: the sync failed: {e.code}: {e}", flush=True)
                return 1
            # The step failed because rank 3 left (rank 2, on its agent, at once; the others
            # when its node aborts): try it again. Once the replacement joins, every rank gets
            # MembershipChanged.
            print(f"rank {rank} step {step}: {e.code}: {e}", flush=True)
            time.sleep(0.05)  # pacing a retry loop, not waiting for state
            continue
        x += g
        step += 1
    expected = expected_state(world)
    if not torch.equal(x, expected):
        print(f"FAIL: max error {(x - expected).abs().max().item()}", flush=True)
        return 1
    gathered = trt.allgather(x.clone(), name="final")
    for r in range(world):
        if not torch.equal(gathered[r * N:(r + 1) * N], x):
            print(f"FAIL: rank {r} ended with another state", flush=True)
            return 1
    if rank != REJOINING_RANK and changes != 1:
        print(f"FAIL: rank {rank} saw {changes} membership changes, expected 1", flush=True)
        return 1
    print(f"PASS rank {rank}: {STEPS} steps, {changes} membership change(s)", flush=True)
    trt.shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
