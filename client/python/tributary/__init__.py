"""Tributary's Python client.

`tributary._tributary` is the C++ client (sessions with the local agent, shared-memory buffers,
asynchronous collectives); `tributary.torch` is the PyTorch API built on it.
"""


class TributaryError(RuntimeError):
    """An error of a Tributary call. `code` names the status code (e.g. "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "UNAVAILABLE"); the message says what went wrong."""

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        return (type(self), (str(self), self.code))


class MembershipChanged(TributaryError):
    """The job's membership changed under a collective (code "ABORTED"): a process of the job
    was replaced (it died, or left, and a new one joined in its place), an agent of a worker node
    restarted, or an elastic job's worker nodes changed. Every process of the job gets it once
    per change, like Horovod's HostsUpdatedInterrupt. Catch it, call
    `tributary.torch.resync()` (rank and size may change) and restart the step from a sync
    point: broadcast the parameters from rank 0 and agree on the step."""


# Defined before the core module is imported: it raises TributaryError from C++.
from tributary._tributary import DTYPES, Client, Handle, SharedBuffer, dtype_size  # noqa: E402

__all__ = ["TributaryError", "MembershipChanged", "Client", "Handle", "SharedBuffer", "DTYPES", "dtype_size"]
