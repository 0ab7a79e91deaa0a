"""SPEC L1, the pool outlives its zygote: a tool that SIGKILLs or SIGSTOPs the zygote
(its worker's parent) costs the calls running on its workers, never the pool — the
zygote is replaced with its workers, calls queued meanwhile run on the new ones, and
every open session's next call works, through a real pool and a real daemon."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from toolpool import Client, ErrorCode, ToolCall, ToolResult, tools_in_module
from toolpool.cancel import CancelToken
from toolpool.engine import Coordinator
from toolpool.pool import PoolError, PoolExecutor, WorkerPool
from toolpool.pool.planner import (
    GiveUp,
    PoolPlanner,
    PoolState,
    ReplaceZygote,
    StartWorker,
    WorkerView,
)
from toolpool.pool.workers import WorkerState
from toolpool.protocol import CallContext, Execute

from .daemon_support import Daemon, running, running_daemon
from .support import PoolFactory, pool_factory, until

MODULES = ("tests.worker_tools", "tests.hostile_tools")


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    async with pool_factory(
        min_workers=2,
        max_workers=3,
        tool_modules=MODULES,
        heartbeat_interval=0.1,
        heartbeat_misses=15,
        cancel_grace=0.5,
        spawn_timeout=30.0,
    ) as make:
        yield make


def coordinator_on(pool: WorkerPool) -> Coordinator:
    tools = [t for module in MODULES for t in tools_in_module(module)]
    return Coordinator(tools, executor=PoolExecutor(pool), max_tool_errors=0)


async def one(coordinator: Coordinator, session: Any, name: str, **args: Any) -> ToolResult:
    (result,) = await coordinator.run_turn(session, [ToolCall(name, name, args)])
    return result


def lost_or_error(result: ToolResult) -> bool:
    return result.is_error and result.error_code in (
        ErrorCode.WORKER_LOST,
        ErrorCode.EXECUTION_FAILED,
    )


def gone(*pids: int | None) -> bool:
    return not any(pid and running(pid) for pid in pids)


@pytest.mark.spec("L1")
async def test_L1_a_tool_that_kills_its_zygote_costs_the_running_calls_not_the_pool(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool()
    coordinator = coordinator_on(pool)
    sleeper, killer = coordinator.open_session(workspace), coordinator.open_session(workspace)
    old_zygote, old_workers = pool.zygote_pid, set(pool.worker_pids().values())
    assert old_zygote and len(old_workers) == 2

    # A long call on one worker, the killer on the other: both die with the zygote.
    napping = asyncio.ensure_future(one(coordinator, sleeper, "nap", seconds=60))
    await until(lambda: pool.statistics().workers["busy"] == 1)
    killed = await one(coordinator, killer, "kill_zygote")
    assert lost_or_error(killed)
    nap = await asyncio.wait_for(napping, 30)
    assert nap.error_code is ErrorCode.WORKER_LOST
    assert "zygote" in nap.text and "zygote" in nap.details["cause"]

    # Both sessions' next calls work, on new workers of a new zygote.
    assert (await one(coordinator, sleeper, "noop")).text == "ok"
    assert (await one(coordinator, killer, "noop")).text == "ok"
    stats = pool.statistics()
    assert stats.zygotes_replaced == 1
    assert len(stats.zygote_recovery_ms) == 1 and stats.zygote_recovery_ms[0] > 0
    assert pool.zygote_pid not in (None, old_zygote)
    assert not old_workers & set(pool.worker_pids().values())
    # Nothing of the old zygote is left: it, and every worker it forked, are gone.
    await until(lambda: gone(old_zygote, *old_workers), timeout=30)
    await until(lambda: len(pool.worker_pids()) == 2, timeout=30)  # the minimum again


@pytest.mark.spec("L1")
async def test_L1_calls_queued_while_the_zygote_is_replaced_run_on_the_new_workers(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=2)
    coordinator = coordinator_on(pool)
    killer = coordinator.open_session(workspace)
    assert lost_or_error(await one(coordinator, killer, "kill_zygote"))
    # The death was noticed (the call ended), the new zygote is not up yet: calls
    # submitted now wait for its workers.
    assert pool.statistics().zygotes_replaced == 0
    sessions = [coordinator.open_session(workspace) for _ in range(4)]
    waiting = [asyncio.ensure_future(one(coordinator, s, "noop")) for s in sessions]
    results = await asyncio.wait_for(asyncio.gather(*waiting), 60)
    assert [r.text for r in results] == ["ok"] * 4
    assert pool.statistics().zygotes_replaced == 1


@pytest.mark.spec("L1")
async def test_L1_a_stopped_zygote_is_killed_and_replaced(
    make_pool: PoolFactory, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "toolpool.pool")
    pool = await make_pool(min_workers=1, max_workers=2)
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    old_zygote, old_workers = pool.zygote_pid, set(pool.worker_pids().values())
    assert (await one(coordinator, session, "stop_zygote")).text == "stopped the zygote"
    await until(lambda: psutil.Process(old_zygote).status() == psutil.STATUS_STOPPED)
    # Two calls at once: a long one on the live worker, and one that needs a new
    # worker, which the stopped zygote cannot fork. The zygote stops heartbeating, is
    # killed with its workers (the long call is lost) and replaced; the waiting call
    # runs on a new worker.
    calls = [ToolCall("long", "nap", {"seconds": 60}), ToolCall("short", "nap", {"seconds": 0})]
    long, short = await asyncio.wait_for(coordinator.run_turn(session, calls), 60)
    assert long.error_code is ErrorCode.WORKER_LOST and "hung" in long.text
    assert short.text.startswith("slept")
    assert pool.statistics().zygotes_replaced == 1
    assert "the zygote hung" in caplog.text
    await until(lambda: gone(old_zygote, *old_workers), timeout=30)
    assert (await one(coordinator, session, "noop")).text == "ok"


@pytest.mark.spec("L1")
async def test_L1_a_zygote_that_cannot_start_again_fails_the_waiting_calls_clearly(
    make_pool: PoolFactory, workspace: Path, tmp_path: Path
) -> None:
    # A tool module that imports while the marker is absent: the first zygote starts,
    # every replacement fails to (as after an update that broke a tool module).
    marker = tmp_path / "broken"
    module = tmp_path / "fragile_tools.py"
    module.write_text(
        "from pathlib import Path\n"
        f"if Path({str(marker)!r}).exists():\n"
        "    raise ImportError('fragile_tools is broken now')\n"
    )
    pool = await make_pool(min_workers=1, tool_modules=(*MODULES, str(module)))
    pool.planner = PoolPlanner(1, 3, zygote_retries=2, zygote_backoff=0.05)
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    marker.touch()
    assert lost_or_error(await one(coordinator, session, "kill_zygote"))
    # The next call waits through the retries, then fails with the cause (the pool's
    # PoolError, an error result to the model).
    waited = await asyncio.wait_for(one(coordinator, session, "noop"), 60)
    assert waited.is_error and "could not be started again" in waited.text
    assert "fragile_tools is broken now" in waited.text
    with pytest.raises(PoolError, match="could not be started again"):
        await pool.run(  # and so do later calls, at once
            Execute("x", "noop", {}, CallContext(session_id="s", workspace=str(workspace)), {}, {}),
            network=False,
            token=CancelToken(),
            on_progress=print,
            limits=pool.config.limits,
        )
    assert pool.statistics().zygotes_replaced == 0


# --- through the daemon: two clients, two sessions --------------------------------------


def first_zygote(daemon: Daemon) -> int:
    (zygote,) = [
        p.pid
        for p in psutil.Process(daemon.pid).children()
        if "toolpool.worker.zygote" in " ".join(p.cmdline())
    ]
    return zygote


@pytest.mark.spec("L1")
@pytest.mark.parametrize("tool", ["kill_zygote", "stop_zygote"])
def test_L1_every_open_session_keeps_working_after_its_zygote_is_lost(
    tmp_path: Path, workspace: Path, tool: str
) -> None:
    with (
        running_daemon(tmp_path, "--tool-modules", "tests.hostile_tools") as daemon,
        Client(runtime_dir=daemon.runtime, timeout=60) as one_client,
        Client(runtime_dir=daemon.runtime, timeout=60) as other_client,
        one_client.session(workspace) as first,
        other_client.session(workspace) as second,
    ):
        for session in (first, second):
            (result,) = session.submit([ToolCall("warm", "noop", {})]).results()
            assert result.text == "ok"
        old_zygote = first_zygote(daemon)
        old_tree = daemon.tree() - {daemon.pid}
        (hit,) = second.submit([ToolCall("z", tool, {})]).results()
        if tool == "kill_zygote":
            assert hit.is_error and hit.error_code is not None
            assert hit.error_code.value in ("worker_lost", "execution_failed")
        else:
            assert hit.text == "stopped the zygote"
        # The next call of every open session succeeds, without a daemon restart (a
        # stopped zygote's live workers may serve it before the zygote is seen hung).
        for i, session in enumerate((first, second, first)):
            (result,) = session.submit([ToolCall(f"after{i}", "noop", {})]).results()
            assert result.text == "ok", result.text
        status = one_client.status()
        deadline = time.monotonic() + 60
        while not status["zygote_recovery_ms"] and time.monotonic() < deadline:
            time.sleep(0.05)
            status = one_client.status()
        assert status["zygotes_replaced"] == 1
        assert len(status["zygote_recovery_ms"]) == 1
        assert first_zygote(daemon) != old_zygote
        # And on the new zygote's workers too.
        for i, session in enumerate((second, first)):
            (result,) = session.submit([ToolCall(f"later{i}", "noop", {})]).results()
            assert result.text == "ok", result.text
        while not gone(*old_tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(*old_tree), [p for p in old_tree if running(p)]


# --- the planner's part (no processes) -------------------------------------------------


def test_L1_planner_replaces_a_dead_zygote_then_retries_with_backoff_then_gives_up() -> None:
    planner = PoolPlanner(min_workers=2, max_workers=4, zygote_retries=3, zygote_backoff=0.25)
    down = PoolState((), {False: 3}, zygote_up=False)
    assert planner.zygote_died(down, "it was killed by SIGKILL", started=True) == [
        ReplaceZygote("the zygote died: it was killed by SIGKILL")
    ]
    assert planner.zygote_died(down, "it exited with status 1", started=False) == [
        GiveUp("the zygote did not start: it exited with status 1")
    ]
    # No worker starts while the zygote is down: calls wait.
    assert planner.grow(down, False) == []
    assert planner.replenish(down, False) == []
    delays = [planner.zygote_start_failed(down, n, "boom") for n in (1, 2, 3)]
    assert delays == [[ReplaceZygote("boom", d)] for d in (0.25, 0.5, 1.0)]
    (gave_up,) = planner.zygote_start_failed(down, 4, "boom")
    assert isinstance(gave_up, GiveUp) and "boom" in gave_up.reason
    # Closing: nothing more.
    closed = PoolState((), open=False, zygote_up=False)
    assert planner.zygote_died(closed, "x", started=True) == []
    assert planner.zygote_start_failed(closed, 1, "x") == []
    assert planner.zygote_started(dataclasses.replace(closed, zygote_up=True), True) == []


def test_L1_planner_starts_the_minimum_and_the_waiting_calls_workers_on_a_new_zygote() -> None:
    planner = PoolPlanner(min_workers=2, max_workers=4)
    up = PoolState((), {False: 3, True: 1})
    actions = planner.zygote_started(up, offline=True)
    assert actions[:2] == [StartWorker(True, replacement=True)] * 2
    assert actions[2:] == [StartWorker(False), StartWorker(False)]  # the maximum: 4 in all
    # A worker already starting counts towards the minimum.
    starting = PoolState((WorkerView("w9", True, WorkerState.STARTING),))
    assert planner.zygote_started(starting, offline=True) == [StartWorker(True, replacement=True)]
