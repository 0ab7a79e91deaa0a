"""How a call on a worker ends: its result, the worker's end under it, or — cancelled
or past its wall time — the cancel signal, ``cancel_grace`` seconds for an answer,
and the kill; and what each ending means for the worker's next call (``CallEnd``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from toolpool.cancel import CancelToken
from toolpool.pool.planner import CallEnd
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.workers import Escalation, Flight, OutcomeStatus, PoolOutcome, Worker
from toolpool.protocol import Result
from toolpool.sandbox.limits import Limits


async def await_call(
    worker: Worker,
    flight: Flight,
    token: CancelToken,
    limits: Limits,
    cancel_grace: float,
    processes: WorkerProcesses,
) -> tuple[PoolOutcome, bool]:
    """The call's outcome, and whether the worker had to be told to stop it."""
    # One future, woken by whichever comes first: the result, the worker's end,
    # a cancel, or the wall time (callbacks, not a task per call: many may wait).
    fire = flight.fire
    worker.exited.add_done_callback(fire)
    try:
        untrack = token.on_cancel(fire)
        timer = asyncio.get_running_loop().call_later(limits.wall_seconds, fire)
        try:
            await flight.wake
        finally:
            timer.cancel()
            untrack()
        if flight.result is not None:
            return answered(worker, flight.result), False
        if worker.exited.done():
            return lost(worker, limits), False
        # Cancelled, or past its wall time: SIGTERM is the cancel signal, which the
        # worker turns into a cancel of the tool (D4); it has ``cancel_grace`` seconds
        # to answer (its result or its end wakes the flight again) before it is ended.
        past_wall_time = not token.requested
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)
        flight.rearm()
        if flight.result is None and not worker.exited.done():
            await asyncio.wait({flight.wake}, timeout=cancel_grace)
    finally:
        worker.exited.remove_done_callback(fire)
    late = flight.answered()  # a method: what the worker sent meanwhile
    if late is not None:
        outcome = answered(worker, late, Escalation.ANSWERED)
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
