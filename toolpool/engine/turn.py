"""One turn: its calls run through the pipeline by the scheduler's rules (SPEC S, M).

The scheduler decides (turn order, safe fan-out, unsafe alone, what an interrupt or
abort stops); this module carries its decisions out, then turns the results into
tool messages (M1, M2) and ends with one ``turn_end`` event. A turn is a state
machine driven by callbacks — a call's end (``Pipeline.proceed``), an add, a close,
a stop, a hold's release — with no task of its own and none per call.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
from collections.abc import Callable, Generator, Sequence
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
from toolpool.registry import ToolSpec
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
    spec: ToolSpec | None = None  # the tool, looked up once


# Turn ids: unique in this process (a prefix drawn once, a count), without a system
# call per turn.
_ID_PREFIX = os.urandom(4).hex()
_TURN_NUMBERS = itertools.count(1)


def new_turn_id() -> str:
    return f"{_ID_PREFIX}{next(_TURN_NUMBERS):x}"


def discard(_: Event) -> None:
    """The event sink of a turn nobody listens to."""


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

    ``message_events=False``: the turn's ``message_start``/``message_end`` (M1, M2)
    are neither made nor emitted, for a listener that makes them itself (L2).

    While ``hold`` is on (the daemon's client stopped reading, L5) the turn starts no
    new calls; the ones running go on, and stops and cancels still end queued calls.

    A session's turns run one after another (``Session.enqueue``): a turn begins, in
    a callback of the loop, once the one before it has ended.
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
        message_events: bool = True,
    ) -> None:
        calls = session.named(calls)  # F17: Anthropic's names, in its profile's sessions
        ids = [c.id for c in calls]
        if len(set(ids)) != len(ids):
            raise ValueError("call ids within a turn must be unique")
        self.id = turn_id or new_turn_id()
        self.calls = list(calls)
        self.open = open
        self._closed = not open
        self._cancel_first: dict[int, CancelSource] = {}  # cancelled before the start
        self.session = session
        # L4: fixed at submission, for the calls given now and any appended later.
        self.share = turn_share(session.turn_output_chars, len(self.calls), open=open)
        self._pipeline = pipeline
        self._max = max_tool_concurrency
        self._emit = emit if emit is discard else _guarded(emit)
        # M1, M2: a listener that does not use the message events (the daemon: its
        # clients make them, L2) is not sent them, and they are not made.
        self._messages = message_events and emit is not discard
        self._gate = gate
        self._hold = hold
        self._unwatch: Callable[[], None] | None = None
        self.state = TurnState.WAITING
        self._stop_requested: CancelSource | None = None  # a stop asked before the start
        self._scheduler: TurnScheduler | None = None
        self._tokens = [CancelToken() for _ in self.calls]
        self._results: list[ToolResult | None] = [None] * len(self.calls)
        self._unended = len(self.calls)  # the calls whose result is still None
        self._queued = False
        self._outcome: tuple[ToolResult, ...] | BaseException | None = None
        # One future per waiter: a waiter cancelled is that waiter's business alone.
        self._waiters: list[asyncio.Future[tuple[ToolResult, ...]]] = []
        self._plans: list[CallPlan] = []  # made when the turn starts
        self._cancels_siblings = session.on_error is OnError.CANCEL_SIBLINGS
        self._running = 0
        self._pumping = False  # _pump is on the stack: a nested call asks it to go round
        self._again = False

    # -- control -------------------------------------------------------------------

    def start(self) -> Turn:
        """Queue the turn at its session; it begins once the turns before it ended."""
        if not self._queued:
            self._queued = True
            self.session.enqueue(self)
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
        self._maybe_end()

    def _carry_out(self, plan: StopPlan, source: CancelSource, cause: str | None = None) -> None:
        for i in plan.cancel:
            self._tokens[i].cancel(source, cause)
        for i in plan.never_started:
            self._end_unstarted(i, never_started_result(self.calls[i], source, cause))

    def _end_unstarted(self, index: int, result: ToolResult) -> None:
        self._result(
            index,
            self._pipeline.end_unstarted(
                self.calls[index], self.session, self._emit, result, share=self.share
            ),
        )

    def _result(self, index: int, result: ToolResult) -> None:
        if self._results[index] is None:
            self._unended -= 1
        self._results[index] = result

    def add(self, calls: Sequence[ToolCall]) -> None:
        """Queue more calls at the tail of an open turn."""
        stopped = self._scheduler is not None and self._scheduler.stopped
        if self._closed or stopped or self.state is TurnState.DONE:
            raise ValueError("the turn is closed or stopped: it takes no new calls")
        calls = self.session.named(calls)
        ids = {c.id for c in self.calls}
        new_ids = [c.id for c in calls]
        if len(set(new_ids)) != len(new_ids) or ids & set(new_ids):
            raise ValueError("call ids within a turn must be unique")
        for call in calls:
            self.calls.append(call)
            self._tokens.append(CancelToken())
            self._results.append(None)
            self._unended += 1
            if self._scheduler is not None:
                plan = self._plan(call)
                self._plans.append(plan)
                self._scheduler.add(plan.safe, plan.cancel_on_interrupt)
        if self._scheduler is not None:
            self._pump()

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
                self._end_unstarted(index, never_started_result(self.calls[index], source))
                self._pump()
            case CallState.DONE:
                pass

    def close(self) -> None:
        """An open turn takes no more calls; it ends when the last one has."""
        self._closed = True
        if self._scheduler is not None:
            self._maybe_end()

    async def results(self) -> tuple[ToolResult, ...]:
        """Wait for the turn to end; the results in the turn's call order (S6)."""
        self.start()
        outcome = self._outcome
        if outcome is None:
            waiter: asyncio.Future[tuple[ToolResult, ...]] = (
                asyncio.get_running_loop().create_future()
            )
            self._waiters.append(waiter)
            return await waiter
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def __await__(self) -> Generator[Any, None, tuple[ToolResult, ...]]:
        return self.results().__await__()

    # -- running -------------------------------------------------------------------

    def _plan(self, call: ToolCall) -> CallPlan:
        spec = self.session.tools.get(call.name)
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
        steady = spec.steady_plan  # the same for every call: not asked (T2)
        if steady is not None:
            return CallPlan(steady[0], steady[1], check, spec)
        return CallPlan(
            safe=spec.concurrency_safe(args),
            cancel_on_interrupt=spec.interrupt_behavior(args) is InterruptBehavior.CANCEL,
            check=check,
            spec=spec,
        )

    def begin(self) -> None:
        """(``Session.enqueue``'s callback.) The turn's calls are planned and the first
        of them started."""
        self.state = TurnState.RUNNING
        try:
            plans = self._plans = [self._plan(c) for c in self.calls]
            self._scheduler = TurnScheduler(
                [p.safe for p in plans], [p.cancel_on_interrupt for p in plans], self._max
            )
            if self._hold is not None:
                self._unwatch = self._hold.watch(self._pump)
            if self._stop_requested is not None:
                self._stop(self._stop_requested)
            for index, source in self._cancel_first.items():
                self.cancel(self.calls[index].id, source)
            self._pump()
        except Exception as exc:  # a bug in planning: the turn ends with it
            self._fail(exc)

    def _pump(self) -> None:
        """Start what the scheduler allows now: P1-P3 at once, the rest proceeds by
        callbacks. A call that a guard ends at once (P1, P2) frees its place at once,
        so ask again until nothing more starts; a call's end met on the way (an answer
        known at once) comes back here, and this goes round once more."""
        scheduler = self._scheduler
        if scheduler is None or self.state is TurnState.DONE:
            return
        if self._pumping:
            self._again = True
            return
        self._pumping = True
        try:
            while True:
                self._again = False
                if self._hold is None or not self._hold.on:
                    while ready := scheduler.start_ready():
                        for i in ready:
                            self._start(i)
                if not self._again:
                    break
        except Exception as exc:  # a bug in the pipeline: the turn ends with it
            self._fail(exc)
            return
        finally:
            self._pumping = False
        self._maybe_end()

    def _start(self, index: int) -> None:
        plan = self._plans[index]
        begun = self._pipeline.begin(
            self.calls[index],
            self.session,
            self._emit,
            self._tokens[index],
            gate=self._gate,
            share=self.share,
            check=plan.check,
            spec=plan.spec,
        )
        if isinstance(begun, ToolResult):
            self._result(index, begun)
            self._scheduler.finish(index)  # type: ignore[union-attr]
            return
        self._running += 1
        self._pipeline.proceed(begun, functools.partial(self._ended, index))

    def _ended(self, index: int, result: ToolResult) -> None:
        """A started call's ``tool_end`` is out: its place is free."""
        scheduler = self._scheduler
        assert scheduler is not None
        self._result(index, result)
        scheduler.finish(index)
        self._running -= 1
        if self._cancels_siblings and failed(result) and not scheduler.stopped:
            # S7: the rest of the turn stops as on an interrupt.
            stop = scheduler.interrupt()
            self._carry_out(stop, CancelSource.SIBLING, self.calls[index].id)
        self._pump()

    def _maybe_end(self) -> None:
        """The turn's end, once nothing runs, nothing waits and no call may come."""
        scheduler = self._scheduler
        if scheduler is None or self.state is TurnState.DONE or self._pumping:
            return
        if self._running or not (self._closed or scheduler.stopped):
            return
        if self._unended:
            return  # queued calls of a held turn wait for the release
        results = tuple(r for r in self._results if r is not None)
        if self._messages:
            for result in results:  # M1, M2
                message = ToolMessage.from_result(result)
                self._emit(MessageStart(message))
                self._emit(MessageEnd(message))
        self.state = TurnState.DONE
        self._emit(TurnEnd(results))
        self._finished(results)

    def _fail(self, exc: BaseException) -> None:
        log.error("turn %s broke: %s", self.id, exc, exc_info=exc)
        self.state = TurnState.DONE
        self._finished(exc)

    def _finished(self, outcome: tuple[ToolResult, ...] | BaseException) -> None:
        self._outcome = outcome
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self.session.dequeue(self)
        for waiter in self._waiters:
            if not waiter.done():
                if isinstance(outcome, BaseException):
                    waiter.set_exception(outcome)
                else:
                    waiter.set_result(outcome)
        self._waiters.clear()

    def __repr__(self) -> str:
        inner = repr(self._scheduler) if self._scheduler else f"{len(self.calls)} calls"
        return f"<Turn {self.id} {self.state.value} {inner}>"
