"""How a call on the pool ends: the outcomes of its result, of its worker's end under
it, of a kill after ``cancel_grace``, of a wall time overrun; and what each ending
means for the worker's next call (``CallEnd``).
"""

from __future__ import annotations

from toolpool.pool.planner import CallEnd
from toolpool.pool.workers import Escalation, OutcomeStatus, PoolOutcome, Worker
from toolpool.protocol import CallStatus, Result
from toolpool.sandbox.limits import Limits

# --- outcomes -----------------------------------------------------------------------

_STATUS = {
    CallStatus.OK: OutcomeStatus.OK,
    CallStatus.ERROR: OutcomeStatus.ERROR,
    CallStatus.CANCELLED: OutcomeStatus.CANCELLED,
    CallStatus.PREPARED: OutcomeStatus.PREPARED,
}
CLEAN_END = CallEnd()  # what most calls' ends are: nothing that bears on the next


def answered(worker: Worker, result: Result, escalation: Escalation | None = None) -> PoolOutcome:
    """The outcome of a call whose worker sent its ``Result``."""
    return PoolOutcome(
        _STATUS[result.status],
        result.result,
        result.usage,
        result.stamps,
        escalation=escalation,
        worker_id=worker.id,
        worker_pid=worker.pid,
    )


def lost(worker: Worker, limits: Limits) -> PoolOutcome:
    """The outcome of a call whose worker ended under it."""
    exit_ = worker.exit
    if exit_ is not None and exit_.oom:
        # The kernel's OOM killer ended the worker itself: the call met its memory
        # limit (X7), which is no crash of the worker.
        return PoolOutcome(
            OutcomeStatus.LIMIT,
            cause=f"memory limit (memory_bytes = {limits.memory_bytes})",
            worker_id=worker.id,
            worker_pid=worker.pid,
        )
    cause = exit_.describe() if exit_ is not None else worker.kill_reason or "it was lost"
    return PoolOutcome(OutcomeStatus.LOST, cause=cause, worker_id=worker.id, worker_pid=worker.pid)


def killed(worker: Worker) -> PoolOutcome:
    """The outcome of a stopped call whose worker was killed: it did not answer."""
    return PoolOutcome(
        OutcomeStatus.CANCELLED,
        escalation=Escalation.KILLED,
        worker_id=worker.id,
        worker_pid=worker.pid,
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


def unstarted() -> PoolOutcome:
    return PoolOutcome(OutcomeStatus.UNSTARTED)


def failed(why: str) -> PoolOutcome:
    """The pool cannot run the call: ``why``."""
    return PoolOutcome(OutcomeStatus.FAILED, cause=why)


def call_end(outcome: PoolOutcome, stopped: bool) -> CallEnd:
    """What the pool saw of a call's end that bears on its worker's next call."""
    result = outcome.result
    if (
        not stopped
        and outcome.status is OutcomeStatus.OK
        and not outcome.usage.get("ended_processes")
        and (result is None or result.get("error_code") is None)
    ):
        return CLEAN_END
    return CallEnd(
        stopped=stopped,
        cancelled=outcome.status is OutcomeStatus.CANCELLED,
        limit_exceeded=result is not None and result.get("error_code") == "limit_exceeded",
        left_processes=bool(outcome.usage.get("ended_processes")),
    )
