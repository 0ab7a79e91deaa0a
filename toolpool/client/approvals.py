"""A connection's approval requests (SPEC G4) routed to their sessions' handlers:
``on_approval``'s answer queued for the daemon, an awaitable one left to the driver
(``Deferred``), and every request filed in its turn's items. ``Connection``
(``connection.py``) holds one and hands it the daemon's ``ApprovalRequest`` frames.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from toolpool import protocol as wire
from toolpool.client.core import ApprovalRequested, TurnLog, decision
from toolpool.client.errors import ClientError
from toolpool.client.operation import Deferred

ApprovalHandler = Callable[[ApprovalRequested], Any]


class Approvals:
    """A connection's approvals: ``handlers`` by session id; ``turns``: the
    connection's running turns, by id; ``send``: a frame out; ``failure()``: why the
    connection failed, if it did (no answer is sent then)."""

    def __init__(
        self,
        turns: dict[str, TurnLog],
        send: Callable[[wire.Message], None],
        failure: Callable[[], ClientError | None],
    ) -> None:
        self.handlers: dict[str, ApprovalHandler | None] = {}
        self._turns = turns
        self._send = send
        self._failure = failure

    def request(self, message: wire.ApprovalRequest) -> list[Deferred]:
        """A request came: its handler asked (what it left to await returned)."""
        item = ApprovalRequested(message, self._answer)
        handler = self.handlers.get(message.session_id)
        if handler is None and message.kind == "network":
            # A connection waits in the proxy, maybe for a background shell no turn
            # follows: without a handler to ask, it is refused now, saying why (N6).
            self.decide(item, (False, "the session has no on_approval handler to ask"))
            return []
        if handler is None:
            self._file(item)  # the turn's reader answers it (or nobody, and it times out)
            return []
        value = handler(item)
        if inspect.isawaitable(value):
            return [Deferred(item, value)]
        self.decide(item, value)
        return []

    def decide(self, item: ApprovalRequested, value: Any) -> None:
        """An ``on_approval`` handler returned ``value`` (True, False or (allowed,
        reason)): the answer is queued, and the request joins its turn's items."""
        if self._failure() is None:
            allowed, reason, scope = decision(value)
            item._reply(allowed, reason, scope)  # nothing new when the handler answered
        self._file(item)

    def refuse(self, deferred: Deferred, reason: str) -> None:
        """A handler's awaitable that the driver cannot await: dropped, the call denied."""
        close = getattr(deferred.decision, "close", None)
        if callable(close):
            close()  # a coroutine that will not run says nothing about it
        self.decide(deferred.item, (False, reason))

    def _answer(self, reply: wire.ApprovalReply) -> None:
        failure = self._failure()
        if failure is not None:
            raise failure
        self._send(reply)

    def _file(self, item: ApprovalRequested) -> None:
        log = self._turns.get(item.request.turn_id)
        if log is not None:
            log.add(item)
