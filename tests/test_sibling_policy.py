"""SPEC S7, S8: what a failed call does to its siblings, and why a call did not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpool import ErrorCode, ToolResult
from toolpool.engine import Coordinator, Session

from .support import EventLog, Work, ticks, work_call


def setup(workspace: Path, on_error: str, limit: int = 10) -> tuple[Coordinator, Session, Work]:
    work = Work()
    coordinator = Coordinator([work], max_tool_concurrency=limit)
    return coordinator, coordinator.open_session(workspace, on_error=on_error), work


def because(result: ToolResult) -> Any:
    return result.details.get("skipped_because")


@pytest.mark.spec("S7", "S8")
async def test_S7_a_failure_skips_the_queued_cancels_cancel_calls_lets_block_calls_finish(
    workspace: Path,
) -> None:
    coordinator, session, work = setup(workspace, "cancel_siblings")
    calls = [
        work_call("fails", 3, fail=True),
        work_call("cancel-me", 10_000, behavior="cancel"),
        work_call("let-me-finish", 30, behavior="block"),
        work_call("queued-unsafe", 1, safe=False),
        work_call("queued-safe", 1),
    ]
    log = EventLog()
    results = {r.call_id: r for r in await coordinator.run_turn(session, calls, on_event=log)}
    assert results["fails"].text == "work failed"
    assert because(results["fails"]) is None
    assert results["cancel-me"].error_code is ErrorCode.CANCELLED
    assert because(results["cancel-me"]) == {"call_id": "fails", "reason": "sibling_failed"}
    assert "call fails of the same turn failed" in results["cancel-me"].text
    assert results["let-me-finish"].text == "done let-me-finish"
    for queued in ("queued-unsafe", "queued-safe"):
        assert results[queued].error_code is ErrorCode.SKIPPED
        assert results[queued].text == "Skipped: call fails of the same turn failed."
        assert because(results[queued]) == {"call_id": "fails", "reason": "sibling_failed"}
    assert work.started == ["fails", "cancel-me", "let-me-finish"]
    # Causality: the failure's end comes before any sibling's stop.
    ends = [e.call_id for e in log.events if e.type.value == "tool_end"]
    assert ends.index("fails") < ends.index("cancel-me")
    # The stopped siblings do not count against the breaker; the block call's
    # success after the failure reset it.
    assert session.breaker.failures("work") == 0


@pytest.mark.spec("S7")
async def test_S7_continue_is_the_default_and_a_failure_touches_nothing(workspace: Path) -> None:
    work = Work()
    coordinator = Coordinator([work])
    session = coordinator.open_session(workspace)
    calls = [work_call("fails", 1, fail=True), work_call("a", 20), work_call("b", 1, safe=False)]
    results = await coordinator.run_turn(session, calls)
    assert [r.text for r in results] == ["work failed", "done a", "done b"]


@pytest.mark.spec("S7")
async def test_S7_an_unknown_mode_is_refused_naming_the_modes(workspace: Path) -> None:
    with pytest.raises(ValueError, match="'continue', 'cancel_siblings'"):
        Coordinator([Work()]).open_session(workspace, on_error="stop")


@pytest.mark.spec("S7")
async def test_S7_stops_do_not_cascade_and_an_interrupt_is_not_a_failure(workspace: Path) -> None:
    coordinator, session, _ = setup(workspace, "cancel_siblings")
    calls = [work_call("cancelled", 10_000, behavior="cancel"), work_call("blocks", 30)]
    turn = coordinator.submit(session, calls)
    await ticks(3)
    turn.cancel("cancelled")  # a stop, not a failure: its sibling runs on
    results = await turn
    assert results[0].error_code is ErrorCode.INTERRUPTED
    assert results[1].text == "done blocks"


@pytest.mark.spec("S7")
async def test_S7_a_failure_ends_an_open_turn(workspace: Path) -> None:
    coordinator, session, _ = setup(workspace, "cancel_siblings")
    turn = coordinator.submit(session, [work_call("fails", 1, fail=True)], open=True)
    results = await turn  # ended without close(): the failure stopped it
    assert results[0].text == "work failed"
    with pytest.raises(ValueError, match="closed or stopped"):
        turn.add([work_call("late", 1)])


@pytest.mark.spec("S8")
async def test_S8_interrupt_abort_and_breaker_say_why(workspace: Path) -> None:
    work = Work()
    coordinator = Coordinator([work], max_tool_errors=1)
    session = coordinator.open_session(workspace)
    turn = coordinator.submit(
        session, [work_call("running", 10_000, behavior="cancel"), work_call("q", 1, safe=False)]
    )
    await ticks(3)
    turn.interrupt()
    interrupted = await turn
    assert [because(r) for r in interrupted] == [
        {"call_id": None, "reason": "interrupt"},
        {"call_id": None, "reason": "interrupt"},
    ]
    turn = coordinator.submit(session, [work_call("r", 10_000), work_call("q2", 1, safe=False)])
    await ticks(3)
    turn.abort()
    aborted = await turn
    assert [because(r) for r in aborted] == [
        {"call_id": None, "reason": "abort"},
        {"call_id": None, "reason": "abort"},
    ]
    # One failure opens the breaker (max_tool_errors=1); the next call names it.
    failed = await coordinator.run_turn(session, [work_call("bad", 1, fail=True)])
    assert because(failed[0]) is None
    refused = await coordinator.run_turn(session, [work_call("after", 1)])
    assert refused[0].error_code is ErrorCode.BREAKER_OPEN
    assert because(refused[0]) == {"call_id": "bad", "reason": "breaker"}


_CALL = st.tuples(
    st.integers(0, 6),  # ticks
    st.booleans(),  # safe
    st.sampled_from(["cancel", "block"]),
    st.booleans(),  # fails
)


@pytest.mark.spec("S7", "S8")
@settings(max_examples=150, deadline=None)
@given(st.lists(_CALL, min_size=1, max_size=8), st.integers(1, 4))
def test_S7_property_the_first_failure_stops_exactly_what_had_not_ended(
    tmp_path_factory: pytest.TempPathFactory, shape: list[tuple[int, bool, str, bool]], limit: int
) -> None:
    import asyncio

    workspace = tmp_path_factory.mktemp("ws")
    calls = [
        work_call(str(i), n, safe=safe, behavior=behavior, fail=fails)
        for i, (n, safe, behavior, fails) in enumerate(shape)
    ]

    async def run() -> tuple[list[ToolResult], list[str], Work]:
        coordinator, session, work = setup(workspace, "cancel_siblings", limit)
        log = EventLog()
        results = await coordinator.run_turn(session, calls, on_event=log)
        order = [(e.type.value, e.call_id) for e in log.events if hasattr(e, "call_id")]
        return list(results), order, work

    results, order, work = asyncio.run(run())
    ends = [call_id for kind, call_id in order if kind == "tool_end"]
    failures = [r for r in results if r.is_error and because(r) is None]
    stopped = [r for r in results if because(r) is not None]
    if not failures:
        assert stopped == []
        return
    first = min(failures, key=lambda r: ends.index(r.call_id))  # the first to end
    for result in stopped:
        assert because(result) == {"call_id": first.call_id, "reason": "sibling_failed"}
        assert ends.index(result.call_id) > ends.index(first.call_id)
        if result.error_code is ErrorCode.SKIPPED:
            assert result.call_id not in work.started  # a skipped call never started
        else:
            assert result.error_code is ErrorCode.CANCELLED
            assert shape[int(result.call_id)][2] == "cancel"  # block calls are not cancelled
    # Every failure other than the first ran while it was running (it was started before).
    for result in failures:
        assert result.call_id in work.started
    # Nothing started after the first failure ended: every call that was not skipped
    # had its tool_start before it (a cancelled one may not have reached its tool)
    first_end = order.index(("tool_end", first.call_id))
    for result in results:
        if result.error_code is not ErrorCode.SKIPPED:
            assert order.index(("tool_start", result.call_id)) < first_end
    assert set(work.started) <= {
        r.call_id for r in results if r.error_code is not ErrorCode.SKIPPED
    }
