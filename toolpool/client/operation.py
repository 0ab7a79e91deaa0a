"""What a driver waits for, without I/O: an ``Operation`` says when it is done and
what came of it; a ``TurnCursor`` walks a turn's items; a ``Deferred`` is an
approval whose answer the driver must await. The connection makes all three.

Each kind of wait is a small class of its own rather than an operation made of
closures: a turn's submit, its end and each item iterated are one each, and a
closure's cells, a lambda's call and a dataclass's fields cost more than the wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from toolpool.client.core import ApprovalRequested, TurnItem, TurnLog
from toolpool.client.errors import ClientError, ClientTimeout
from toolpool.models import ToolResult

T = TypeVar("T")


class Link(Protocol):
    """What an operation asks of its connection: has it failed, and with what."""

    failure: ClientError | None


class Operation(Generic[T]):
    """What a caller waits for. ``done()`` once it happened (``ready()``) or the
    connection failed; then ``outcome()`` is its value, or raises. A driver that
    waited ``timeout`` seconds (None: no limit) in vain raises ``expired()`` instead."""

    __slots__ = ("connection", "timeout")

    def __init__(self, connection: Link, timeout: float | None = None) -> None:
        self.connection = connection
        self.timeout = timeout

    def ready(self) -> bool:
        """It happened: ``value()`` may be taken."""
        raise NotImplementedError

    def value(self) -> T:
        raise NotImplementedError

    def late(self) -> str | ClientError:
        """What a timeout says (a ClientTimeout's text), or the error it is."""
        return "the daemon did not answer in time"

    def abandon(self) -> None:
        """The caller gave up: the connection forgets what it kept for it."""

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
        self.abandon()
        late = self.late()
        return late if isinstance(late, ClientError) else ClientTimeout(late)


class Replies(Link, Protocol):
    """What a request's answer asks of its connection."""

    replies: dict[str, Any]  # the replies that came and were not taken, by request id

    def take_reply(self, request_id: str) -> Any:
        """The reply, taken; RequestFailed when it is the daemon's refusal."""

    def forget(self, request_id: str) -> None:
        """Nobody waits for the reply any more."""


class Answer(Operation[T]):
    """A request's answer: done once its reply came; its value is what ``finish``
    makes of it, or the daemon's refusal (``RequestFailed``)."""

    __slots__ = ("_finish", "_late", "_owner", "_request_id")

    def __init__(
        self,
        owner: Replies,
        request_id: str,
        finish: Callable[[Any], T],
        timeout: float,
        late: str | ClientError = "",
    ) -> None:
        self.connection = self._owner = owner
        self.timeout = timeout
        self._request_id = request_id
        self._finish = finish
        self._late = late

    def done(self) -> bool:
        owner = self._owner
        return self._request_id in owner.replies or owner.failure is not None

    def ready(self) -> bool:
        return self._request_id in self._owner.replies

    def value(self) -> T:
        return self._finish(self._owner.take_reply(self._request_id))

    def outcome(self) -> T:
        owner = self._owner
        if self._request_id in owner.replies:  # ready(): inline, as in done()
            return self._finish(owner.take_reply(self._request_id))
        return super().outcome()

    def late(self) -> str | ClientError:
        return self._late or f"no answer from the daemon within {self.timeout:g} s"

    def abandon(self) -> None:
        self._owner.forget(self._request_id)


class Condition(Operation[T]):
    """An operation of a condition and a value (``Connection.close_session`` on a
    connection that is gone: done at once, nothing to wait for)."""

    __slots__ = ("_ready", "_value")

    def __init__(self, connection: Link, ready: Callable[[], bool], value: Callable[[], T]) -> None:
        super().__init__(connection)
        self._ready = ready
        self._value = value

    def ready(self) -> bool:
        return self._ready()

    def value(self) -> T:
        return self._value()


class TurnEnded(Operation[tuple[ToolResult, ...]]):
    """A turn's end: its results, in call order."""

    __slots__ = ("_log",)

    def __init__(self, connection: Link, log: TurnLog, timeout: float | None) -> None:
        super().__init__(connection, timeout)
        self._log = log

    def done(self) -> bool:
        return self._log.results is not None or self.connection.failure is not None

    def ready(self) -> bool:
        return self._log.results is not None

    def value(self) -> tuple[ToolResult, ...]:
        results = self._log.results
        assert results is not None
        return results

    def outcome(self) -> tuple[ToolResult, ...]:
        results = self._log.results
        return super().outcome() if results is None else results

    def late(self) -> str:
        return f"the turn did not end within {self.timeout or 0:g} s"


class CallEnded(Operation[ToolResult]):
    """One call's end: its result."""

    __slots__ = ("_call_id", "_log")

    def __init__(self, connection: Link, log: TurnLog, call_id: str, timeout: float | None):
        super().__init__(connection, timeout)
        self._log = log
        self._call_id = call_id

    def ready(self) -> bool:
        return self._call_id in self._log.ended

    def value(self) -> ToolResult:
        return self._log.ended[self._call_id]

    def late(self) -> str:
        return f"call {self._call_id} did not end within {self.timeout or 0:g} s"


@dataclass(frozen=True, slots=True)
class Deferred:
    """An approval whose handler returned an awaitable: the driver awaits ``decision``
    and hands its value to ``Connection.decide``."""

    item: ApprovalRequested
    decision: Awaitable[Any]


class TurnCursor(Operation[TurnItem]):
    """Where one iteration of a turn stands; the operation of its next item, which
    ``next()`` returns (itself: one cursor, however many items). ``follow`` lets
    go of what it passed."""

    __slots__ = ("_follow", "_log", "seen")

    def __init__(self, connection: Link, log: TurnLog, follow: bool) -> None:
        super().__init__(connection)
        self._log = log
        self._follow = follow
        self.seen = log.first

    @property
    def finished(self) -> bool:
        return self._log.results is not None and self.seen == self._log.count

    def next(self) -> Operation[TurnItem]:
        """The next item, once it arrived."""
        return self

    def ready(self) -> bool:
        return self._log.count > self.seen

    def value(self) -> TurnItem:
        item = self._log.item(self.seen)
        self.seen += 1
        if self._follow:
            self._log.forget_before(self.seen)
        return item
