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


def _agree_on_generation(store, group, rank, size):
    """Every process of the group at the same membership generation before its first collective.

    Processes that create their groups again (destroy_process_group, then init_process_group)
    join as replacements, one after another, and each replacement moves the job to a new
    membership generation: a process that joined before the last one, or whose agent has not yet
    heard of it, would run its first collective in an older generation and fail with a
    membership change. Each process publishes the generation it joined at on the group's
    rendezvous store (torch's PrefixStore for this group; get waits up to the store's timeout)
    and moves to the newest one.

    The keys carry how many groups this rank has created on this store under this prefix (every
    rank creates the same groups in the same order): a store that outlives destroy_process_group
    (a reused one, torchelastic's) keeps the previous round's keys, and torch names the next
    default group as it named the last one.
    """
    base = "tributary/%s/" % group.job
    round_ = store.add(base + "creates/" + str(rank), 1)
    prefix = base + "generation/%d/" % round_
    store.set(prefix + str(rank), str(group.generation))
    newest = max(int(store.get(prefix + str(r))) for r in range(size))
    if newest > group.generation:
        group.resync_to(newest)


def create(store, rank, size, timeout):
    """The backend's creator, as torch.distributed calls it: joins the job through the local agent
    and returns a ProcessGroupTributary. The agent and the controller do the rendezvous; `store`
    carries only each process's membership generation (_agree_on_generation); None skips that,
    for a caller outside torch.distributed whose processes already share a generation (another
    group of the same processes is alive). (rank, size) must be this process's global rank and
    the job's world size."""
    agent_address, job, local_rank, local_size = _environment()
    if isinstance(timeout, datetime.timedelta):
        timeout_s = timeout.total_seconds()
    else:
        timeout_s = float(timeout)
    group = ProcessGroupTributary.create(rank, size, agent_address, job, local_rank, local_size,
                                         timeout_s)
    if store is not None:
        _agree_on_generation(store, group, rank, size)
    return group


def _register():
    # register_backend asserts when the name is taken: registering once per process keeps a
    # second import (or importlib.reload) harmless.
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create)


_register()
