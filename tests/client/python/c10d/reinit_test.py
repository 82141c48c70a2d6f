"""destroy_process_group() on every rank, then init_process_group("tributary") again (a test
suite or a job in phases does this): the processes' sessions end with the last group, the new
ones join as replaced processes, the job moves to a new membership generation, and the new group
sums exactly (4 ranks: 2 agents x 2 processes, 2 spare summation servers)."""

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
    """init_method for the second init_process_group: a FileStore named after this launch. torch
    runs a barrier on the rendezvous store even though the backend does not use it, and env://
    again (a TCPStore at MASTER_PORT) raced with the first one's teardown on rank 0: another rank
    connected to the closing server and failed with "Broken pipe" (CI, sessions 37 and 38)."""
    launch = re.sub(r"[^0-9A-Za-z]", "_", os.environ.get("TRIBUTARY_CONTROLLER", "local"))
    path = os.path.join(tempfile.gettempdir(), f"tributary-test-reinit-{launch}-{os.getppid()}")
    return "file://" + path


def main():
    torch.set_num_threads(1)
    dist.init_process_group("tributary", timeout=TIMEOUT)
    first_ok, first_rank = summed()
    world = dist.get_world_size()
    dist.destroy_process_group()
    start = time.monotonic()
    dist.init_process_group("tributary", init_method=second_store(), rank=first_rank,
                            world_size=world, timeout=TIMEOUT)
    again_ok, again_rank = summed()
    ok = first_ok and again_ok and again_rank == first_rank
    sys.stdout.write("[rank %d] first %s, again %s as rank %d after %.1f s: %s\n" %
                     (first_rank, first_ok, again_ok, again_rank, time.monotonic() - start,
                      "OK" if ok else "FAILED"))
    sys.stdout.flush()
    dist.destroy_process_group()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
