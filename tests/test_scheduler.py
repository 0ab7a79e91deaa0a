"""SPEC S1-S6: scheduling the calls of one turn; sessions run turns one at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from toolpool import ErrorCode, ToolCall, ToolContext, ToolResult, tool
from toolpool.engine import Coordinator, ExecutionRequest, Next, Session, TurnScheduler

from .support import EventLog, Work, ids, ticks, work_call


class Timeline:
    """Middleware that records when each call's execution starts and ends, in
    event-loop steps: the intervals tests compare."""

    def __init__(self) -> None:
        self.now = 0
        self.spans: dict[str, list[int]] = {}
        self.order: list[str] = []

    async def __call__(self, request: ExecutionRequest, call_next: Next) -> ToolResult:
        self.now += 1
        self.spans[request.call.id] = [self.now, -1]
        self.order.append(request.call.id)
        result = await call_next(request)
        self.now += 1
        self.spans[request.call.id][1] = self.now
        return result

    def overlap(self, a: str, b: str) -> bool:
        (a0, a1), (b0, b1) = self.spans[a], self.spans[b]
        return a0 < b1 and b0 < a1


def setup(workspace: Path, limit: int = 10) -> tuple[Coordinator, Session, Timeline, Work]:
    work = Work()
    timeline = Timeline()
    coordinator = Coordinator([work], middlewares=[timeline], max_tool_concurrency=limit)
    return coordinator, coordinator.open_session(workspace), timeline, work


# --- S1 --------------------------------------------------------------------------------


@pytest.mark.spec("S1")
@pytest.mark.parametrize(
    ("read_only", "concurrency_safe", "safe"),
    [
        (False, None, False),  # neither: unsafe
        (True, None, True),  # read_only alone decides
        (True, False, False),  # concurrency_safe overrides read_only
        (False, True, True),
    ],
)
async def test_S1_safety_comes_from_concurrency_safe_then_read_only(
    workspace: Path, read_only: bool, concurrency_safe: bool | None, safe: bool
) -> None:
    running: set[str] = set()
    overlapped: list[bool] = []

    @tool(read_only=read_only, concurrency_safe=concurrency_safe)
    async def job(ctx: ToolContext) -> str:
        """A job."""
        running.add(ctx.call_id)
        await ticks(3)
        overlapped.append(len(running) > 1)
        running.discard(ctx.call_id)
        return "ok"

    coordinator = Coordinator([job])
    session = coordinator.open_session(workspace)
    await coordinator.run_turn(session, [ToolCall(str(i), "job", {}) for i in range(3)])
    assert any(overlapped) is safe


@pytest.mark.spec("S1")
async def test_S1_decided_per_call_from_coerced_arguments(workspace: Path) -> None:
    coordinator, session, timeline, _ = setup(workspace)
    calls = [
        ToolCall("a", "work", {"ticks": 3, "safe": "true"}),  # coerced: safe
        ToolCall("b", "work", {"ticks": 3, "safe": True}),
        ToolCall("c", "work", {"ticks": 3, "safe": False}),
    ]
    await coordinator.run_turn(session, calls)
    assert timeline.overlap("a", "b")
    assert not timeline.overlap("b", "c")


# --- S2, S3 -------------------------------------------------------------------------------


@pytest.mark.spec("S2")
async def test_S2_safe_fan_out_unsafe_alone_in_turn_order(workspace: Path) -> None:
    coordinator, session, timeline, _ = setup(workspace)
    calls = [
        work_call("r1", 4),
        work_call("r2", 2),
        work_call("w", 2, safe=False),
        work_call("r3", 1),
        work_call("r4", 1),
    ]
    await coordinator.run_turn(session, calls)
    assert timeline.order == ["r1", "r2", "w", "r3", "r4"]
    assert timeline.overlap("r1", "r2") and timeline.overlap("r3", "r4")
    for other in ("r1", "r2", "r3", "r4"):
        assert not timeline.overlap("w", other)
    # the unsafe call waited for both reads, and the reads behind it waited for it
    assert timeline.spans["w"][0] > max(timeline.spans["r1"][1], timeline.spans["r2"][1])
    assert min(timeline.spans["r3"][0], timeline.spans["r4"][0]) > timeline.spans["w"][1]


@pytest.mark.spec("S2")
async def test_S2_head_of_line_is_not_reordered(workspace: Path) -> None:
    # Given a long unsafe call first, then short safe ones
    coordinator, session, timeline, _ = setup(workspace)
    calls = [work_call("w", 5, safe=False), work_call("r1", 1), work_call("r2", 1)]
    await coordinator.run_turn(session, calls)
    # Then nothing overtakes it
    assert timeline.order == ["w", "r1", "r2"]
    assert timeline.spans["r1"][0] > timeline.spans["w"][1]


@pytest.mark.spec("S2")
async def test_S2_safe_calls_fan_out_up_to_the_limit(workspace: Path) -> None:
    coordinator, session, _, work = setup(workspace, limit=3)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(work.running))
            await asyncio.sleep(0)

    watcher = asyncio.ensure_future(watch())
    await coordinator.run_turn(session, [work_call(str(i), 5) for i in range(8)])
    watcher.cancel()
    assert peak == 3


@pytest.mark.spec("S3")
@pytest.mark.parametrize("limit", [1, 0, -1])
async def test_S3_limit_of_one_or_less_is_serial(workspace: Path, limit: int) -> None:
    coordinator, session, timeline, _ = setup(workspace, limit=limit)
    calls = [work_call(str(i), 3) for i in range(4)]
    await coordinator.run_turn(session, calls)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not timeline.overlap(str(a), str(b))
    assert timeline.order == ["0", "1", "2", "3"]


# --- S4, S5 -------------------------------------------------------------------------------


@pytest.mark.spec("S4")
async def test_S4_interrupt_cancels_cancel_calls_lets_block_calls_finish_skips_queued(
    workspace: Path,
) -> None:
    coordinator, session, _, work = setup(workspace)
    calls = [
        work_call("cancel-me", 1000, behavior="cancel"),
        work_call("let-me-finish", 50, behavior="block"),
        work_call("queued-unsafe", 1, safe=False),
        work_call("queued-safe", 1),
    ]
    log = EventLog()
    turn = coordinator.submit(session, calls, on_event=log)
    await ticks(5)
    turn.interrupt()
    results = await turn
    by_id = {r.call_id: r for r in results}
    assert by_id["cancel-me"].error_code is ErrorCode.INTERRUPTED
    assert by_id["cancel-me"].text == "Tool execution interrupted by a queued user message."
    assert not by_id["let-me-finish"].is_error
    for queued in ("queued-unsafe", "queued-safe"):
        assert by_id[queued].error_code is ErrorCode.SKIPPED
        assert by_id[queued].text == "Skipped due to queued user message."
    assert work.started == ["cancel-me", "let-me-finish"]
    # skipped calls still get their pair of events (P12), and are not counted
    assert [e.type.value for e in log.of_call("queued-safe")] == ["tool_start", "tool_end"]
    assert session.breaker.failures("work") == 0


@pytest.mark.spec("S5")
async def test_S5_abort_cancels_everything_in_flight_and_queued(workspace: Path) -> None:
    coordinator, session, _, work = setup(workspace)
    calls = [
        work_call("block", 1000, behavior="block"),
        work_call("cancel", 1000, behavior="cancel"),
        work_call("queued", 1, safe=False),
    ]
    turn = coordinator.submit(session, calls)
    await ticks(5)
    turn.abort()
    results = await turn
    assert [r.text for r in results] == ["Tool execution cancelled."] * 3
    assert all(r.error_code is ErrorCode.CANCELLED for r in results)
    assert work.started == ["block", "cancel"]
    assert work.running == set()


@pytest.mark.spec("S4", "S5")
async def test_S4_abort_after_interrupt_also_stops_block_calls(workspace: Path) -> None:
    coordinator, session, _, _ = setup(workspace)
    turn = coordinator.submit(session, [work_call("block", 10_000, behavior="block")])
    await ticks(3)
    turn.interrupt()
    await ticks(3)
    turn.abort()
    (result,) = await turn
    assert result.error_code is ErrorCode.CANCELLED


@pytest.mark.spec("S4", "S5")
@pytest.mark.parametrize(("stop", "code"), [("interrupt", "skipped"), ("abort", "cancelled")])
async def test_S4_stop_before_the_turn_started(workspace: Path, stop: str, code: str) -> None:
    # Given a turn still waiting for the session's previous turn
    coordinator, session, _, work = setup(workspace)
    first = coordinator.submit(session, [work_call("first", 20, safe=False)])
    second = coordinator.submit(session, [work_call("a", 1), work_call("b", 1)])
    # When it is stopped before it starts
    getattr(second, stop)()
    await first
    results = await second
    # Then none of its calls ran, and each has its result
    assert [r.error_code.value for r in results if r.error_code] == [code, code]
    assert work.started == ["first"]


@pytest.mark.spec("S5")
async def test_S5_a_cancelled_waiter_leaves_the_turn_and_an_abort_ends_it_cleanly(
    workspace: Path,
) -> None:
    coordinator, session, _, work = setup(workspace)
    log = EventLog()
    turn = coordinator.submit(session, [work_call("x", 10_000)], on_event=log)
    await ticks(3)
    # A task that waited for the turn and was cancelled stops waiting, nothing more
    waiter = asyncio.ensure_future(turn.results())
    await ticks(1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert work.running == {"x"} and "turn_end" not in log.types
    # The abort ends it: the call cancelled, every event out, the last one turn_end
    turn.abort()
    (result,) = await turn
    coordinator.close()
    assert log.types[-1] == "turn_end" and work.running == set()
    assert result.error_code is ErrorCode.CANCELLED


# --- S6 -----------------------------------------------------------------------------------


@pytest.mark.spec("S6")
async def test_S6_results_come_back_in_call_order(workspace: Path) -> None:
    coordinator, session, _, _ = setup(workspace)
    calls = [work_call("slow", 30), work_call("mid", 10), work_call("fast", 0)]
    log = EventLog()
    results = await coordinator.run_turn(session, calls, on_event=log)
    assert [e.call_id for e in log.ends()] == ["fast", "mid", "slow"]  # finish order
    assert ids(results) == ["slow", "mid", "fast"]  # call order


# --- the pure scheduler ---------------------------------------------------------------


@pytest.mark.spec("S2", "S3")
def test_scheduler_decisions_and_statistics() -> None:
    scheduler = TurnScheduler([True, True, False, True], [False, True, False, False], 2)
    assert scheduler.start_ready() == [0, 1]
    assert repr(scheduler) == "<TurnScheduler [2 running, 2 queued, 0 done]>"
    assert scheduler.start_ready() == []
    scheduler.finish(0)
    assert scheduler.start_ready() == []  # the unsafe head waits for call 1
    scheduler.finish(1)
    assert scheduler.start_ready() == [2]
    assert repr(scheduler) == "<TurnScheduler [1 running (unsafe), 1 queued, 2 done]>"
    scheduler.finish(2)
    assert scheduler.start_ready() == [3]
    with pytest.raises(ValueError, match="not running"):
        scheduler.finish(2)


@pytest.mark.spec("S4", "S5")
def test_scheduler_stop_plans() -> None:
    scheduler = TurnScheduler([True, True, True], [True, False, True], 2)
    scheduler.start_ready()
    plan = scheduler.interrupt()
    assert (plan.cancel, plan.never_started) == ((0,), (2,))
    assert scheduler.start_ready() == []
    plan = scheduler.abort()  # escalation: now the block call too, nothing twice
    assert (plan.cancel, plan.never_started) == ((1,), ())


# --- sessions -------------------------------------------------------------------------


async def test_turns_of_one_session_run_one_after_another(workspace: Path) -> None:
    coordinator, session, timeline, _ = setup(workspace)
    other = coordinator.open_session(workspace)
    first = coordinator.submit(session, [work_call("a1", 10)])
    second = coordinator.submit(session, [work_call("a2", 10)])
    parallel = coordinator.submit(other, [work_call("b1", 10)])
    await asyncio.gather(first.results(), second.results(), parallel.results())
    assert not timeline.overlap("a1", "a2")  # same session: one after another
    assert timeline.overlap("a1", "b1")  # different sessions: side by side


async def test_duplicate_call_ids_are_refused(workspace: Path) -> None:
    coordinator, session, _, _ = setup(workspace)
    with pytest.raises(ValueError, match="unique"):
        coordinator.submit(session, [work_call("x"), work_call("x")])


async def test_an_empty_turn_ends_at_once(workspace: Path) -> None:
    coordinator, session, _, _ = setup(workspace)
    log = EventLog()
    assert await coordinator.run_turn(session, [], on_event=log) == ()
    assert log.types == ["turn_end"]


async def test_a_failing_listener_does_not_break_the_turn(workspace: Path) -> None:
    coordinator, session, _, _ = setup(workspace)

    def broken(event: Any) -> None:
        raise RuntimeError("listener bug")

    results = await coordinator.run_turn(session, [work_call("a", 1)], on_event=broken)
    assert not results[0].is_error


# --- open turns and single cancellations -------------------------------------------------


@pytest.mark.spec("S2", "S6")
async def test_open_turn_takes_calls_while_it_runs(workspace: Path) -> None:
    coordinator, session, timeline, _ = setup(workspace)
    log = EventLog()
    turn = coordinator.submit(session, [work_call("a", 20)], on_event=log, open=True)
    await ticks(3)
    turn.add([work_call("b", 5)])  # safe: joins "a" at once
    turn.add([work_call("w", 2, safe=False), work_call("c", 1)])  # unsafe: waits, then alone
    await ticks(3)
    assert turn.state.value == "running"
    turn.close()
    results = await turn
    assert [r.call_id for r in results] == ["a", "b", "w", "c"]
    assert timeline.overlap("a", "b")
    assert not timeline.overlap("w", "a")
    assert not timeline.overlap("w", "c")
    assert log.types[-1] == "turn_end"
    with pytest.raises(ValueError, match="closed"):
        turn.add([work_call("late")])


async def test_an_open_turn_waits_for_calls_until_closed(workspace: Path) -> None:
    coordinator, session, _, _ = setup(workspace)
    turn = coordinator.submit(session, [], open=True)
    await ticks(5)
    assert turn.state.value == "running"  # nothing to do, but not ended
    turn.add([work_call("x", 1)])
    await ticks(10)
    turn.close()
    assert [r.text for r in await turn] == ["done x"]


@pytest.mark.spec("S4")
async def test_one_call_is_cancelled_alone(workspace: Path) -> None:
    coordinator, session, _, work = setup(workspace, limit=2)
    calls = [
        work_call("long", 10_000, behavior="block"),
        work_call("other", 30),
        work_call("queued", 1, safe=False),
        work_call("last", 1),
    ]
    turn = coordinator.submit(session, calls)
    await ticks(3)
    turn.cancel("long")  # running: cancelled, whatever its interrupt behaviour
    turn.cancel("queued")  # queued: never starts
    results = await turn
    assert [r.error_code for r in results] == [
        ErrorCode.INTERRUPTED,
        None,
        ErrorCode.SKIPPED,
        None,
    ]
    assert "queued" not in work.started
    with pytest.raises(KeyError):
        turn.cancel("nope")


async def test_cancel_before_the_turn_starts(workspace: Path) -> None:
    coordinator, session, _, work = setup(workspace)
    first = coordinator.submit(session, [work_call("first", 10, safe=False)])
    second = coordinator.submit(session, [work_call("a", 1), work_call("b", 1)])
    second.cancel("a")
    await first
    results = await second
    assert [r.error_code for r in results] == [ErrorCode.SKIPPED, None]
    assert work.started == ["first", "b"]


def test_scheduler_add_and_cancel_one() -> None:
    scheduler = TurnScheduler([True], [False], 4)
    assert scheduler.start_ready() == [0]
    assert scheduler.add(False, False) == 1
    assert scheduler.add(True, False) == 2
    assert scheduler.start_ready() == []  # the unsafe head waits for 0
    assert scheduler.cancel_one(1).value == "queued"  # it will never start
    assert scheduler.start_ready() == [2]  # so the next safe one may
    assert scheduler.cancel_one(0).value == "running"
    scheduler.finish(0)
    scheduler.finish(2)
    assert scheduler.done
    scheduler.abort()
    with pytest.raises(ValueError, match="stopped"):
        scheduler.add(True, False)
