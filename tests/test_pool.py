"""SPEC D1-D4 with real workers: tools that misbehave on purpose, run through the
full pipeline and pool; interrupts by signal; limits seen from inside a worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from toolpool import ErrorCode, ToolCall, ToolResult, tools_in_module
from toolpool.cancel import CancelToken
from toolpool.engine import Coordinator
from toolpool.pool import PoolConfig, PoolError, PoolExecutor, WorkerPool
from toolpool.protocol import CallContext, Execute, Heartbeat, encode
from toolpool.sandbox import Limits, SandboxProfile
from toolpool.sandbox.limits import MiB

from .support import EventLog, PoolFactory, pool_factory, until

MODULE = "tests.worker_tools"
PROFILE = SandboxProfile.probe()
LIMITS = Limits(
    wall_seconds=5,
    cpu_seconds=1,
    memory_bytes=192 * MiB,
    processes=48,
    file_size_bytes=8 * MiB,
    output_bytes=1 * MiB,
)


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    async with pool_factory(
        min_workers=1,
        max_workers=2,
        tool_modules=(MODULE,),
        # Hung after 30 s of silence, cancels answered within 30 s: far from what a
        # busy machine takes; the tests of hangs and kills set their own.
        heartbeat_interval=0.1,
        heartbeat_misses=300,
        cancel_grace=30,
        limits=LIMITS,
    ) as make:
        yield make


def coordinator_on(pool: WorkerPool, **options: Any) -> Coordinator:
    return Coordinator(tools_in_module(MODULE), executor=PoolExecutor(pool), **options)


async def call(
    coordinator: Coordinator, workspace: Path, name: str, log: EventLog | None = None, **args: Any
) -> ToolResult:
    session = coordinator.open_session(workspace)
    (result,) = await coordinator.run_turn(session, [ToolCall("c1", name, args)], on_event=log)
    return result


async def replaced(pool: WorkerPool, old_pid: int) -> None:
    """Wait until the pool's one worker is a new process."""
    await until(lambda: len(pool.worker_pids()) == 1 and old_pid not in pool.worker_pids().values())


def needs(mechanism: str) -> pytest.MarkDecorator:
    mech = next(m for m in PROFILE.mechanisms if m.name == mechanism)
    return pytest.mark.skipif(not mech.active, reason=f"{mechanism} unavailable: {mech.detail}")


# --- the happy path ----------------------------------------------------------------------


