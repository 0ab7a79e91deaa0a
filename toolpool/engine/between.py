"""Work a session does between its turns (SPEC B6): a checkpoint at a turn's end, a
rewind, a fork, its changes out. Queued at the session as a turn is, it begins once
what was queued before it ended, and what is queued after it (the next turn) waits
for its end. No sockets, no processes: the work is a coroutine the daemon gives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from toolpool.engine.session import Session


class BetweenTurns:
    """``work`` run between a session's turns; ``done`` holds its outcome."""

    def __init__(self, session: Session, work: Callable[[], Awaitable[Any]]) -> None:
        self._session = session
        self._work = work
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    def queue(self, *, first: bool = False) -> BetweenTurns:
        """Queue it at its session: after every turn queued (or, ``first``, right
        after the running one, as a turn's checkpoint is)."""
        if first:
            self._session.follow(self)
        else:
            self._session.enqueue(self)
        return self

    def begin(self) -> None:
        """(``Session.enqueue``'s callback.) The work starts."""
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            outcome = await self._work()
        except BaseException as exc:
            self.done.set_exception(exc)
            self.done.exception()  # retrieved: whoever waits learns it from ``done``
        else:
            self.done.set_result(outcome)
        finally:
            self._session.dequeue(self)

    def __repr__(self) -> str:
        state = "done" if self.done.done() else "running" if self._task else "waiting"
        return f"<BetweenTurns {state} of session {self._session.id}>"
