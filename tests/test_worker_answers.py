"""SPEC D2: a worker's answer the coordinator cannot read ends its call as an error
result, like a worker that crashed — the turn never waits for an answer that will
not come. The answers are forged by a hostile tool on its worker's own socket,
through a real pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from toolpool import ErrorCode, ToolCall, ToolResult, tools_in_module
from toolpool.engine import Coordinator
from toolpool.engine.session import Session
from toolpool.pool import PoolExecutor

from .support import pool_factory

MODULES = ("tests.worker_tools", "tests.hostile_tools")


@pytest.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    async with pool_factory(min_workers=1, max_workers=2, tool_modules=MODULES) as make:
        pool = await make()
        tools = [t for module in MODULES for t in tools_in_module(module)]
        coordinator = Coordinator(tools, executor=PoolExecutor(pool), max_tool_errors=0)
        yield coordinator
        coordinator.close()


async def _turn(
    coordinator: Coordinator, session: Session, *calls: ToolCall
) -> tuple[ToolResult, ...]:
    """The results of one turn of ``calls`` (a hang guard: a turn here ends by itself,
    long before it)."""
    return await asyncio.wait_for(coordinator.run_turn(session, list(calls)), 60)


@pytest.mark.spec("D2")
@pytest.mark.parametrize("shape", ["empty", "block", "stamps"])
async def test_D2_an_answer_that_cannot_be_read_ends_the_call_as_an_error(
    coordinator: Coordinator, workspace: Path, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a session on a real pool
    session = coordinator.open_session(workspace=workspace)
    caplog.set_level(logging.WARNING, logger="toolpool")
    # When a tool sends the pool a result of its own call that cannot be read
    (forged,) = await _turn(coordinator, session, ToolCall("f1", "forge_result", {"shape": shape}))
    # Then the call ends, as an error that says the worker's answer was unreadable
    assert forged.is_error, forged
    assert forged.error_code is ErrorCode.EXECUTION_FAILED
    assert "could not be read" in forged.text
    # and the coordinator's log says whose answer it was, with what was wrong, cut
    # short (the tool chose what the error quotes)
    (logged,) = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert "f1" in logged.getMessage() and "Error" in logged.getMessage()
    assert len(forged.text) < 400 and len(logged.getMessage()) < 400
    # and the session goes on: its next calls run and answer
    (after,) = await _turn(coordinator, session, ToolCall("l1", "lookup", {"key": "still here"}))
    assert not after.is_error, after
    # and nothing of the forged stamps reached the session's register: not the bad
    # entry, nor the readable one before it (all or nothing)
    assert session.files.get("/etc/passwd") is None
    assert session.files.get("/etc/hostname") is None


FORGED = [
    "garbage",
    "wrong way",
    "ready again",
    "heartbeats that lie",
    "withdrawn unknown",
    "another call's",
    "shell nonsense",
    "its own twice",
]


@pytest.mark.spec("D2")
@pytest.mark.parametrize("kind", FORGED)
async def test_D2_frames_a_worker_should_not_send_cost_nothing_but_its_own_call(
    coordinator: Coordinator, workspace: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a session on a real pool
    session = coordinator.open_session(workspace=workspace)
    caplog.set_level(logging.WARNING, logger="toolpool")
    # When a tool sends frames its worker never sends (or not now) on its socket
    (forged,) = await _turn(coordinator, session, ToolCall("f1", "forge_frames", {"kind": kind}))
    # Then its call ends (its own result, or an error about what its worker did)
    assert forged.call_id == "f1"
    # and the session's next calls run and answer
    after = await _turn(
        coordinator, session, *[ToolCall(f"l{i}", "lookup", {"key": str(i)}) for i in range(4)]
    )
    assert [r.is_error for r in after] == [False] * 4, after
    # and nothing in the coordinator raised on the way
    raised = [r for r in caplog.records if r.exc_info is not None]
    assert not raised, [r.getMessage() for r in raised]
