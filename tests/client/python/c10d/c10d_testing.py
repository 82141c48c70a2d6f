"""Shared set-up of the backend's tests: every process of the job runs the same test file under
the launcher (build/bin/tributary-run), which sets the environment init_process_group reads."""

import datetime
import os
import sys
import unittest

import torch
import torch.distributed as dist

import tributary.distributed  # noqa: F401  (registers the "tributary" backend)

# Every collective is bounded by this (the process group's timeout); a test that desynchronises
# the ranks fails within it instead of hanging.
TIMEOUT = datetime.timedelta(seconds=45)


def init():
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("tributary", timeout=TIMEOUT)
    return dist.get_rank(), dist.get_world_size()


def main():
    """Runs the file's tests; exits non-zero on any failure, so the launcher (and ctest) fail."""
    init()
    prefix = "[rank %d] " % dist.get_rank()
    result = unittest.main(exit=False, verbosity=1).result
    ok = result.wasSuccessful()
    sys.stdout.write(prefix + ("OK\n" if ok else "FAILED\n"))
    sys.stdout.flush()
    dist.destroy_process_group()
    os._exit(0 if ok else 1)
