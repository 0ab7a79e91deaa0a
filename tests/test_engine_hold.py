"""SPEC L5, the engine's half: while a client's hold is on, its turns start no new
calls; running calls go on; a release starts the queued ones; stops still end them."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolpool import ErrorCode
from toolpool.engine import Coordinator, Hold

from .support import EventLog, Work, ticks, work_call


@pytest.mark.spec("L5")
async def test_L5_a_held_turn_starts_nothing_until_the_release(workspace: Path) -> None:
    work = Work()
    coordinator = Coordinator([work], max_tool_concurrency=1)
    session = coordinator.open_session(workspace)
    hold = Hold()
    hold.set(True)
    log = EventLog()
    turn = coordinator.submit(
        session, [work_call("a", 2), work_call("b", 2)], on_event=log, hold=hold
    )
    await ticks(50)
    assert log.types == []  # not even P3's tool_start: the calls are not begun
    hold.set(False)
    results = await turn
    coordinator.close()
    assert [r.call_id for r in results] == ["a", "b"]
    assert not any(r.is_error for r in results)


@pytest.mark.spec("L5")
async def test_L5_a_hold_lets_running_calls_finish_and_keeps_the_rest(workspace: Path) -> None:
    work = Work()
    coordinator = Coordinator([work], max_tool_concurrency=1)
    session = coordinator.open_session(workspace)
    hold = Hold()
    log = EventLog()
    turn = coordinator.submit(
        session, [work_call("a", 20), work_call("b", 1)], on_event=log, hold=hold
    )
    await ticks(5)
    assert [e.call_id for e in log.events if e.type.value == "tool_start"] == ["a"]
    hold.set(True)
    await ticks(100)
    ended = [e.call_id for e in log.events if e.type.value == "tool_end"]
    started = [e.call_id for e in log.events if e.type.value == "tool_start"]
    assert ended == ["a"] and started == ["a"]  # a ran to its end; b waits
    turn.abort()
    a, b = await turn
    coordinator.close()
    assert not a.is_error
    assert b.is_error and b.error_code is ErrorCode.CANCELLED  # ended unstarted by the stop
