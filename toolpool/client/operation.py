"""What a driver waits for, without I/O: an ``Operation`` says when it is done and
what came of it; a ``TurnCursor`` walks a turn's items; a ``Deferred`` is an
approval whose answer the driver must await. The connection makes all three."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from toolpool.client.core import ApprovalRequested, TurnItem, TurnLog
from toolpool.client.errors import ClientError, ClientTimeout

T = TypeVar("T")


class Link(Protocol):
    """What an operation asks of its connection: has it failed, and with what."""

    failure: ClientError | None


@dataclass(eq=False, slots=True)
class Operation(Generic[T]):
    """What a caller waits for. ``done()`` once it happened (``ready()``) or the
    connection failed; then ``outcome()`` is its value, or raises. A driver that
    waited ``timeout`` seconds (None: no limit) in vain raises ``expired()`` instead."""

    connection: Link
    ready: Callable[[], bool]
    value: Callable[[], T]
    timeout: float | None = None
    # What a timeout says (a ClientTimeout), or raises; or a function that makes it,
    # for a text that would be formatted in vain for each operation that does not expire.
    late: str | ClientError | Callable[[], str] = ""
    abandon: Callable[[], None] | None = None  # the connection forgets it

    def done(self) -> bool:
        return self.ready() or self.connection.failure is not None

    def outcome(self) -> T:
        if self.ready():
            return self.value()
        failure = self.connection.failure
        assert failure is not None, "outcome() of an operation that is not done"
        raise failure

    def expired(self) -> ClientError:
        """The error for a caller who gave up (``ClientTimeout`` unless ``late`` is
        an error); the connection forgets the request."""
        if self.abandon is not None:
            self.abandon()
        late = self.late() if callable(self.late) else self.late
        return late if isinstance(late, ClientError) else ClientTimeout(late)


@dataclass(frozen=True, slots=True)
class Deferred:
    """An approval whose handler returned an awaitable: the driver awaits ``decision``
    and hands its value to ``Connection.decide``."""

    item: ApprovalRequested
    decision: Awaitable[Any]


class TurnCursor:
    """Where one iteration of a turn stands. ``follow`` lets go of what it passed."""

    def __init__(self, connection: Link, log: TurnLog, follow: bool) -> None:
        self._connection = connection
        self._log = log
        self._follow = follow
        self.seen = log.first

    @property
    def finished(self) -> bool:
        return self._log.results is not None and self.seen == self._log.count

    def next(self) -> Operation[TurnItem]:
        """The next item, once it arrived."""
        return Operation(self._connection, lambda: self._log.count > self.seen, self._take)

    def _take(self) -> TurnItem:
        item = self._log.item(self.seen)
        self.seen += 1
        if self._follow:
            self._log.forget_before(self.seen)
        return item
