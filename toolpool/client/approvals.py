"""A connection's approval requests (SPEC G4) routed to their sessions' handlers:
``on_approval``'s answer queued for the daemon, an awaitable one left to the driver
(``Deferred``), and every request filed in its turn's items. The part of
``Connection`` (``connection.py``, a base class: no layer between) that the daemon's
``ApprovalRequest`` frames set going.
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


class ApprovalRouting:
    """``Connection``'s approvals: its handlers by session id, its running turns."""

    failure: ClientError | None
    _handlers: dict[str, ApprovalHandler | None]
    _turns: dict[str, TurnLog]

    def _send(self, message: wire.Message) -> None:
        raise NotImplementedError  # the connection's: a frame out

    def _approval(self, message: wire.ApprovalRequest) -> list[Deferred]:
        item = ApprovalRequested(message, self._answer)
        handler = self._handlers.get(message.session_id)
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
        if self.failure is None:
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
        if self.failure is not None:
            raise self.failure
        self._send(reply)

    def _file(self, item: ApprovalRequested) -> None:
        log = self._turns.get(item.request.turn_id)
        if log is not None:
            log.add(item)
