"""The torch.distributed backend "tributary".

Importing this module registers the backend, so that unmodified code can run on Tributary::

    import tributary.distributed  # noqa: F401  (registers the "tributary" backend)
    torch.distributed.init_process_group("tributary")
    model = torch.nn.parallel.DistributedDataParallel(model)

The processes must be started by the launcher (``build/bin/tributary-run``), which sets the
environment read here: ``TRIBUTARY_AGENT_ADDRESS``, ``TRIBUTARY_JOB``, ``TRIBUTARY_LOCAL_RANK``,
``TRIBUTARY_LOCAL_SIZE`` (and the torchrun variables ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` that ``init_process_group``'s env:// rendezvous reads). See
client/python/c10d/README.md.
"""

import datetime
import os

import torch.distributed as dist

from tributary import _c10d

BACKEND_NAME = "tributary"

ProcessGroupTributary = _c10d.ProcessGroupTributary

_ENVIRONMENT = ("TRIBUTARY_AGENT_ADDRESS", "TRIBUTARY_JOB", "TRIBUTARY_LOCAL_RANK",
                "TRIBUTARY_LOCAL_SIZE")


def _environment():
    missing = [name for name in _ENVIRONMENT if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            "tributary backend: %s not set; start the processes with build/bin/tributary-run "
            "(or set %s to the local agent's address, the job id and this process's local "
            "rank and processes per node)" % (", ".join(missing), ", ".join(_ENVIRONMENT)))
    values = {}
    for name in ("TRIBUTARY_LOCAL_RANK", "TRIBUTARY_LOCAL_SIZE"):
        try:
            values[name] = int(os.environ[name])
        except ValueError:
            raise RuntimeError("tributary backend: %s=%r is not an integer"
                               % (name, os.environ[name])) from None
    return (os.environ["TRIBUTARY_AGENT_ADDRESS"], os.environ["TRIBUTARY_JOB"],
            values["TRIBUTARY_LOCAL_RANK"], values["TRIBUTARY_LOCAL_SIZE"])


def create(store, rank, size, timeout):
    """The backend's creator, as torch.distributed calls it: joins the job through the local agent
    and returns a ProcessGroupTributary. `store` is not used (the agent and the controller do the
    rendezvous); (rank, size) must be this process's global rank and the job's world size."""
    agent_address, job, local_rank, local_size = _environment()
    if isinstance(timeout, datetime.timedelta):
        timeout_s = timeout.total_seconds()
    else:
        timeout_s = float(timeout)
    return ProcessGroupTributary.create(rank, size, agent_address, job, local_rank, local_size,
                                        timeout_s)


def _register():
    # register_backend asserts when the name is taken: registering once per process keeps a
    # second import (or importlib.reload) harmless.
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create)


_register()
