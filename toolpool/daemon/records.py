"""What the daemon keeps of each client and session, and the one control-flow
exception of request handling."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolpool.daemon.outbox import Outbox
from toolpool.engine.between import BetweenTurns
from toolpool.engine.gate import Gate
from toolpool.engine.hold import Hold
from toolpool.engine.session import Session
from toolpool.engine.turn import Turn
from toolpool.pool import Binding
from toolpool.protocol import FailureCode
from toolpool.session_options import SessionOptions

# A client is a ROUTER socket and the identity ZeroMQ gave its connection there.
Address = tuple[int, bytes]


class BadRequest(Exception):  # internal control flow: becomes an Error reply
    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(eq=False)
class SessionEntry:
    """A session of a client's: its engine session, the options it was opened with
    (the gate's too, which the daemon carries out), its turns, and what it does
    between them (``between``: checkpoints, rewinds, forks, B6)."""

    session: Session
    owner: Address
    gate: Gate | None
    approval_timeout: float
    options: SessionOptions = field(default_factory=SessionOptions)
    turns: dict[str, Turn] = field(default_factory=dict)
    turn_of_call: dict[str, str] = field(default_factory=dict)
    between: set[BetweenTurns] = field(default_factory=set)
    checkpoints: bool = False  # a turn's end is a checkpoint (B1)
    binding: Binding | None = None  # the pool's side of its shipped tools (SPEC A6)


@dataclass(eq=False)
class ClientState:
    """A client that said hello: its sessions, what is on its way to it, and the
    hold its turns obey while it does not read (L5)."""

    address: Address
    name: str
    outbox: Outbox
    sessions: set[str] = field(default_factory=set)
    hold: Hold = field(default_factory=Hold)
