"""Property tests of the scheduler (SPEC S2-S6, P12) over random turns.

Random turns of safe and unsafe calls, random durations, random concurrency limits,
random interrupt and abort times. Durations are event-loop ticks — a fake clock —
so thousands of turns run in seconds and every run is reproducible.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpool import ErrorCode, ToolEnd, ToolResult, ToolStart
from toolpool.engine import Coordinator, ExecutionRequest, Next, TurnScheduler

from .support import EventLog, Work, ticks, work_call


@dataclass(frozen=True)
class CallSpec:
    safe: bool
    duration: int
    cancel_on_interrupt: bool
    fail: bool


call_specs = st.builds(
    CallSpec,
    safe=st.booleans(),
    duration=st.integers(0, 8),
    cancel_on_interrupt=st.booleans(),
    fail=st.booleans(),
)
turns = st.lists(call_specs, max_size=10)
limits = st.integers(-1, 6)
# When to stop, in ticks from the start, and how: none, interrupt, abort, or both.
stops = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["interrupt", "abort", "interrupt+abort"]), st.integers(0, 40)),
)


class InvariantChecker:
    """Middleware that checks S2/S3 at the moment each execution begins."""

    def __init__(self, specs: list[CallSpec], limit: int) -> None:
        self.specs = specs
        self.limit = max(limit, 1)
        self.running: set[int] = set()
        self.entered: list[int] = []
        self.violations: list[str] = []

    async def __call__(self, request: ExecutionRequest, call_next: Next) -> ToolResult:
        i = int(request.call.id)
        if not self.specs[i].safe and self.running:
            self.violations.append(f"unsafe {i} started beside {sorted(self.running)}")
        if any(not self.specs[j].safe for j in self.running):
            self.violations.append(f"{i} started beside an unsafe call")
        self.running.add(i)
        self.entered.append(i)
        if len(self.running) > self.limit:
            self.violations.append(f"{len(self.running)} running, limit {self.limit}")
        try:
            return await call_next(request)
        finally:
            self.running.discard(i)


async def run_turn(
    specs: list[CallSpec], limit: int, stop: tuple[str, int] | None
) -> tuple[tuple[ToolResult, ...], EventLog, InvariantChecker, Work]:
    work = Work()
    checker = InvariantChecker(specs, limit)
    coordinator = Coordinator([work], middlewares=[checker], max_tool_concurrency=limit)
    with tempfile.TemporaryDirectory() as root:
        session = coordinator.open_session(root)
        calls = [
            work_call(
                str(i),
                s.duration,
                safe=s.safe,
                behavior="cancel" if s.cancel_on_interrupt else "block",
                fail=s.fail,
            )
            for i, s in enumerate(specs)
        ]
        log = EventLog()
        turn = coordinator.submit(session, calls, on_event=log)
        if stop is not None:
            how, at = stop
            await ticks(at)
            if "interrupt" in how:
                turn.interrupt()
            if "abort" in how:
                await ticks(1)
                turn.abort()
        results = await turn
    return results, log, checker, work


@pytest.mark.spec("S2", "S3", "S4", "S5", "S6", "P12")
@settings(max_examples=300, deadline=None)
@given(specs=turns, limit=limits, stop=stops)
def test_random_turns_keep_every_scheduling_invariant(
    specs: list[CallSpec], limit: int, stop: tuple[str, int] | None
) -> None:
    results, log, checker, work = asyncio.run(run_turn(specs, limit, stop))
    n = len(specs)

    # never an unsafe call beside another; never more than the limit running
    assert checker.violations == []
    # calls start in turn order (executions, and every tool_start)
    assert checker.entered == sorted(checker.entered)
    assert [int(e.call_id) for e in log.starts()] == list(range(n))
    # every call has exactly one start and one end event, start first
    for i in range(n):
        kinds = [e.type.value for e in log.of_call(str(i)) if isinstance(e, ToolStart | ToolEnd)]
        assert kinds == ["tool_start", "tool_end"]
    # results come back in call order, one per call, and the turn ends last
    assert [r.call_id for r in results] == [str(i) for i in range(n)]
    assert log.types[-1] == "turn_end"
    assert work.running == set()

    # each outcome has a cause that fits the call and the stop
    ran = set(checker.entered)
    how = stop[0] if stop else ""
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        match result.error_code:
            case ErrorCode.SKIPPED:  # S4: still queued at the interrupt
                assert "interrupt" in how
                assert i not in ran
            case ErrorCode.INTERRUPTED:  # S4: only "cancel" calls are cancelled
                assert "interrupt" in how
                assert spec.cancel_on_interrupt
            case ErrorCode.CANCELLED:  # S5
                assert "abort" in how
            case ErrorCode.BREAKER_OPEN:  # P2: three failures of "work" came first
                assert i not in ran
                assert sum(s.fail for s in specs[:i]) >= 3
            case ErrorCode.EXECUTION_FAILED:
                assert i in ran
                assert spec.fail
            case None:
                assert i in ran
                assert not spec.fail
            case other:
                raise AssertionError(f"unexpected {other}")
    if stop is None:
        assert ran | {i for i, r in enumerate(results) if r.error_code == "breaker_open"} == set(
            range(n)
        )


# --- the pure scheduler, against a discrete-event simulation ----------------------------


@pytest.mark.spec("S2", "S3", "S4", "S5")
@settings(max_examples=500, deadline=None)
@given(specs=turns, limit=limits, stop=stops)
def test_pure_scheduler_against_a_simulated_clock(
    specs: list[CallSpec], limit: int, stop: tuple[str, int] | None
) -> None:
    scheduler = TurnScheduler(
        [s.safe for s in specs], [s.cancel_on_interrupt for s in specs], limit
    )
    now = 0
    ends_at: dict[int, int] = {}
    starts: list[int] = []
    cancelled: set[int] = set()
    never_started: set[int] = set()
    stopped_at: int | None = None

    def start_ready() -> None:
        for i in scheduler.start_ready():
            assert stopped_at is None, "a call started after a stop"
            if not specs[i].safe:
                assert not ends_at, "unsafe call started beside others"
            assert all(specs[j].safe for j in ends_at), "call started beside an unsafe one"
            ends_at[i] = now + specs[i].duration
            starts.append(i)
            assert len(ends_at) <= max(limit, 1)

    def apply_stop(how: str) -> None:
        nonlocal stopped_at
        stopped_at = now
        for kind in how.split("+"):
            plan = scheduler.interrupt() if kind == "interrupt" else scheduler.abort()
            for i in plan.cancel:
                assert i in ends_at
                assert kind == "abort" or specs[i].cancel_on_interrupt
                cancelled.add(i)
                ends_at[i] = now  # a cancelled call ends at once
            never_started.update(plan.never_started)

    start_ready()
    while ends_at:
        if stop is not None and stopped_at is None and stop[1] <= min(ends_at.values()):
            now = max(now, stop[1])
            apply_stop(stop[0])
        now = min(ends_at.values())
        for i in [i for i, t in ends_at.items() if t == now]:
            del ends_at[i]
            scheduler.finish(i)
        start_ready()
    if stop is not None and stopped_at is None:
        apply_stop(stop[0])

    assert scheduler.done
    assert starts == sorted(starts)
    assert set(starts) | never_started == set(range(len(specs)))
    assert not set(starts) & never_started
    if stop is None:
        assert starts == list(range(len(specs)))


async def run_open_turn(
    first: list[CallSpec], later: list[tuple[int, CallSpec]], limit: int
) -> tuple[tuple[ToolResult, ...], EventLog, InvariantChecker]:
    specs = first + [spec for _, spec in later]
    work = Work()
    checker = InvariantChecker(specs, limit)
    coordinator = Coordinator([work], middlewares=[checker], max_tool_concurrency=limit)
    with tempfile.TemporaryDirectory() as root:
        session = coordinator.open_session(root)

        def call_for(i: int, s: CallSpec) -> Any:
            return work_call(str(i), s.duration, safe=s.safe, fail=s.fail)

        log = EventLog()
        turn = coordinator.submit(
            session, [call_for(i, s) for i, s in enumerate(first)], on_event=log, open=True
        )
        for offset, (delay, spec) in enumerate(later):
            await ticks(delay)
            turn.add([call_for(len(first) + offset, spec)])
        turn.close()
        results = await turn
    return results, log, checker


@pytest.mark.spec("S2", "S3", "S6", "P12")
@settings(max_examples=150, deadline=None)
@given(
    first=st.lists(call_specs, max_size=5),
    later=st.lists(st.tuples(st.integers(0, 10), call_specs), max_size=5),
    limit=limits,
)
def test_calls_added_to_an_open_turn_keep_the_invariants(
    first: list[CallSpec], later: list[tuple[int, CallSpec]], limit: int
) -> None:
    results, log, checker = asyncio.run(run_open_turn(first, later, limit))
    n = len(first) + len(later)
    assert checker.violations == []
    assert checker.entered == sorted(checker.entered)
    assert [r.call_id for r in results] == [str(i) for i in range(n)]
    assert [int(e.call_id) for e in log.starts()] == list(range(n))
    assert log.types[-1] == "turn_end"
