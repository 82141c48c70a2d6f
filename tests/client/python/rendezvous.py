"""A start-up rendezvous for the Python tests, outside Tributary.

The job's op deadline (--timeout-ms, 3-10 s in these tests) also bounds how far apart the ranks
may submit an operation. On a loaded machine one process can finish importing torch seconds
after its sibling, so each test meets here first, with a generous deadline of its own, and its
first operation starts with the ranks together.
"""

import datetime
import os
import re
import tempfile

import torch.distributed

DEADLINE_S = 120.0


def rendezvous(rank, size):
    """Returns once every rank of this launch has called it: torch's FileStore, in a file named
    after the launch (its controller's address and the launcher's pid). Raises after
    DEADLINE_S."""
    launch = re.sub(r"[^0-9A-Za-z]", "_", os.environ.get("TRIBUTARY_CONTROLLER", "local"))
    path = os.path.join(tempfile.gettempdir(), f"tributary-test-rendezvous-{launch}-{os.getppid()}")
    store = torch.distributed.FileStore(path, size)
    try:
        store.set_timeout(datetime.timedelta(seconds=DEADLINE_S))
        store.set(f"rank-{rank}", "ready")
        store.wait([f"rank-{r}" for r in range(size)])
    finally:
        del store  # the last rank to let go removes the file
