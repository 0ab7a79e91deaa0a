"""One turn: its calls run through the pipeline by the scheduler's rules (SPEC S, M).

The scheduler decides (turn order, safe fan-out, unsafe alone, what an interrupt or
abort stops); this module carries its decisions out with asyncio tasks, then turns
the results into tool messages (M1, M2) and ends with one ``turn_end`` event.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Coroutine, Generator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from toolpool.arguments import ArgumentCheck
from toolpool.cancel import CancelSource, CancelToken
from toolpool.engine.budget import turn_share
from toolpool.engine.gate import Gate
from toolpool.engine.hold import Hold
from toolpool.engine.pipeline import EventSink, Pipeline
from toolpool.engine.scheduler import CallState, StopPlan, TurnScheduler
from toolpool.engine.session import Session
from toolpool.models import (
    Event,
    MessageEnd,
    MessageStart,
    ToolCall,
    ToolMessage,
    ToolResult,
    TurnEnd,
)
from toolpool.outcomes import failed, never_started_result
from toolpool.session_options import OnError
from toolpool.tool import InterruptBehavior

log = logging.getLogger(__name__)


class TurnState(Enum):
    WAITING = "waiting"  # for the session's previous turn to end
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class CallPlan:
    """How the scheduler treats one call, decided once when the turn starts; and the
    call's P5 check, made for that and handed to the pipeline (not made twice)."""

    safe: bool
    cancel_on_interrupt: bool
    check: ArgumentCheck | None = None


def _guarded(emit: EventSink) -> EventSink:
    """An event sink whose failures are logged, never raised into the turn: a broken
    listener must not leave calls without their end events."""

    def guarded(event: Event) -> None:
        try:
            emit(event)
        except Exception:
            log.exception("event listener failed on %s", event.type.value)

    return guarded


