"""destroy_process_group() on every rank, then init_process_group("tributary") again (a test
suite or a job in phases does this): the processes' sessions end with the last group, the new
ones join as replaced processes, the job moves to a new membership generation, and the new group
sums exactly (4 ranks: 2 agents x 2 processes, 2 spare summation servers).

Node 1's processes (ranks 2 and 3) destroy their group only once node 0's have joined again, so
node 0's processes join at a generation their own replacements moved the job to, and the
replacements of ranks 2 and 3 move it further: without the generation agreement when the group is
created (tributary.distributed), node 0's first collective failed with a membership change."""

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


def _side_store_path():
    """A FileStore beside the process groups' (torch's own keys and prefixes are its business):
    ranks 0 and 1 say there that they joined. Named after this launch (the controller's address
    and the launcher's pid); rank 0 removes it at the end, so a later launch never reads it."""
    launch = re.sub(r"[^0-9A-Za-z]", "_", os.environ.get("TRIBUTARY_CONTROLLER", "local"))
    return os.path.join(tempfile.gettempdir(),
                        f"tributary-test-reinit-order-{launch}-{os.getppid()}")


def say_when_joined(store, rank):
    """Wraps the backend's ProcessGroupTributary.create so that this process sets "joined/RANK"
    on the side store once it has joined the job (its group is created but not yet agreed on)."""
    real = tributary.distributed.ProcessGroupTributary

    class Announcing:
        @staticmethod
        def create(*args, **kwargs):
            group = real.create(*args, **kwargs)
            store.set(f"joined/{rank}", str(group.generation))
            return group

    tributary.distributed.ProcessGroupTributary = Announcing


def second_store():
    """init_method for the second init_process_group: a FileStore named after this launch. torch
    runs a barrier on the rendezvous store (the backend itself keeps only each rank's membership
    generation there), and env://
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
    side_path = _side_store_path()
    side = dist.FileStore(side_path, world)
    if first_rank < 2:
        say_when_joined(side, first_rank)
    else:
        # Node 1's sessions are held while node 0's replacements move the job on, so that node
        # 1's own replacements move it again.
        side.wait(["joined/0", "joined/1"], TIMEOUT)
    dist.destroy_process_group()
    start = time.monotonic()
    dist.init_process_group("tributary", init_method=second_store(), rank=first_rank,
                            world_size=world, timeout=TIMEOUT)
    generation = dist.distributed_c10d._get_default_group().generation
    again_ok, again_rank = summed()
    ok = first_ok and again_ok and again_rank == first_rank
    sys.stdout.write("[rank %d] first %s, again %s as rank %d at generation %d after %.1f s: %s\n"
                     % (first_rank, first_ok, again_ok, again_rank, generation,
                        time.monotonic() - start, "OK" if ok else "FAILED"))
    sys.stdout.flush()
    dist.destroy_process_group()
    if first_rank == 0:
        # Every rank read the side store before the second group's all-reduce.
        try:
            os.remove(side_path)
        except OSError:
            pass
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
