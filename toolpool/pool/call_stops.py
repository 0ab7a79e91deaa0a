"""Stopping a call on its worker, the part of ``Dispatch`` (``dispatch.py``) that a
cancel or a wall time sets going: a ``Cancel`` on the worker's control line, by
ticket (the worker turns it into the cancel signal for that call, SPEC D4), then
``cancel_grace`` seconds to answer before the worker is killed and replaced.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from toolpool.pool.calls import killed, overran
from toolpool.pool.supervisor import Supervisor
from toolpool.pool.workers import Call, CallState, PoolConfig, PoolOutcome, Worker
from toolpool.protocol import Cancel

log = logging.getLogger("toolpool.pool")

_RUNNING, _STOPPING, _KILLING = CallState.RUNNING, CallState.STOPPING, CallState.KILLING


class CallStops:
    """``Dispatch``'s stopping of calls (a base class: its methods are the dispatch's
    own, no layer between)."""

    config: PoolConfig
    supervisor: Supervisor
    loop: asyncio.AbstractEventLoop | None
    _background: set[asyncio.Future[Any]]

    def _ran(self, worker: Worker, call: Call, outcome: PoolOutcome, stopped: bool = True) -> None:
        raise NotImplementedError  # the dispatch's: the call is over on its worker

    def _send_cancel(self, call: Call, *, running: bool = True) -> None:
        """Tell the worker to stop this call, whether it runs it or holds it: on its
        control line, by ticket — never a signal that could reach the call after it."""
        assert call.worker is not None
        call.cancel_sent = call.cancel_sent or running
        self.supervisor.send(call.worker, Cancel(call.ticket, running=running), control=True)

    def _stop(self, call: Call) -> None:
        """Cancelled, or past its wall time: a ``Cancel``, which the worker turns into
        the cancel signal for this call (D4); it has ``cancel_grace`` seconds to
        answer (its Result, or its end) before it is killed."""
        assert self.loop is not None
        call.state = _STOPPING
        if call.timer is not None:
            call.timer.cancel()
        if not call.cancel_sent:
            self._send_cancel(call)
        call.timer = self.loop.call_later(self.config.cancel_grace, self._grace_over, call)

    def _past_wall_time(self, call: Call) -> None:
        call.timer = None
        if call.state is _RUNNING:
            call.past_wall_time = True
            self._stop(call)

    def _grace_over(self, call: Call) -> None:
        call.timer = None
        worker = call.worker
        if call.state is not _STOPPING or worker is None:
            return
        call.state = _KILLING
        why = "ran past its wall time" if call.past_wall_time else "did not stop when cancelled"
        kill = self.supervisor.terminate([worker], f"it {why} and was killed")
        self._background.add(kill)
        kill.add_done_callback(lambda _: self._killed(call, worker, kill))

    def _killed(self, call: Call, worker: Worker, kill: asyncio.Future[Any]) -> None:
        self._background.discard(kill)
        if not kill.cancelled() and kill.exception() is not None:
            log.error("ending worker %s failed: %s", worker.id, kill.exception())
        if call.state is not _KILLING:
            return  # its Result came meanwhile
        if call in worker.given:
            worker.given.remove(call)
        outcome = killed(worker)
        self._ran(worker, call, overran(outcome, call.limits) if call.past_wall_time else outcome)
