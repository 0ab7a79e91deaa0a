"""SPEC H4 with real workers: a busy worker holds the next read-only call, and a
cancel reaches exactly the call it names — the held one never starts, the running
one is the only one signalled — tried at random moments, and around every way a
held call can end: cancelled, taken back for an idle worker, given back by an unfit
worker, lost with its worker. The same at depth N (``worker_calls_per_frame``), with
real workers and, many times over, with thread workers that speak the protocol's
several calls to a message (``tests/fake_workers.py``), crashing ones among them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolpool import tools_in_module
from toolpool.cancel import Cancelled, CancelSource, CancelToken
from toolpool.pool import PoolConfig, WorkerPool
from toolpool.pool.pool import HOLD_RETRIES
from toolpool.pool.workers import OutcomeStatus, PoolOutcome
from toolpool.protocol import CallContext, CallStatus, Execute
from toolpool.registry import ToolRegistry
from toolpool.sandbox import Limits
from toolpool.sandbox.limits import MiB
from toolpool.worker.runner import Runner, _Running

from .fake_workers import FakeWorkers
from .support import PoolFactory, pool_factory, until

MODULE = "tests.worker_tools"
ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits(wall_seconds=30, cpu_seconds=10, memory_bytes=192 * MiB, processes=48)
SETTINGS: dict[str, Any] = {
    "tool_modules": (MODULE,),
    "heartbeat_interval": 0.1,
    "heartbeat_misses": 300,
    "cancel_grace": 30,  # a cancel is answered, never escalated to a kill, here
    "limits": LIMITS,
}


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    async with pool_factory(**SETTINGS) as make:
        yield make


def run(
    pool: WorkerPool,
    workspace: Path,
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
    token: CancelToken | None = None,
    *,
    holdable: bool = True,
) -> asyncio.Future[PoolOutcome]:
    """A call on the pool, as a task; ``holdable`` as PoolExecutor says it for a
    read-only tool."""
    context = CallContext(session_id="s", workspace=str(workspace))
    execute = Execute(call_id, tool, arguments, context, LIMITS.to_dict(), {}, pool.ticket())
    return asyncio.ensure_future(
        pool.run(
            execute,
            network=False,
            token=token or CancelToken(),
            on_progress=lambda _: None,
            limits=LIMITS,
            holdable=holdable,
        )
    )


async def held_behind(
    pool: WorkerPool,
    workspace: Path,
    tool: str,
    arguments: dict[str, Any],
    token: CancelToken | None = None,
) -> tuple[asyncio.Future[PoolOutcome], asyncio.Future[PoolOutcome]]:
    """A call of ``tool`` on the pool's one busy worker, and a ``marked_nap`` named
    "b" held behind it (``token`` its cancel), once the pool says it holds it."""
    first = run(pool, workspace, "a", tool, arguments)
    await until(lambda: pool.statistics().workers["busy"] == 1)
    held = run(pool, workspace, "b", "marked_nap", {"name": "b", "seconds": 0}, token)
    await until(lambda: pool.statistics().held == 1)
    return first, held


def marks(workspace: Path, name: str) -> int:
    """How often the call ``name`` (a ``marked_nap``) started."""
    mark = workspace / f"started-{name}"
    return len(mark.read_text()) if mark.exists() else 0


def text(outcome: PoolOutcome) -> str:
    assert outcome.result is not None, outcome
    return str(outcome.result["content"][0]["text"])


@pytest.mark.spec("H4")
async def test_H4_at_its_maximum_a_busy_worker_holds_the_next_read_only_call(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    first, held = await held_behind(pool, workspace, "wait_for", {"name": "go"})
    # A call that may not be held (not read-only) waits for a worker instead.
    queued = run(pool, workspace, "c", "noop", {}, holdable=False)
    await until(lambda: pool.statistics().queued == 1)
    assert marks(workspace, "b") == 0  # held, not started: the call before runs
    (workspace / "go").touch()
    a, b, c = await asyncio.gather(first, held, queued)
    assert (text(a), text(b), text(c)) == ("go appeared", "b slept", "ok")
    assert a.worker_id == b.worker_id == c.worker_id
    assert marks(workspace, "b") == 1
    stats = pool.statistics()
    assert (stats.held, stats.queued, stats.workers["busy"], stats.started) == (0, 0, 0, 1)


@pytest.mark.spec("H4")
async def test_H4_a_held_call_that_is_cancelled_never_starts(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    token = CancelToken()
    first, held = await held_behind(pool, workspace, "wait_for", {"name": "go"}, token)
    token.cancel(CancelSource.ABORT)
    assert (await held).status is OutcomeStatus.UNSTARTED  # while the call before runs
    assert not first.done()
    (workspace / "go").touch()
    assert text(await first) == "go appeared"  # the cancel did not reach it
    await pool.close()
    assert marks(workspace, "b") == 0
    assert pool.statistics().started == 1  # and the worker was not replaced for it


@pytest.mark.spec("H4", "D4")
async def test_H4_cancelling_the_running_call_leaves_the_held_one_alone(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    token = CancelToken()
    first = run(pool, workspace, "a", "marked_nap", {"name": "a", "seconds": 60}, token)
    await until(lambda: marks(workspace, "a") == 1)
    held = run(pool, workspace, "b", "marked_nap", {"name": "b", "seconds": 0})
    await until(lambda: pool.statistics().held == 1)
    token.cancel(CancelSource.ABORT)
    a, b = await asyncio.gather(first, held)
    assert a.status is OutcomeStatus.CANCELLED
    assert text(b) == "b slept"
    # The cancelled call left its worker unfit: it gave the held call back unstarted,
    # and the call ran, once, on the worker that replaced it.
    assert b.worker_id != a.worker_id
    assert marks(workspace, "b") == 1


@pytest.mark.spec("H4")
async def test_H4_a_call_held_behind_a_long_one_moves_to_a_worker_that_falls_idle(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=2, max_workers=2)
    long = run(pool, workspace, "a", "wait_for", {"name": "go"})
    short = run(pool, workspace, "c", "nap", {"seconds": 0.2})
    await until(lambda: pool.statistics().workers["busy"] == 2)
    held = run(pool, workspace, "b", "marked_nap", {"name": "b", "seconds": 0})
    # Wherever it was held, it ends while the long call still runs: behind the short
    # one it runs next; behind the long one it is taken back when the other worker
    # falls idle.
    b = await held
    assert text(b) == "b slept"
    assert not long.done()
    (workspace / "go").touch()
    a, c = await asyncio.gather(long, short)
    assert b.worker_id == c.worker_id != a.worker_id
    assert marks(workspace, "b") == 1


@pytest.mark.spec("H4", "D2")
async def test_H4_a_held_call_runs_again_elsewhere_when_its_worker_dies(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    doomed, held = await held_behind(pool, workspace, "exit_when", {"name": "boom"})
    (workspace / "boom").touch()
    a, b = await asyncio.gather(doomed, held)
    assert a.status is OutcomeStatus.LOST  # on every worker it ran on (it ran again:
    assert text(b) == "b slept"  # a call was held behind it); no collateral failure
    assert b.worker_id != a.worker_id
    assert marks(workspace, "b") == 1


@pytest.mark.spec("H4", "D2")
async def test_H4_a_held_call_that_crashes_its_worker_costs_the_call_before_nothing(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool(min_workers=1, max_workers=1)
    first = run(pool, workspace, "a", "marked_nap", {"name": "a", "seconds": 0.3})
    await until(lambda: marks(workspace, "a") == 1)
    crasher = run(pool, workspace, "c", "vanish", {})
    await until(lambda: pool.statistics().held == 1)
    a, c = await asyncio.gather(first, crasher)
    # The crash may have come before the first call's result left the worker: then
    # the first call, read-only, ran again elsewhere. Either way it is not lost.
    assert text(a) == "a slept"
    assert 1 <= marks(workspace, "a") <= 2
    assert c.status is OutcomeStatus.LOST  # the crasher itself, after its retry
    # Behind a call that is not read-only (which could not run again), nothing waits.
    writer = run(pool, workspace, "w", "wait_for", {"name": "go"}, holdable=False)
    await until(lambda: pool.statistics().workers["busy"] == 1)
    reader = run(pool, workspace, "r", "noop", {})
    await until(lambda: pool.statistics().queued == 1)
    assert pool.statistics().held == 0
    (workspace / "go").touch()
    assert [text(o) for o in await asyncio.gather(writer, reader)] == ["go appeared", "ok"]


# --- random cancel timings -------------------------------------------------------------------

# A call: how long it naps (ms), and when it is cancelled (ms after the scenario
# began), or not. The calls' ends fall among the cancels, on either side of the moment
# a held call starts; with two workers, held calls are also taken back for an idle one.
_CALL = st.tuples(
    st.integers(min_value=0, max_value=60), st.none() | st.integers(min_value=0, max_value=50)
)
Scenario = list[tuple[int, int | None]]


async def _cancel_after(delay: int | None, token: CancelToken) -> None:
    if delay is not None:
        await asyncio.sleep(delay / 1000)
        token.cancel(CancelSource.ABORT)


async def _scenarios(
    workspace: Path, workers: int, scenarios: list[Scenario], depth: int = 1
) -> None:
    """Each scenario's calls go to the pool at once — beyond ``workers``, they are
    held (up to ``depth`` at a worker) or queued — each maybe cancelled after its
    delay: every call not cancelled ends ok; a call ended unstarted never ran; none
    ran twice; each scenario ends (no call is left waiting) with nothing busy, held or
    queued."""
    sizes = {"min_workers": workers, "max_workers": workers, "worker_calls_per_frame": depth}
    pool = WorkerPool(PoolConfig(**{**SETTINGS, **sizes}))
    await pool.start()
    ended: list[tuple[str, OutcomeStatus]] = []
    try:
        for i, calls in enumerate(scenarios):
            tokens = [CancelToken() for _ in calls]
            names = [f"{i}-{j}" for j in range(len(calls))]
            running = [
                run(
                    pool, workspace, name, "marked_nap", {"name": name, "seconds": ms / 1000}, token
                )
                for name, (ms, _), token in zip(names, calls, tokens, strict=True)
            ]
            cancels = [_cancel_after(c, t) for (_, c), t in zip(calls, tokens, strict=True)]
            await asyncio.gather(*cancels)
            outcomes = await asyncio.wait_for(asyncio.gather(*running), 60)  # a hang guard
            for name, (_, cancel), outcome in zip(names, calls, outcomes, strict=True):
                if cancel is None:
                    assert outcome.status is OutcomeStatus.OK, (name, outcome)
                else:
                    assert outcome.status in (
                        OutcomeStatus.OK,
                        OutcomeStatus.CANCELLED,
                        OutcomeStatus.UNSTARTED,
                    ), (name, outcome)
                ended.append((name, outcome.status))
            stats = pool.statistics()
            assert (stats.workers["busy"], stats.held, stats.queued) == (0, 0, 0), (i, stats)
    finally:
        await pool.close()  # every worker gone: nothing can start after this
    for name, status in ended:
        ran = marks(workspace, name)
        assert ran <= 1, (name, ran)
        if status is OutcomeStatus.UNSTARTED:
            assert ran == 0, name  # withdrawn: it never started
        if status is OutcomeStatus.OK:
            assert ran == 1, name


@pytest.mark.spec("H4", "D4")
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    workers=st.sampled_from([1, 2]),
    depth=st.sampled_from([1, 4]),
    scenarios=st.lists(st.lists(_CALL, min_size=2, max_size=9), min_size=8, max_size=8),
)
def test_H4_at_random_cancel_timings_a_cancel_reaches_only_its_call(
    tmp_path: Path, workers: int, depth: int, scenarios: list[Scenario]
) -> None:
    workspace = tmp_path / f"ws{len(list(tmp_path.iterdir()))}"
    workspace.mkdir()
    asyncio.run(_scenarios(workspace, workers, scenarios, depth))


LOST, UNSTARTED = OutcomeStatus.LOST, OutcomeStatus.UNSTARTED

# A call on thread workers: how long it naps (ms), when it is cancelled (ms), whether
# it crashes its worker (when it starts).
_FAKE_CALL = st.tuples(
    st.integers(min_value=0, max_value=20),
    st.none() | st.integers(min_value=0, max_value=15),
    st.sampled_from([False] * 7 + [True]),
)
FakeScenario = list[tuple[int, int | None, bool]]


async def _fake_scenarios(
    workers: int, depth: int, multipart: bool, scenarios: list[FakeScenario]
) -> None:
    """As ``_scenarios``, on thread workers, some calls crashing theirs: a call that
    is not cancelled and does not crash ends ok, however many crashed beside it (a
    crash is never another call's failure); a crasher ends lost (or, cancelled, may
    end as cancelled); no call starts more
    than 1 + HOLD_RETRIES times; without a crash among them, a call ended unstarted
    never started and none started twice."""
    settings = {
        "min_workers": workers,
        "max_workers": workers,
        "worker_calls_per_frame": depth,
        "multipart_frames": multipart,
        "heartbeat_misses": 10**6,
        "cancel_grace": 30,
        "limits": LIMITS,
    }
    pool = WorkerPool(PoolConfig(**settings), processes=FakeWorkers)
    await pool.start()
    fake = pool.processes
    assert isinstance(fake, FakeWorkers)
    context = CallContext(session_id="s", workspace="/nowhere")
    try:
        for i, calls in enumerate(scenarios):
            tokens = [CancelToken() for _ in calls]
            names = [f"{i}-{j}" for j in range(len(calls))]
            running = []
            for name, (ms, _, crash), token in zip(names, calls, tokens, strict=True):
                tool, arguments = ("crash", {}) if crash else ("nap", {"seconds": ms / 1000})
                execute = Execute(name, tool, arguments, context, {}, {}, pool.ticket())
                running.append(
                    pool.run(
                        execute,
                        network=False,
                        token=token,
                        on_progress=print,
                        limits=LIMITS,
                        holdable=True,
                    )
                )
            cancels = [_cancel_after(c, t) for (_, c, _), t in zip(calls, tokens, strict=True)]
            outcomes, _ = await asyncio.wait_for(
                asyncio.gather(asyncio.gather(*running), asyncio.gather(*cancels)), 60
            )
            crashed = any(crash for _, _, crash in calls)
            for name, (_, cancel, crash), outcome in zip(names, calls, outcomes, strict=True):
                status, started = outcome.status, fake.starts[name]
                assert started <= 1 + HOLD_RETRIES, (name, started)
                if crash and cancel is None:
                    assert status is OutcomeStatus.LOST, (name, outcome)
                elif crash:
                    assert status in (LOST, OutcomeStatus.CANCELLED, UNSTARTED), (name, outcome)
                elif cancel is None:
                    assert status is OutcomeStatus.OK, (name, outcome)
                else:
                    assert status in (
                        OutcomeStatus.OK,
                        OutcomeStatus.CANCELLED,
                        OutcomeStatus.UNSTARTED,
                    ), (name, outcome)
                if not crashed:
                    assert started <= 1, (name, started)
                    if status is OutcomeStatus.UNSTARTED:
                        assert started == 0, name
            stats = pool.statistics()
            assert (stats.held, stats.queued) == (0, 0), (i, stats)
    finally:
        await pool.close()


@pytest.mark.spec("H4", "D2", "D4")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.sampled_from([1, 2]),
    depth=st.sampled_from([1, 3, 8]),
    multipart=st.booleans(),
    scenarios=st.lists(st.lists(_FAKE_CALL, min_size=2, max_size=12), min_size=6, max_size=6),
)
def test_H4_at_depth_N_a_cancel_reaches_only_its_call_and_a_crash_only_its_crasher(
    workers: int, depth: int, multipart: bool, scenarios: list[FakeScenario]
) -> None:
    asyncio.run(_fake_scenarios(workers, depth, multipart, scenarios))


# --- the worker's side, with a stand-in for its channel ----------------------------------------


class _Line:
    """What the runner asks of its channel: the ticket the last cancel signal that the
    worker raised itself is for (``Channel.take_cancel_target``), and progress."""

    def __init__(self) -> None:
        self.target: int | None = None

    def take_cancel_target(self) -> int | None:
        target, self.target = self.target, None
        return target

    def send(self, message: object) -> None:
        pass


def worker_side_checks(workspace: Path) -> None:
    """Run in a process of its own (``test_H4_the_worker_cancels_only_…``): a runner
    moves its process's rlimits and ends its children, as a worker's should."""
    line = _Line()
    runner = Runner(
        ToolRegistry(tools_in_module(MODULE)),
        line,  # type: ignore[arg-type]
        limit_address_space=False,
    )
    runner._running = _Running(ticket=2)
    line.target = 1  # raised for the call before, which ended before it was handled
    runner._on_cancel(signal.SIGTERM, None)  # nothing: never the next call
    line.target = 2
    with pytest.raises(Cancelled):
        runner._on_cancel(signal.SIGTERM, None)
    line.target = None  # from outside (the pool closing): the running call
    with pytest.raises(Cancelled):
        runner._on_cancel(signal.SIGTERM, None)
    # Raised for a call given the worker whose tool has not yet begun: it never does.
    runner._running = None
    line.target = 3
    runner._on_cancel(signal.SIGTERM, None)
    context = CallContext(session_id="s", workspace=str(workspace))
    early = {"name": "early", "seconds": 0}
    result = runner.run(Execute("c", "marked_nap", early, context, LIMITS.to_dict(), {}, 3))
    assert result.status is CallStatus.CANCELLED
    assert marks(workspace, "early") == 0
    # The next call is not touched by it.
    later = {"name": "later", "seconds": 0}
    result = runner.run(Execute("d", "marked_nap", later, context, LIMITS.to_dict(), {}, 4))
    assert result.status is CallStatus.OK
    assert marks(workspace, "later") == 1
    runner.close()


@pytest.mark.spec("H4", "D4")
def test_H4_the_worker_cancels_only_the_call_its_signal_was_raised_for(workspace: Path) -> None:
    code = (
        "from pathlib import Path\n"
        "from tests.test_pool_holding import worker_side_checks\n"
        f"worker_side_checks(Path({str(workspace)!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