class Turn:
    """A submitted turn. Await it (or ``results()``) for the results in call order.

    ``interrupt()`` and ``abort()`` may be called at any time from the event loop's
    thread, also before the turn has started or after it ended (then they do nothing).

    An *open* turn (``open=True``) takes more calls while it runs (``add``), queued at
    its tail under the same scheduling rules, and ends only after ``close()``: the
    shape of a connection whose calls arrive one by one (MCP). Any call of any turn
    can be cancelled alone (``cancel``).

    Each call's share of the session's output budget (L4) is fixed when the turn is
    submitted: ``turn_output_chars // n`` for the n calls of a closed turn, and for
    every call of an open turn, appended ones too, ``turn_output_chars // max(n, 4)``
    (``budget.turn_share``). Finishing order never changes a cut.

    While ``hold`` is on (the daemon's client stopped reading, L5) the turn starts no
    new calls; the ones running go on, and stops and cancels still end queued calls.
    """

    def __init__(
        self,
        calls: Sequence[ToolCall],
        *,
        session: Session,
        pipeline: Pipeline,
        max_tool_concurrency: int,
        emit: EventSink,
        gate: Gate | None = None,
        turn_id: str | None = None,
        open: bool = False,
        hold: Hold | None = None,
    ) -> None:
        ids = [c.id for c in calls]
        if len(set(ids)) != len(ids):
            raise ValueError("call ids within a turn must be unique")
        self.id = turn_id or os.urandom(6).hex()
        self.calls = list(calls)
        self.open = open
        self._closed = not open
        self._wake = asyncio.Event()  # calls were added, or the turn was closed
        self._cancel_first: dict[int, CancelSource] = {}  # cancelled before the start
        self.session = session
        # L4: fixed at submission, for the calls given now and any appended later.
        self.share = turn_share(session.turn_output_chars, len(self.calls), open=open)
        self._pipeline = pipeline
        self._max = max_tool_concurrency
        self._emit = _guarded(emit)
        self._gate = gate
        self._hold = hold
        self.state = TurnState.WAITING
        self._stop_requested: CancelSource | None = None  # a stop asked before the start
        self._scheduler: TurnScheduler | None = None
        self._tokens = [CancelToken() for _ in self.calls]
        self._results: list[ToolResult | None] = [None] * len(self.calls)
        self._task: asyncio.Task[tuple[ToolResult, ...]] | None = None
        self._plans: list[CallPlan] = []  # made when the turn starts
        self._cancels_siblings = session.on_error is OnError.CANCEL_SIBLINGS

    # -- control -------------------------------------------------------------------

    def start(self) -> Turn:
        """Schedule the turn on the running loop; it waits for the session's turn lock."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def interrupt(self) -> None:
        """S4: the user sent a new message — steering."""
        self._stop(CancelSource.INTERRUPT)

    def abort(self) -> None:
        """S5: the whole run is cancelled."""
        self._stop(CancelSource.ABORT)

    def _stop(self, source: CancelSource) -> None:
        if self.state is TurnState.DONE:
            return
        if self._scheduler is None:
            # Not started yet: remember the strongest request (abort beats interrupt).
            if self._stop_requested is not CancelSource.ABORT:
                self._stop_requested = source
            return
        plan = (
            self._scheduler.interrupt()
            if source is CancelSource.INTERRUPT
            else self._scheduler.abort()
        )
        self._carry_out(plan, source)

    def _carry_out(self, plan: StopPlan, source: CancelSource, cause: str | None = None) -> None:
        for i in plan.cancel:
            self._tokens[i].cancel(source, cause)
        for i in plan.never_started:
            call = self.calls[i]
            result = never_started_result(call, source, cause)
            self._results[i] = self._pipeline.end_unstarted(
                call, self.session, self._emit, result, share=self.share
            )
        self._wake.set()  # a held turn may have nothing left to wait for

    def add(self, calls: Sequence[ToolCall]) -> None:
        """Queue more calls at the tail of an open turn."""
        stopped = self._scheduler is not None and self._scheduler.statistics().stopped
        if self._closed or stopped or self.state is TurnState.DONE:
            raise ValueError("the turn is closed or stopped: it takes no new calls")
        ids = {c.id for c in self.calls}
        new_ids = [c.id for c in calls]
        if len(set(new_ids)) != len(new_ids) or ids & set(new_ids):
            raise ValueError("call ids within a turn must be unique")
        for call in calls:
            self.calls.append(call)
            self._tokens.append(CancelToken())
            self._results.append(None)
            if self._scheduler is not None:
                plan = self._plan(call)
                self._plans.append(plan)
                self._scheduler.add(plan.safe, plan.cancel_on_interrupt)
        self._wake.set()

    def cancel(self, call_id: str, source: CancelSource = CancelSource.INTERRUPT) -> None:
        """Stop one call: cancelled if it runs, ended unstarted if it is queued."""
        index = next((i for i, c in enumerate(self.calls) if c.id == call_id), None)
        if index is None:
            raise KeyError(f"no call {call_id!r} in turn {self.id}")
        if self._scheduler is None:
            self._cancel_first[index] = source
            return
        match self._scheduler.cancel_one(index):
            case CallState.RUNNING:
                self._tokens[index].cancel(source)
            case CallState.QUEUED:
                call = self.calls[index]
                result = never_started_result(call, source)
                self._results[index] = self._pipeline.end_unstarted(
                    call, self.session, self._emit, result, share=self.share
                )
                self._wake.set()
            case CallState.DONE:
                pass

    def close(self) -> None:
        """An open turn takes no more calls; it ends when the last one has."""
        self._closed = True
        self._wake.set()

    async def results(self) -> tuple[ToolResult, ...]:
        """Wait for the turn to end; the results in the turn's call order (S6)."""
        task = self.start()._task
        assert task is not None
        return await asyncio.shield(task)

    def __await__(self) -> Generator[Any, None, tuple[ToolResult, ...]]:
        return self.results().__await__()

    # -- running -------------------------------------------------------------------

    def _plan(self, call: ToolCall) -> CallPlan:
        spec = self._pipeline.registry.get(call.name)
        if spec is None:
            # An unknown tool ends at P4 without running anything: nothing to protect.
            return CallPlan(safe=True, cancel_on_interrupt=True)
        # Capabilities judge the arguments as the tool will see them (coerced, P5).
        given: Any = call.arguments  # a JSON object, unless a client sent something else
        if not isinstance(given, dict):
            args, _ = spec.checker.coerce(given)
            check = None
        else:
            check = spec.checker.check(call.arguments)
            args = check.arguments
        return CallPlan(
            safe=spec.concurrency_safe(args),
            cancel_on_interrupt=spec.interrupt_behavior(args) is InterruptBehavior.CANCEL,
            check=check,
        )

    async def _run(self) -> tuple[ToolResult, ...]:
        async with self.session.turn_lock:  # a session's turns run one after another
            self.state = TurnState.RUNNING
            plans = self._plans = [self._plan(c) for c in self.calls]
            self._scheduler = TurnScheduler(
                [p.safe for p in plans], [p.cancel_on_interrupt for p in plans], self._max
            )
            if self._stop_requested is not None:
                self._stop(self._stop_requested)
            for index, source in self._cancel_first.items():
                self.cancel(self.calls[index].id, source)
            cancelled_from_outside = await self._run_calls(self._scheduler)
            results = tuple(r for r in self._results if r is not None)
            assert len(results) == len(self.calls)
            for result in results:  # M1, M2
                message = ToolMessage.from_result(result)
                self._emit(MessageStart(message))
                self._emit(MessageEnd(message))
            self.state = TurnState.DONE
            self._emit(TurnEnd(results))
            if cancelled_from_outside:
                raise asyncio.CancelledError
            return results

    async def _run_calls(self, scheduler: TurnScheduler) -> bool:
        """Run every call to its end; True when our own task was cancelled meanwhile.

        Each call's task reports its end itself, as its last step, and wakes this loop
        (``_wake``, which ``add`` and ``close`` set too): one wake-up per event, not an
        ``asyncio.wait`` over every running task each time one of them ends.
        """
        running = 0
        tasks: set[asyncio.Future[None]] = set()  # referenced while they run
        ended: deque[tuple[int, ToolResult | BaseException]] = deque()

        async def call(index: int, work: Coroutine[Any, Any, ToolResult]) -> None:
            try:
                ended.append((index, await work))
            except BaseException as exc:  # the pipeline's bug, or the loop's shutdown
                ended.append((index, exc))  # raised in the turn, as the call's outcome
            self._wake.set()

        cancelled_from_outside = False
        unwatch = self._hold.watch(self._wake) if self._hold is not None else None
        while True:
            for i, work in self._start_ready(scheduler):
                task = asyncio.ensure_future(call(i, work))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                running += 1
            if ended:  # places freed: more calls may start now
                while ended:
                    i, outcome = ended.popleft()
                    if isinstance(outcome, BaseException):
                        raise outcome
                    self._results[i] = outcome
                    scheduler.finish(i)
                    running -= 1
                    if failed(outcome) and self._cancels_siblings and not scheduler.stopped:
                        # S7: the rest of the turn stops as on an interrupt.
                        stop = scheduler.interrupt()
                        self._carry_out(stop, CancelSource.SIBLING, self.calls[i].id)
                continue
            statistics = scheduler.statistics()
            if not running and (self._closed or statistics.stopped) and not statistics.queued:
                break
            self._wake.clear()
            try:
                await self._wake.wait()
            except asyncio.CancelledError:
                # Our own task was cancelled (shutdown): abort, so that every call
                # still ends with its events; the cancellation goes on after turn_end.
                cancelled_from_outside = True
                self.abort()
        if unwatch is not None:
            unwatch()
        return cancelled_from_outside

    def _start_ready(
        self, scheduler: TurnScheduler
    ) -> list[tuple[int, Coroutine[Any, Any, ToolResult]]]:
        """Start what the scheduler allows: P1-P3 now, the rest as coroutines to run. A
        call that a guard ends at once (P1, P2) frees its place at once, so ask again
        until nothing more starts."""
        started: list[tuple[int, Coroutine[Any, Any, ToolResult]]] = []
        if self._hold is not None and self._hold.on:
            return started
        while ready := scheduler.start_ready():
            for i in ready:
                begun = self._pipeline.begin(
                    self.calls[i],
                    self.session,
                    self._emit,
                    self._tokens[i],
                    gate=self._gate,
                    share=self.share,
                    check=self._plans[i].check,
                )
                if isinstance(begun, ToolResult):
                    self._results[i] = begun
                    scheduler.finish(i)
                else:
                    started.append((i, self._pipeline.complete(begun)))
        return started

    def __repr__(self) -> str:
        inner = repr(self._scheduler) if self._scheduler else f"{len(self.calls)} calls"
        return f"<Turn {self.id} {self.state.value} {inner}>"
