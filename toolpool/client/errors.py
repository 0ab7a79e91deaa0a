"""What the client library raises: transport problems only. A tool's failure is a
result (``ToolResult.is_error``), never an exception."""

from __future__ import annotations

from toolpool.errors import ToolpoolError
from toolpool.runtime import RuntimeDirError


class ClientError(ToolpoolError):
    """Base of every client-side error."""


class DaemonUnavailable(ClientError):
    """No daemon answers at the endpoint (not started, stopped, or not reachable)."""


class UntrustedEndpoint(ClientError, RuntimeDirError):
    """The runtime directory, its endpoint file or the socket it names is not the
    user's own or may be written by others (SPEC X10): the client did not connect."""


class ClientTimeout(ClientError, TimeoutError):
    """The daemon did not answer a request in time."""


class ClientProtocolError(ClientError):
    """The daemon sent something this client cannot read, or speaks another version."""


class RequestFailed(ClientError):
    """The daemon refused a request (unknown session, bad options, shutting down…)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


class ShippingError(ClientError):
    """A session tool cannot be shipped (SPEC A5): it is no function, an option the
    daemon decides on is a function, or something it holds cannot be pickled. The
    message names the tool and what stands in the way; nothing was sent."""
