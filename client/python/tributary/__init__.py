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


# Defined before the core module is imported: it raises TributaryError from C++.
from tributary._tributary import DTYPES, Client, Handle, SharedBuffer, dtype_size  # noqa: E402

__all__ = ["TributaryError", "Client", "Handle", "SharedBuffer", "DTYPES", "dtype_size"]
