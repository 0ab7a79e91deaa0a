"""Stopping a call on its worker, which a cancel or a wall time in ``Dispatch``
(``dispatch.py``) sets going: a ``Cancel`` on the worker's control line, by
ticket (the worker turns it into the cancel signal for that call, SPEC D4), then
``cancel_grace`` seconds to answer before the worker is killed and replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from toolpool.pool.calls import killed, overran
from toolpool.pool.supervisor import Supervisor
from toolpool.pool.workers import Call, CallState, PoolConfig, PoolOutcome, Worker
from toolpool.protocol import Cancel

log = logging.getLogger("toolpool.pool")

_RUNNING, _STOPPING, _KILLING = CallState.RUNNING, CallState.STOPPING, CallState.KILLING


class CallStops:
    """The dispatch's stopping of calls: ``ran(worker, call, outcome)`` is the
    dispatch's, told when a killed call is over on its worker; ``kills`` are the kills
    under way (the dispatch's ``settle`` waits for them)."""

    def __init__(
        self,
        config: PoolConfig,
        supervisor: Supervisor,
        ran: Callable[[Worker, Call, PoolOutcome], None],
    ) -> None:
        self.config = config
        self.supervisor = supervisor
        self.ran = ran
        self.kills: set[asyncio.Future[Any]] = set()

    def send_cancel(self, call: Call, *, running: bool = True) -> None:
        """Tell the worker to stop this call, whether it runs it or holds it: on its
        control line, by ticket — never a signal that could reach the call after it."""
        assert call.worker is not None
        call.cancel_sent = call.cancel_sent or running
        self.supervisor.send(call.worker, Cancel(call.ticket, running=running), control=True)

    def stop(self, call: Call) -> None:
        """Cancelled, or past its wall time: a ``Cancel``, which the worker turns into
        the cancel signal for this call (D4); it has ``cancel_grace`` seconds to
        answer (its Result, or its end) before it is killed."""
        call.state = _STOPPING
        if call.timer is not None:
            call.timer.cancel()
        if not call.cancel_sent:
            self.send_cancel(call)
        loop = asyncio.get_running_loop()  # a callback's, or a call's that cancels
        call.timer = loop.call_later(self.config.cancel_grace, self._grace_over, call)

    def past_wall_time(self, call: Call) -> None:
        """The call's wall time is over (its timer's callback)."""
        call.timer = None
        if call.state is _RUNNING:
            call.past_wall_time = True
            self.stop(call)

    def _grace_over(self, call: Call) -> None:
        call.timer = None
        worker = call.worker
        if call.state is not _STOPPING or worker is None:
            return
        call.state = _KILLING
        why = "ran past its wall time" if call.past_wall_time else "did not stop when cancelled"
        kill = self.supervisor.terminate([worker], f"it {why} and was killed")
        self.kills.add(kill)
        kill.add_done_callback(lambda _: self._killed(call, worker, kill))

    def _killed(self, call: Call, worker: Worker, kill: asyncio.Future[Any]) -> None:
        self.kills.discard(kill)
        if not kill.cancelled() and kill.exception() is not None:
            log.error("ending worker %s failed: %s", worker.id, kill.exception())
        if call.state is not _KILLING:
            return  # its Result came meanwhile
        if call in worker.given:
            worker.given.remove(call)
        outcome = killed(worker)
        self.ran(worker, call, overran(outcome, call.limits) if call.past_wall_time else outcome)