@pytest.mark.spec("D1", "D2")
async def test_D2_calls_run_in_worker_processes_not_the_coordinator(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool()
    coordinator = coordinator_on(pool)
    log = EventLog()
    result = await call(coordinator, workspace, "progress", log, steps=3)
    assert result.text == "reported"
    report = await call(coordinator, workspace, "report_limits", port=1)
    pid = json.loads(report.text)["pid"]
    assert pid != os.getpid()
    assert pid in pool.worker_pids().values()
    # progress reports and printed lines arrive as tool_update events (P9)
    updates = [e.data for e in log.events if e.type.value == "tool_update"]
    assert updates == [{"step": 0}, {"step": 1}, {"step": 2}, "printed line\n"]
    # and the result carries the worker's resource usage
    usage = result.details["usage"]
    assert set(usage) >= {"wall_seconds", "cpu_seconds", "peak_rss_bytes"}
    assert usage["peak_rss_bytes"] > 1_000_000


@pytest.mark.spec("D2")
async def test_D2_two_pools_in_one_process_keep_their_workers_apart(
    make_pool: PoolFactory, workspace: Path, request: pytest.FixtureRequest
) -> None:
    # Given two pools of one process, each with its worker (and the worker's cgroups)
    first, second = await make_pool(max_workers=1), await make_pool(max_workers=1)
    coordinator = coordinator_on(second)
    request.addfinalizer(coordinator.close)
    assert not (await call(coordinator, workspace, "noop")).is_error
    (pid,) = second.worker_pids().values()
    # When the first pool closes
    await first.close()
    # Then the second pool's worker was not ended with it: it serves the next call
    result = await call(coordinator, workspace, "noop")
    assert not result.is_error, result.text
    assert list(second.worker_pids().values()) == [pid]
    assert second.statistics().replaced == 0


@pytest.mark.spec("D2")
async def test_D2_a_worker_says_why_in_its_log_a_crash_in_c_and_a_tool_that_raised(
    make_pool: PoolFactory, workspace: Path
) -> None:
    # Given a pool whose tools crash in C and raise
    pool = await make_pool(min_workers=1, max_workers=1)
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    # When one segfaults its worker, and one raises two calls down
    (crashed,) = await coordinator.run_turn(
        session, [ToolCall("c1", "crash", {"kind": "segfault"})]
    )
    (raised,) = await coordinator.run_turn(
        session, [ToolCall("c2", "raise_deep", {"text": "no such key"})]
    )
    coordinator.close()
    # Then the crashed worker's log holds the Python stack at the crash, the tool's frame
    # in it (faulthandler)
    assert crashed.error_code is ErrorCode.WORKER_LOST
    logs = pool.processes.runtime_dir
    crash_log = (logs / f"worker-{crashed.details['worker']}.log").read_text()
    assert "Fatal Python error: Segmentation fault" in crash_log
    assert "line" in crash_log and "in crash" in crash_log
    # and the raised error is the model's in one line, its traceback in the details
    # and in the worker's log, both down to the raising frame
    assert raised.text == "ValueError: no such key"
    assert "in inner" in raised.details["traceback"]
    raise_log = (logs / f"worker-{raised.details['worker']}.log").read_text()
    assert "the tool 'raise_deep' raised" in raise_log and "in inner" in raise_log


async def test_pool_statistics_and_repr(make_pool: PoolFactory, workspace: Path) -> None:
    pool = await make_pool(min_workers=2)
    assert repr(pool) == "<WorkerPool [2 idle, 0 busy, 0 starting, 0 retiring; 0 queued, 0 held]>"
    stats = pool.statistics()
    assert stats.workers["idle"] == 2
    assert stats.started == 2
    assert set(stats.profile) == {m.name for m in PROFILE.mechanisms}


@pytest.mark.spec("D2")
async def test_D2_pool_grows_to_its_maximum_and_queues_beyond(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=2, hold_calls=False)
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    turn = coordinator.submit(
        session, [ToolCall(str(i), "nap", {"seconds": 0.4}) for i in range(4)]
    )
    await until(lambda: pool.statistics().queued == 2)
    assert pool.statistics().workers["busy"] == 2
    results = await turn
    assert [r.text for r in results] == ["slept 0.4"] * 4
    assert len({r.details["worker"] for r in results}) == 2


# --- misbehaving tools ----------------------------------------------------------------------

MISBEHAVING = [
    # tool, arguments, expected code, words the result must contain
    ("nap", {"seconds": 60}, ErrorCode.LIMIT_EXCEEDED, "wall time limit of 2 s"),
    ("ignore_term", {"seconds": 60}, ErrorCode.LIMIT_EXCEEDED, "wall time limit of 2 s"),
    ("burn_cpu", {"seconds": 60}, ErrorCode.LIMIT_EXCEEDED, "CPU time limit"),
    ("big_file", {"megabytes": 64}, ErrorCode.LIMIT_EXCEEDED, "file size limit"),
    ("shout", {"megabytes": 100}, ErrorCode.LIMIT_EXCEEDED, "printed more than the output"),
    ("huge_result", {"megabytes": 5}, ErrorCode.LIMIT_EXCEEDED, "more than the output limit"),
    ("crash", {"kind": "segfault"}, ErrorCode.WORKER_LOST, "killed by SIGSEGV"),
    ("crash", {"kind": "abort"}, ErrorCode.WORKER_LOST, "killed by SIGABRT"),
    ("exit_worker", {"code": 3}, ErrorCode.WORKER_LOST, "exited with status 3"),
    ("hold_gil", {"seconds": 60}, ErrorCode.WORKER_LOST, "hung (no heartbeat"),
]


@pytest.mark.spec("D2", "D3", "D4")
@pytest.mark.parametrize(
    ("tool", "args", "code", "words"),
    MISBEHAVING,
    ids=[f"{m[0]}-{next(iter(m[1].values()))}" for m in MISBEHAVING],
)
async def test_D2_misbehaving_tool_becomes_an_error_and_its_worker_is_replaced(
    make_pool: PoolFactory,
    workspace: Path,
    tool: str,
    args: dict[str, Any],
    code: ErrorCode,
    words: str,
) -> None:
    # Given a pool with one worker and tight limits (the CPU hog gets a long wall limit:
    # its 1 s of CPU must run out first even when a loaded machine gives it little)
    # (and the GIL holder too: only the missed heartbeats may end it, after 1.5 s).
    wall = 30 if tool in ("burn_cpu", "hold_gil") else 2
    pool = await make_pool(
        min_workers=1,
        max_workers=1,
        limits=LIMITS.merged({"wall_seconds": wall}),
        heartbeat_misses=15,
        cancel_grace=0.5,
    )
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    (old_pid,) = pool.worker_pids().values()
    # When the tool misbehaves
    (result,) = await coordinator.run_turn(session, [ToolCall("c1", tool, args)])
    # Then the call ends with an error result that names the cause
    assert result.is_error
    assert result.error_code is code, result.text
    assert words in result.text
    # and a new worker takes the old one's place
    await replaced(pool, old_pid)
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == "zombie"
    # and the coordinator keeps serving
    assert (await call(coordinator, workspace, "noop")).text == "ok"
    # the failure counts against the tool, like any execute error (D2, P11)
    assert session.breaker.failures(tool) == 1


@pytest.mark.spec("D3")
async def test_D3_memory_hog_is_stopped(make_pool: PoolFactory, workspace: Path) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    coordinator = coordinator_on(pool)
    (old_pid,) = pool.worker_pids().values()
    result = await call(coordinator, workspace, "hog_memory", megabytes=1024)
    assert result.is_error
    # The memory cgroup's OOM killer ends the worker, or (RLIMIT_AS) the allocation
    # fails inside the tool: either way the call met its memory limit (X7).
    assert result.error_code is ErrorCode.LIMIT_EXCEEDED, result.text
    assert f"memory_bytes = {LIMITS.memory_bytes}" in result.text
    await replaced(pool, old_pid)
    assert (await call(coordinator, workspace, "noop")).text == "ok"


@pytest.mark.spec("D3")
@needs("cgroups")
async def test_D3_fork_bomb_meets_the_pids_limit(make_pool: PoolFactory, workspace: Path) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    if "pids" not in pool.cgroup_controllers:
        pytest.skip("no pids cgroup controller here: a fork bomb cannot be contained")
    coordinator = coordinator_on(pool)
    (old_pid,) = pool.worker_pids().values()
    result = await call(coordinator, workspace, "fork_bomb")
    assert result.error_code is ErrorCode.LIMIT_EXCEEDED, result.text  # X7
    assert f"processes = {LIMITS.processes}" in result.text
    assert "Resource temporarily unavailable" in result.text
    assert result.details["usage"]["ended_processes"] >= LIMITS.processes // 2
    await replaced(pool, old_pid)
    assert (await call(coordinator, workspace, "noop")).text == "ok"


def slow_cgroups(
    pool: WorkerPool, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> threading.Event:
    """Make the pool's next worker cgroups wait (in their thread) until the event is
    set — at the test's end at the latest, so that a failing test does not hang."""
    gate = threading.Event()
    request.addfinalizer(gate.set)
    make = pool.processes._make_cgroup

    def made_when_let(worker_id: str) -> Any:
        gate.wait(60)
        return make(worker_id)

    monkeypatch.setattr(pool.processes, "_make_cgroup", made_when_let)
    return gate


def cgroups_of(pool: WorkerPool) -> list[Path]:
    """The worker cgroup directories the pool's tree has, in every hierarchy."""
    tree = pool.processes.cgroups
    assert tree is not None
    return [p for h in tree.hierarchies for p in (h.own / tree.parent).glob(f"{tree._tag}*")]


@pytest.mark.spec("D2")
@needs("cgroups")
async def test_D2_a_cgroup_made_while_the_pool_closes_is_removed_with_it(
    make_pool: PoolFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # Given a pool whose next worker cgroup is being made (off the event loop) when it
    # closes: its worker exited in a call, and the replacement's cgroup waits
    pool = await make_pool(min_workers=1, max_workers=1)
    gate = slow_cgroups(pool, monkeypatch, request)
    coordinator = coordinator_on(pool)
    result = await call(coordinator, workspace, "exit_worker", code=3)
    assert result.error_code is ErrorCode.WORKER_LOST
    await until(lambda: bool(pool.processes._making))
    closing = asyncio.ensure_future(pool.close())
    # Then the pool does not end its closing while a cgroup of its is being made
    done, _ = await asyncio.wait({closing}, timeout=2)
    assert not done  # the cgroup waits for the gate: so does the closing
    # And once it is made, the closing ends, and no cgroup of the pool is left
    gate.set()
    await closing
    assert not pool.processes._making
    assert cgroups_of(pool) == []


@pytest.mark.spec("D2")
@needs("cgroups")
async def test_D2_a_cgroup_made_for_a_worker_forgotten_meanwhile_is_removed(
    make_pool: PoolFactory, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # Given a worker forgotten (as its zygote's death forgets it) while its cgroup is made
    pool = await make_pool(min_workers=1, max_workers=1)
    gate = slow_cgroups(pool, monkeypatch, request)
    before = cgroups_of(pool)
    worker = pool.processes.new_worker("wx", False)
    preparing = asyncio.ensure_future(pool.processes.prepare(worker))
    await until(lambda: "wx" in pool.processes._making)
    pool.processes.forget(worker)
    # When the cgroup is made
    gate.set()
    await preparing
    # Then it was removed at once, never given to the worker
    assert worker.cgroup is None
    assert cgroups_of(pool) == before


@pytest.mark.spec("D2")
@needs("cgroups")
async def test_D2_a_worker_whose_cgroup_cannot_be_made_fails_to_start_saying_so() -> None:
    # Given a pool where no worker cgroup can be made (its file system refuses)
    pool = WorkerPool(PoolConfig(min_workers=1, max_workers=1, tool_modules=(MODULE,)))

    def refused(worker_id: str) -> Any:
        raise PermissionError(13, "Permission denied", f"cgroup of {worker_id}")

    pool.processes._make_cgroup = refused  # type: ignore[method-assign]
    # When it starts, it fails, naming the cause, after its retries; nothing is left
    try:
        with pytest.raises(PoolError, match=r"its cgroup could not be made: .*Permission denied"):
            await pool.start()
    finally:
        await pool.close()
    assert pool.worker_pids() == {}


@pytest.mark.spec("D4")
async def test_D4_setsid_orphan_is_ended_after_the_call(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    coordinator = coordinator_on(pool)
    (old_pid,) = pool.worker_pids().values()
    result = await call(coordinator, workspace, "escape_setsid")
    assert result.text == "escaped"
    assert result.details["usage"]["ended_processes"] == 1
    sleepers = [
        p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "1000"]
    ]
    assert sleepers == []
    await replaced(pool, old_pid)  # a worker that needed cleaning up is not reused


@pytest.mark.spec("D2")
async def test_D2_workers_are_recycled_after_n_calls(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1, max_calls_per_worker=2)
    coordinator = coordinator_on(pool)
    workers = [(await call(coordinator, workspace, "noop")).details["worker"] for _ in range(5)]
    assert workers == ["w1", "w1", "w2", "w2", "w3"]


@pytest.mark.spec("D2")
async def test_D2_workers_are_recycled_when_their_memory_grows(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1, max_worker_rss=1)
    coordinator = coordinator_on(pool)
    # a heartbeat reports the worker's resident memory (read from the pool's record)
    await until(lambda: any(w.rss for w in pool._workers.values()))
    first = (await call(coordinator, workspace, "noop")).details["worker"]
    second = (await call(coordinator, workspace, "noop")).details["worker"]
    assert first != second


# --- limits seen from inside -----------------------------------------------------------


@pytest.mark.spec("D3")
@pytest.mark.parametrize("network", [False, True])
async def test_D3_worker_reports_the_limits_it_was_given(
    make_pool: PoolFactory, workspace: Path, network: bool
) -> None:
    pool = await make_pool()
    coordinator = coordinator_on(pool)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        session = coordinator.open_session(workspace, allow_network=network)
        (result,) = await coordinator.run_turn(
            session, [ToolCall("r", "report_limits", {"port": port})]
        )
    report = json.loads(result.text)
    rl = report["rlimits"]
    assert rl["CORE"] == 0
    assert rl["NOFILE"] == LIMITS.open_files
    assert rl["FSIZE"] == LIMITS.file_size_bytes
    assert report["cpu_used"] < rl["CPU"] <= report["cpu_used"] + LIMITS.cpu_seconds + 1
    if "memory" in pool.cgroup_controllers:
        assert re.search(rf"toolpool-{os.getpid()}/t\d+-w\d+\n", report["cgroup"])
        assert report["cgroup_memory_limit"] == LIMITS.memory_bytes
    else:
        assert rl["AS"] != -1  # RLIMIT_AS bounds the call instead
    if PROFILE.active("netns") and not network:
        assert report["network"].startswith("unreachable")
    else:
        assert report["network"] == "reachable"
    assert report["command_wrote_inside"] is True
    if PROFILE.active("bwrap") or PROFILE.active("landlock"):
        assert report["command_wrote_outside"] is False
    if PROFILE.active("seccomp"):
        assert report["seccomp"] == "2"  # filter mode
        # Its filter, and its command's, came built from the zygote: a worker that
        # builds one starts two ldconfig processes (pyseccomp's find_library).
        assert report["built_seccomp_here"] is False


@pytest.mark.spec("D3")
async def test_D3_tool_and_session_limits_layer_over_the_defaults(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool()
    executor = PoolExecutor(pool, tool_limits={"report_limits": {"file_size_bytes": 4 * MiB}})
    coordinator = Coordinator(tools_in_module(MODULE), executor=executor)
    session = coordinator.open_session(workspace, limits={"open_files": 77})
    (result,) = await coordinator.run_turn(session, [ToolCall("r", "report_limits", {"port": 1})])
    rlimits = json.loads(result.text)["rlimits"]
    assert rlimits["FSIZE"] == 4 * MiB  # the operator's per-tool setting
    assert rlimits["NOFILE"] == LIMITS.open_files  # process-wide, set once per worker
    # A limit that is none is refused where the session opens, not per call (E6)
    with pytest.raises(ValueError, match=r"session option limits = .*'bogus' is not a limit"):
        coordinator.open_session(workspace, limits={"bogus": 1})


# --- interrupts by signals (D4, S4, S5) -------------------------------------------------------


async def started(log: EventLog, *call_ids: str) -> None:
    await until(lambda: {e.call_id for e in log.starts()} >= set(call_ids))
    await asyncio.sleep(0.3)  # let the workers get into the tool


@pytest.mark.spec("D4", "S4")
async def test_D4_interrupt_signals_cancel_calls_and_lets_block_calls_finish(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=2, max_workers=2)
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    log = EventLog()
    calls = [
        ToolCall("cancel", "nap", {"seconds": 60}),
        ToolCall("block", "chore_until", {"name": "release"}),
    ]
    turn = coordinator.submit(session, calls, on_event=log)
    await started(log, "cancel", "block")
    turn.interrupt()
    # the cancelled call ends while the block call still runs (it waits for the test)
    await until(lambda: [e.call_id for e in log.ends()] == ["cancel"])
    (workspace / "release").touch()
    cancelled, finished = await turn
    assert cancelled.error_code is ErrorCode.INTERRUPTED
    assert cancelled.details["escalation"] == "answered"
    assert finished.text == "release appeared"  # it finished, signalled by nothing
    assert [e.call_id for e in log.ends()] == ["cancel", "block"]


@pytest.mark.spec("D4", "S4")
async def test_D4_interrupt_skips_queued_calls(make_pool: PoolFactory, workspace: Path) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    coordinator = coordinator_on(pool, max_tool_concurrency=1)
    session = coordinator.open_session(workspace)
    log = EventLog()
    turn = coordinator.submit(
        session, [ToolCall(str(i), "nap", {"seconds": 60}) for i in range(3)], on_event=log
    )
    await started(log, "0")
    turn.interrupt()
    results = await turn
    assert [r.error_code for r in results] == [
        ErrorCode.INTERRUPTED,
        ErrorCode.SKIPPED,
        ErrorCode.SKIPPED,
    ]


@pytest.mark.spec("D4", "S5")
async def test_D4_abort_cancels_block_calls_too(make_pool: PoolFactory, workspace: Path) -> None:
    pool = await make_pool(min_workers=2, max_workers=2)
    coordinator = coordinator_on(pool)
    session = coordinator.open_session(workspace)
    log = EventLog()
    calls = [
        ToolCall("block", "chore", {"seconds": 60}),
        ToolCall("async", "async_nap", {"seconds": 60}),
    ]
    turn = coordinator.submit(session, calls, on_event=log)
    await started(log, "block", "async")
    turn.abort()
    results = await turn
    assert [r.text for r in results] == ["Tool execution cancelled."] * 2
    assert all(r.details["escalation"] == "answered" for r in results)


@pytest.mark.spec("D4", "S4")
async def test_D4_term_ignoring_tool_is_killed_after_the_grace_period(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1, cancel_grace=0.5)
    coordinator = coordinator_on(pool)
    (old_pid,) = pool.worker_pids().values()
    session = coordinator.open_session(workspace)
    log = EventLog()
    turn = coordinator.submit(
        session, [ToolCall("t", "ignore_term", {"seconds": 60})], on_event=log
    )
    await started(log, "t")
    begun = time.monotonic()
    turn.interrupt()
    (result,) = await turn
    waited = time.monotonic() - begun
    assert result.error_code is ErrorCode.INTERRUPTED
    assert result.details["escalation"] == "killed"
    assert waited >= 0.5  # the grace period was given
    await replaced(pool, old_pid)


@pytest.mark.spec("D4")
async def test_D4_cancel_while_waiting_for_a_worker_never_runs_the_call(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1, hold_calls=False)
    coordinator = coordinator_on(pool)
    first = coordinator.open_session(workspace)
    second = coordinator.open_session(workspace)
    busy = coordinator.submit(first, [ToolCall("a", "chore", {"seconds": 1})])
    waiting = coordinator.submit(second, [ToolCall("b", "nap", {"seconds": 60})])
    await until(lambda: pool.statistics().queued == 1)
    waiting.abort()
    (cancelled,) = await waiting
    assert cancelled.error_code is ErrorCode.CANCELLED
    assert "worker" not in cancelled.details  # no worker ever took it
    assert (await busy)[0].text == "chore done after 1.0"


@pytest.mark.spec("D2")
async def test_D2_a_cancelled_waiter_leaves_the_queue_and_the_worker_serves_others(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1, hold_calls=False)
    coordinator = coordinator_on(pool)
    busy = coordinator.submit(
        coordinator.open_session(workspace), [ToolCall("a", "chore", {"seconds": 0.5})]
    )
    await until(lambda: pool.statistics().workers["busy"] == 1)
    context = CallContext(session_id="s", workspace=str(workspace))
    waiter = asyncio.ensure_future(
        pool.run(
            Execute("b", "nap", {"seconds": 60}, context, LIMITS.to_dict(), {}),
            network=False,
            token=CancelToken(),
            on_progress=lambda _: None,
            limits=LIMITS,
        )
    )
    await until(lambda: pool.statistics().queued == 1)
    waiter.cancel()  # its task itself, as at shutdown: not through the token
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.statistics().queued == 0
    assert (await busy)[0].text == "chore done after 0.5"
    # the freed worker was not handed to the cancelled waiter: it serves the next call
    assert (await call(coordinator, workspace, "nap", seconds=0)).text == "slept 0.0"


# --- the coordinator's death, bad peers, bad configuration ---------------------------------


@pytest.mark.spec("D2")
def test_D2_killing_the_coordinator_leaves_no_worker_alive(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from pathlib import Path
        from toolpool.pool import PoolConfig, WorkerPool

        async def main():
            pool = WorkerPool(PoolConfig(
                min_workers=2, max_workers=2, tool_modules=({MODULE!r},),
                runtime_dir=Path({str(tmp_path / "rt")!r}),  # not /tmp: it is killed
            ))
            await pool.start()
            print(json.dumps([pool.zygote_pid, *pool.worker_pids().values()]), flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    ) as coordinator:
        assert coordinator.stdout is not None
        pids = json.loads(coordinator.stdout.readline())
        assert len(pids) == 3
        assert all(psutil.pid_exists(p) for p in pids)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
    deadline = time.monotonic() + 30  # a hang guard: they die with the zygote
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if psutil.pid_exists(p)] == []


@pytest.mark.spec("D2")
async def test_D2_garbage_on_the_worker_socket_is_logged_and_survived(
    make_pool: PoolFactory, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await make_pool()
    # A frame that reaches the pool from a worker but is garbage is dropped, logged;
    # the parts of a message after it are read all the same.
    (worker_id,) = pool.worker_pids()
    on_frames = pool.supervisor._on_frames
    on_frames([worker_id.encode(), b"\xc1 not msgpack"])
    on_frames([b"no parts"])
    bad_map = b"\x81\xa1t\xa7execute"  # a map, not a message
    on_frames([worker_id.encode(), bad_map, encode(Heartbeat(worker_id, 4242))])
    assert "dropped a message of 1 frame" in caplog.text
    assert "not a msgpack frame" in caplog.text
    assert "bad execute message" in caplog.text
    assert pool._workers[worker_id].rss == 4242
    assert (await call(coordinator_on(pool), workspace, "noop")).text == "ok"


@pytest.mark.spec("X2")
async def test_X2_a_process_that_is_no_worker_cannot_connect_to_the_pool(
    make_pool: PoolFactory, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await make_pool()
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.setsockopt(zmq.ROUTING_ID, b"w99")  # posing as a worker yet to come
    rogue.connect(pool.endpoint)
    try:
        # Not blocking: once the pool refuses the connection, libzmq drops its pipe and a
        # DEALER with no pipe would wait for one forever. Refused first, nothing is sent.
        with contextlib.suppress(zmq.Again):
            rogue.send(b"\x81\xa1t\xa5ready", zmq.NOBLOCK)
        await until(lambda: "refused a local connection" in caplog.text)
    finally:
        rogue.close()
        context.term()
    assert "dropped a" not in caplog.text  # nothing it sent reached the pool
    assert (await call(coordinator_on(pool), workspace, "noop")).text == "ok"


async def test_a_tool_module_that_does_not_import_fails_the_start_clearly(
    workspace: Path,
) -> None:
    pool = WorkerPool(PoolConfig(min_workers=1, tool_modules=("tests.no_such_module",)))
    with pytest.raises(PoolError, match="no_such_module"):
        await pool.start()
    await pool.close()


@pytest.mark.spec("D2")
async def test_D2_a_runtime_dir_too_long_for_a_socket_is_a_clear_pool_error(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    too_long = tmp_path / ("r" * 120)
    with pytest.raises(PoolError, match="more than a Unix socket path may be"):
        await make_pool(runtime_dir=too_long)
