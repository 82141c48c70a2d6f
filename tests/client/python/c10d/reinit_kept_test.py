"""destroy_process_group() and init_process_group("tributary") again while the ranks of one node
keep the first group alive (a reference held past destroy_process_group): their sessions go on
in the old membership generation and the new group reuses them, while the other node's processes
join again as replaced processes and move the job to a new generation. The new group's first
all-reduce (every rank joining) resyncs the old sessions, so the group sums exactly instead of
failing its first collective with "[membership changed ...]" (4 ranks: 2 agents x 2 processes,
2 spare summation servers)."""

import datetime
import os
import re
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import tributary.distributed  # noqa: F401  (registers the "tributary" backend)

TIMEOUT = datetime.timedelta(seconds=45)
N = 1000


def summed():
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((N,), float(rank + 1))
    dist.all_reduce(t)
    return bool(torch.all(t == world * (world + 1) / 2)), rank


def second_store():
    """A FileStore named after this launch for the second init_process_group (see
    reinit_test.py)."""
    launch = re.sub(r"[^0-9A-Za-z]", "_", os.environ.get("TRIBUTARY_CONTROLLER", "local"))
    path = os.path.join(tempfile.gettempdir(),
                        f"tributary-test-reinit-kept-{launch}-{os.getppid()}")
    return "file://" + path


def main():
    torch.set_num_threads(1)
    dist.init_process_group("tributary", timeout=TIMEOUT)
    first_ok, first_rank = summed()
    world = dist.get_world_size()
    local_size = int(os.environ.get("TRIBUTARY_LOCAL_SIZE", "2"))
    keeps = first_rank >= local_size  # the second node's ranks
    kept = dist.distributed_c10d._get_default_group() if keeps else None
    dist.destroy_process_group()
    start = time.monotonic()
    dist.init_process_group("tributary", init_method=second_store(), rank=first_rank,
                            world_size=world, timeout=TIMEOUT)
    again_ok, again_rank = summed()
    ok = first_ok and again_ok and again_rank == first_rank
    sys.stdout.write("[rank %d] first %s, again %s as rank %d after %.1f s (%s): %s\n" %
                     (first_rank, first_ok, again_ok, again_rank, time.monotonic() - start,
                      "kept the first group" if keeps else "released the first group",
                      "OK" if ok else "FAILED"))
    sys.stdout.flush()
    dist.destroy_process_group()
    del kept
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
