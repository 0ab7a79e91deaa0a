"""How a call on a worker ends: its result, the worker's end under it, or — cancelled
or past its wall time — a ``Cancel`` (the worker raises the cancel signal for that
call), ``cancel_grace`` seconds for an answer, and the kill; a held call may also be
given back; and what each ending means for the worker's next call (``CallEnd``).
"""

from __future__ import annotations

import asyncio

from toolpool.cancel import CancelToken
from toolpool.pool.planner import CallEnd
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.workers import Escalation, Flight, OutcomeStatus, PoolOutcome, Worker
from toolpool.protocol import Cancel, Result
from toolpool.sandbox.limits import Limits


async def await_call(
    worker: Worker,
    flight: Flight,
    token: CancelToken,
    limits: Limits,
    cancel_grace: float,
    processes: WorkerProcesses,
) -> tuple[PoolOutcome, bool] | None:
    """The call's outcome, and whether the worker had to be told to stop it; None
    when the call never ran there and should run elsewhere: the worker gave it back,
    or died while it was held (only read-only calls are held: it may have started)."""
    # One future, woken by whichever comes first: the result, the worker's end,
    # a cancel, the wall time, the call's promotion or withdrawal (callbacks, not a
    # task per call: many may wait).
    fire = flight.fire
    worker.exited.add_done_callback(fire)
    try:
        untrack = token.on_cancel(fire)
        try:
            while flight.held and not (flight.is_withdrawn() or worker.exited.done()):
                if token.requested and not flight.cancel_sent:
                    _cancel(worker, flight, processes)
                await flight.wake
                flight.rearm()
            if flight.is_withdrawn() or (flight.held and worker.exited.done()):
                return _unstarted(token)
            # It runs: its wall time counts from now.
            timer = asyncio.get_running_loop().call_later(limits.wall_seconds, fire)
            try:
                if flight.result is None and not token.requested:
                    await flight.wake
            finally:
                timer.cancel()
        finally:
            untrack()
        if flight.result is not None:
            return answered(worker, flight.result), False
        if flight.is_withdrawn():  # the call before it left the worker unfit, or a cancel
            return _unstarted(token)
        if worker.exited.done():
            return lost(worker, limits), False
        # Cancelled, or past its wall time: a Cancel, which the worker turns into the
        # cancel signal for this call (D4); it has ``cancel_grace`` seconds to answer
        # (its result or its end wakes the flight again) before it is ended.
        past_wall_time = not token.requested
        if not flight.cancel_sent:
            _cancel(worker, flight, processes)
        flight.rearm()
        if flight.result is None and not flight.is_withdrawn() and not worker.exited.done():
            await asyncio.wait({flight.wake}, timeout=cancel_grace)
    finally:
        worker.exited.remove_done_callback(fire)
    late = flight.answered()  # a method: what the worker sent meanwhile
    if late is not None:
        outcome = answered(worker, late, Escalation.ANSWERED)
    elif flight.is_withdrawn():  # the Cancel reached it before it started
        return _unstarted(token)
    elif worker.exited.done():
        return lost(worker, limits), True
    else:
        why = "it ran past its wall time" if past_wall_time else "it did not stop when cancelled"
        await processes.terminate([worker], f"{why} and was killed")
        outcome = PoolOutcome(
            OutcomeStatus.CANCELLED,
            escalation=Escalation.KILLED,
            worker_id=worker.id,
            worker_pid=worker.pid,
        )
    return (overran(outcome, limits) if past_wall_time else outcome), True


def _unstarted(token: CancelToken) -> tuple[PoolOutcome, bool] | None:
    """A call that never started at this worker: cancelled, or to run elsewhere."""
    return (PoolOutcome(OutcomeStatus.UNSTARTED), False) if token.requested else None


def _cancel(worker: Worker, flight: Flight, processes: WorkerProcesses) -> None:
    """Tell the worker to stop this call, whether it runs it or holds it: on its
    control line, by ticket — never a signal that could reach the call after it."""
    flight.cancel_sent = True
    processes.send(worker, Cancel(flight.ticket), control=True)


def answered(worker: Worker, result: Result, escalation: Escalation | None = None) -> PoolOutcome:
    """The outcome of a call whose worker sent its ``Result``."""
    return PoolOutcome(
        OutcomeStatus(result.status.value),
        result.result,
        result.usage,
        result.stamps,
        escalation=escalation,
        worker_id=worker.id,
        worker_pid=worker.pid,
    )


def lost(worker: Worker, limits: Limits) -> PoolOutcome:
    """The outcome of a call whose worker ended under it."""
    exit_ = worker.exited.result()
    if exit_.oom:
        # The kernel's OOM killer ended the worker itself: the call met its memory
        # limit (X7), which is no crash of the worker.
        return PoolOutcome(
            OutcomeStatus.LIMIT,
            cause=f"memory limit (memory_bytes = {limits.memory_bytes})",
            worker_id=worker.id,
            worker_pid=worker.pid,
        )
    return PoolOutcome(
        OutcomeStatus.LOST, cause=exit_.describe(), worker_id=worker.id, worker_pid=worker.pid
    )


def overran(outcome: PoolOutcome, limits: Limits) -> PoolOutcome:
    """A call stopped because it ran past its wall time: a limit, however it ended."""
    if outcome.status not in (OutcomeStatus.CANCELLED, OutcomeStatus.ERROR):
        return outcome
    return PoolOutcome(
        OutcomeStatus.LIMIT,
        usage=outcome.usage,
        cause=f"wall time limit of {limits.wall_seconds:g} s",
        escalation=outcome.escalation,
        worker_id=outcome.worker_id,
        worker_pid=outcome.worker_pid,
    )


def call_end(outcome: PoolOutcome, stopped: bool) -> CallEnd:
    result = outcome.result or {}
    return CallEnd(
        stopped=stopped,
        cancelled=outcome.status is OutcomeStatus.CANCELLED,
        limit_exceeded=result.get("error_code") == "limit_exceeded",
        left_processes=bool(outcome.usage.get("ended_processes")),
    )
