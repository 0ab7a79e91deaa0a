"""MCP bridges (``toolpool.mcp.bridge``): a bridge process holds the session with one
imported MCP server. It tells the daemon over its stdout what the server offers
(``BridgeReady``, a length-prefixed frame); workers running the server's proxy tools
talk to it over a ZeroMQ socket in the daemon's runtime directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolpool.protocol.kinds import MessageType


@dataclass(frozen=True, slots=True)
class BridgeReady:
    """Bridge → daemon, once, as a length-prefixed frame on its stdout: the server's
    tools (MCP ``Tool`` definitions as the server gave them), or ``error`` saying why
    the bridge could not connect. No answer; the daemon closes the bridge's stdin to
    stop it."""

    type: ClassVar[MessageType] = MessageType.BRIDGE_READY
    server: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True, slots=True)
class McpCall:
    """Worker → bridge: call the server's tool ``tool`` (its own, unprefixed name).

    Answer: any number of ``McpProgress``, then exactly one ``McpResult`` with the same
    ``call_id``, also when ``McpCancel`` stops it early.
    """

    type: ClassVar[MessageType] = MessageType.MCP_CALL
    call_id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class McpProgress:
    """Bridge → worker: the server reported progress of a call (an MCP progress
    notification). No answer."""

    type: ClassVar[MessageType] = MessageType.MCP_PROGRESS
    call_id: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class McpResult:
    """Bridge → worker: the call is over. ``content`` holds MCP content blocks (text,
    image…); ``is_error`` is the server's ``isError``, or true when the call failed on
    the way (the server crashed, hung up or refused the request: ``content`` says
    so). No answer."""

    type: ClassVar[MessageType] = MessageType.MCP_RESULT
    call_id: str
    content: list[dict[str, Any]]
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class McpCancel:
    """Worker → bridge: the call was cancelled (interrupt, abort, wall time); the
    bridge cancels the MCP request. Answer: the call's ``McpResult`` (an error saying
    "Cancelled.", unless the server's answer was already on its way)."""

    type: ClassVar[MessageType] = MessageType.MCP_CANCEL
    call_id: str
