"""What the daemon keeps of each client and session, and the one control-flow
exception of request handling."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolpool.engine.gate import Gate
from toolpool.engine.session import Session
from toolpool.engine.turn import Turn
from toolpool.protocol import FailureCode

# A client is a ROUTER socket and the identity ZeroMQ gave its connection there.
Address = tuple[int, bytes]

SESSION_OPTIONS = {
    "extra_roots",
    "allow_network",
    "max_tool_errors",
    "limits",
    "gate",
    "policy",
    "approval_timeout",
    "max_tool_concurrency",
}


class BadRequest(Exception):  # internal control flow: becomes an Error reply
    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(eq=False)
class SessionEntry:
    session: Session
    owner: Address
    gate: Gate | None
    approval_timeout: float
    max_tool_concurrency: int | None
    turns: dict[str, Turn] = field(default_factory=dict)
    turn_of_call: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class ClientState:
    address: Address
    name: str
    sessions: set[str] = field(default_factory=set)
