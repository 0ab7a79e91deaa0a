"""SPEC X7 and X8 with real workers: CPU, memory and processes counted over every
process of a call, a call stopped by a limit reported as ``limit_exceeded`` naming
the limit and its value, and the spill file of a command's output capped."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from toolpool import ErrorCode, ToolCall, ToolResult, tools_in_module
from toolpool.engine import Coordinator
from toolpool.engine.session import Session
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.sandbox import Limits
from toolpool.sandbox.limits import MiB

MODULES = ("toolpool.tools", "tests.worker_tools")
LIMITS = Limits(
    wall_seconds=60,
    cpu_seconds=3,
    memory_bytes=256 * MiB,
    processes=64,
    output_bytes=4 * MiB,
)

Setup = Callable[..., Awaitable[tuple[WorkerPool, Coordinator, Session]]]


@pytest.fixture
async def setup(workspace: Path) -> AsyncIterator[Setup]:
    pools: list[WorkerPool] = []

    async def make(**limits: Any) -> tuple[WorkerPool, Coordinator, Session]:
        config = PoolConfig(
            min_workers=1,
            max_workers=1,
            tool_modules=MODULES,
            heartbeat_interval=0.1,
            # Hang detection far from anything a busy machine does (30 s of silence,
            # not 1 s): these calls spin the CPU beside the workers' heartbeats
            heartbeat_misses=300,
            limits=LIMITS.merged(limits),
        )
        pool = WorkerPool(config)
        pools.append(pool)
        await pool.start()
        tools = [t for module in MODULES for t in tools_in_module(module)]
        coordinator = Coordinator(tools, executor=PoolExecutor(pool))
        return pool, coordinator, coordinator.open_session(workspace)

    yield make
    for pool in pools:
        await pool.close()


async def run(coordinator: Coordinator, session: Session, name: str, **args: Any) -> ToolResult:
    (result,) = await coordinator.run_turn(session, [ToolCall("c1", name, args)])
    return result


def needs_cgroup(pool: WorkerPool, controller: str) -> None:
    """Skip when the workers have no cgroup that does ``controller`` (accounting
    over every process needs one; without it only per-process rlimits exist)."""
    cgroups = pool.processes.cgroups
    if cgroups is None:
        pytest.skip("no writable cgroup hierarchy: limits are per process (rlimits) only")
    if controller == "cpu":
        if "cpuacct" in cgroups.controllers or any(h.version == 2 for h in cgroups.hierarchies):
            return
        pytest.skip("no cpuacct (v1) nor cgroup v2 cpu.stat: CPU is counted per process")
    if controller not in cgroups.controllers:
        pytest.skip(f"no {controller} cgroup controller for the workers here")


def assert_limit(result: ToolResult, words: str, named: str) -> None:
    assert result.is_error, result.text
    assert result.error_code is ErrorCode.LIMIT_EXCEEDED, result.text
    assert words in result.text
    assert named in result.text
    assert "Exit code: 137" not in result.text.splitlines()[0]


@pytest.mark.spec("X7")
async def test_X7_sequential_cpu_spinners_meet_the_call_cpu_limit(setup: Setup) -> None:
    # Given a call allowance of 3 s of CPU
    pool, coordinator, session = await setup()
    needs_cgroup(pool, "cpu")
    # When one command runs five spinners of 2 s of CPU each, one after another (each
    # under any per-process limit, together well past the call's). Each is stopped by
    # its own CPU limit (ulimit -t), not by a clock: on a busy machine a spinner gets
    # less CPU per second, never less CPU in all.
    spin = "sh -c 'ulimit -t 2; while :; do :; done'"
    command = f"for i in 1 2 3 4 5; do {spin}; done; echo all-finished"
    result = await run(coordinator, session, "bash", command=command)
    # Then the call is stopped by its CPU limit, and says so
    assert_limit(result, "CPU time limit", "cpu_seconds = 3")
    assert result.text.startswith("The command used up its CPU time limit (cpu_seconds = 3)")
    assert "all-finished" not in result.text
    assert result.details["limit"] == "cpu_seconds"


@pytest.mark.spec("X7")
async def test_X7_python_tool_spinning_children_meets_the_call_cpu_limit(setup: Setup) -> None:
    pool, coordinator, session = await setup(cpu_seconds=2)
    needs_cgroup(pool, "cpu")
    # A hostile tool starts child after child, each spinning 1.5 s of CPU, and starts
    # the next one when a child is killed
    result = await run(coordinator, session, "spin_children", seconds=1.5, rounds=50)
    assert_limit(result, "CPU time limit", "cpu_seconds = 2")
    assert "spun 50 children" not in result.text
    # and the pool goes on serving
    assert (await run(coordinator, session, "noop")).text == "ok"


@pytest.mark.spec("X7")
async def test_X7_command_past_the_memory_limit(setup: Setup) -> None:
    pool, coordinator, session = await setup()
    needs_cgroup(pool, "memory")
    hog = f"{sys.executable} -c \"b = b'x' * (768 << 20); print('held', len(b))\""
    result = await run(coordinator, session, "bash", command=f"{hog}; echo after-hog")
    assert_limit(result, "memory limit", f"memory_bytes = {256 * MiB}")
    assert f"held {768 << 20}" not in result.text
    assert result.details["limit"] == "memory_bytes"


@pytest.mark.spec("X7")
async def test_X7_command_past_the_process_limit(setup: Setup) -> None:
    pool, coordinator, session = await setup(processes=32)
    needs_cgroup(pool, "pids")
    command = "for i in $(seq 200); do sleep 30 & done; wait; echo all-started"
    result = await run(coordinator, session, "bash", command=command)
    assert_limit(result, "process limit", "processes = 32")
    assert "all-started" not in result.text
    assert (await run(coordinator, session, "noop")).text == "ok"


@pytest.mark.spec("X13", "X7")
async def test_X13_a_memory_limit_below_the_workers_own_use_fails_that_call_alone(
    setup: Setup, workspace: Path
) -> None:
    # Given a pool of one worker, and a session asking for 1 MiB of memory: less than
    # the worker itself uses, which a v1 memory cgroup refuses to take (and a v2
    # one takes by killing the worker)
    pool, coordinator, session = await setup()
    needs_cgroup(pool, "memory")
    starved = coordinator.open_session(workspace, limits={"memory_bytes": MiB})
    # When it calls, its call is an error naming the limit
    result = await run(coordinator, starved, "noop")
    assert result.is_error, result.text
    assert f"memory_bytes = {MiB}" in result.text
    # Then the pool is not stuck on it: the other session's calls run, before and
    # after another of the starved session's
    assert (await run(coordinator, session, "noop")).text == "ok"
    again = coordinator.submit(starved, [ToolCall("c2", "noop", {})])
    (ok,) = await coordinator.run_turn(session, [ToolCall("c3", "noop", {})])
    assert ok.text == "ok"
    assert (await again)[0].is_error


@pytest.mark.spec("X8")
async def test_X8_spill_file_is_capped_at_spill_bytes(setup: Setup) -> None:
    spill = 256 * 1024
    _pool, coordinator, session = await setup(spill_bytes=spill)
    result = await run(coordinator, session, "bash", command="timeout 2 yes")
    assert not result.is_error, result.text[-500:]  # timeout's own exit code, 124
    note = f"\n[output truncated at {spill} bytes: spill_bytes]\n".encode()
    (path,) = (session.scratch_dir / "bash").glob("c1-*.log")  # named from the call id
    data = path.read_bytes()
    assert len(data) <= spill + len(note)
    assert data.endswith(note)
    assert data.startswith(b"y\ny\n")
    # the model is told where the output is and that it was cut there
    assert f"truncated at {spill} bytes (the spill_bytes limit)" in result.text
    assert str(path) in result.text


@pytest.mark.spec("X7")
def test_X7_tmp_and_spill_limits_are_limits() -> None:
    limits = Limits()
    assert limits.tmp_bytes == 256 * MiB
    assert limits.spill_bytes == 64 * MiB
    assert Limits.from_dict({"spill_bytes": 1024, "tmp_bytes": 4096}).spill_bytes == 1024
    for name in ("tmp_bytes", "spill_bytes"):
        with pytest.raises(ValueError, match=f"limit {name} = 0: expected an integer more than 0"):
            Limits.from_dict({name: 0})
