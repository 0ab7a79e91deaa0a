"""The pool's side of a call, without a process (``tests/pool_fakes.py``): the
callback entry point's contract — ``done`` exactly once, for every way a call ends —
and calls given to workers several to a frame (SPEC H4 at depth N): frames, their
results, cancels of waiting calls, recalls, withdrawals that a later Result
overtakes, and the re-run rule when a worker dies with calls given it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from toolpool import ToolCall, tools_in_module
from toolpool.cancel import CancelSource, CancelToken
from toolpool.engine import Coordinator
from toolpool.pool import PoolError, PoolExecutor, WorkerPool
from toolpool.pool.pool import HOLD_RETRIES
from toolpool.pool.workers import OutcomeStatus
from toolpool.protocol import CallContext, Cancel, Execute, Progress, Shutdown, Withdrawn
from toolpool.sandbox import Limits
from toolpool.sandbox.limits import CgroupLimits
from toolpool.sandbox.session_box import SandboxStartError

from .pool_fakes import LIMITS, Calls, ScriptedProcesses, cancelled, ok, scripted_pool, turn
from .support import until

Make = Callable[..., Awaitable[tuple[WorkerPool, ScriptedProcesses, Calls]]]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    pools: list[WorkerPool] = []

    async def started(**settings: Any) -> tuple[WorkerPool, ScriptedProcesses, Calls]:
        pool, fake = await scripted_pool(**settings)
        pools.append(pool)
        await turn()  # the workers' Ready
        return pool, fake, Calls(pool)

    yield started
    for pool in pools:
        await pool.close()


def held(pool: WorkerPool) -> int:
    return pool.statistics().held


# --- the entry point's contract -----------------------------------------------------


async def test_a_call_that_runs_is_done_once_with_its_result(make: Make) -> None:
    pool, fake, calls = await make()
    calls.submit("a")
    assert calls.done == {}  # submit returns at once; the call goes at the turn's end
    await turn()
    assert fake.executes("w1") == [["a"]]
    fake.reply("w1", Progress("a", 1), ok("a", "done"))
    assert calls.text("a") == "done"
    fake.reply("w1", ok("a", "again"))  # a second Result of it: nothing
    assert len(calls.done["a"]) == 1
    assert pool.statistics().workers["idle"] == 2


async def test_a_queued_call_that_is_cancelled_never_reaches_a_worker(make: Make) -> None:
    pool, fake, calls = await make(hold_calls=False)
    calls.submit("a")
    calls.submit("b")
    calls.submit("c")
    await turn()
    assert pool.statistics().queued == 1
    calls.tokens["c"].cancel(CancelSource.ABORT)
    assert calls.status("c") == "unstarted"  # at once, from the token's callback
    assert [c for sent in fake.executes("w1") + fake.executes("w2") for c in sent] == ["a", "b"]
    calls.tokens["c"].cancel(CancelSource.ABORT)  # again: nothing
    assert len(calls.done["c"]) == 1


async def test_a_call_cancelled_before_it_is_submitted_ends_at_once(make: Make) -> None:
    pool, _fake, _calls = await make()
    token = CancelToken()
    token.cancel(CancelSource.INTERRUPT)
    context = CallContext(session_id="s", workspace="/nowhere")
    got = []
    pool.submit(
        Execute("x", "t", {}, context, {}, {}, pool.ticket()),
        network=False,
        token=token,
        on_progress=print,
        limits=LIMITS,
        done=got.append,
    )
    assert [o.status for o in got] == [OutcomeStatus.UNSTARTED]


async def test_a_running_call_that_is_cancelled_answers_or_is_killed(make: Make) -> None:
    pool, fake, calls = await make(min_workers=1, max_workers=1, cancel_grace=0.05)
    calls.submit("a")
    await turn()
    calls.tokens["a"].cancel(CancelSource.INTERRUPT)
    (cancel,) = fake.control["w1"]
    assert isinstance(cancel, Cancel) and cancel.running
    fake.reply("w1", cancelled("a"))
    outcome = calls.outcome("a")
    assert (outcome.status, outcome.escalation) == (OutcomeStatus.CANCELLED, "answered")
    # Its worker is not used again: it is told to shut down and replaced.
    assert fake.sent["w1"][-1] == [Shutdown("retired")]
    fake.die("w1", code=0)
    await until(lambda: pool.statistics().workers["idle"] == 1)
    # One that does not answer within cancel_grace: its worker is killed.
    calls.submit("b")
    await turn()
    (worker,) = pool.worker_pids()
    calls.tokens["b"].cancel(CancelSource.ABORT)
    await until(lambda: bool(calls.done["b"]))
    outcome = calls.outcome("b")
    assert (outcome.status, outcome.escalation) == (OutcomeStatus.CANCELLED, "killed")
    assert fake.terminated == [(worker, "it did not stop when cancelled and was killed")]


async def test_a_call_past_its_wall_time_is_stopped_as_a_limit(make: Make) -> None:
    _pool, fake, calls = await make(min_workers=1, max_workers=1)
    calls.submit("a", limits=Limits(wall_seconds=0.01))
    await turn()
    await until(lambda: bool(fake.control["w1"]))  # its Cancel
    fake.reply("w1", cancelled("a"))
    outcome = calls.outcome("a")
    assert (outcome.status, outcome.cause) == (OutcomeStatus.LIMIT, "wall time limit of 0.01 s")


@pytest.mark.parametrize("oom", [False, True])
async def test_a_call_whose_worker_dies_ends_lost_or_at_its_memory_limit(
    make: Make, oom: bool
) -> None:
    pool, fake, calls = await make()
    calls.submit("a")
    await turn()
    if oom:
        fake.oom.add("w1")
    fake.die("w1", sig=signal.SIGKILL)
    outcome = calls.outcome("a")
    if oom:
        assert (outcome.status, outcome.cause) == (
            OutcomeStatus.LIMIT,
            f"memory limit (memory_bytes = {LIMITS.memory_bytes})",
        )
    else:
        assert (outcome.status, outcome.cause) == (OutcomeStatus.LOST, "it was killed by SIGKILL")
    await until(lambda: pool.statistics().workers["idle"] == 2)  # replaced


async def test_a_closed_pool_fails_its_calls_and_run_raises(make: Make) -> None:
    pool, _fake, calls = await make(hold_calls=False)
    for name in "abc":
        calls.submit(name)
    await turn()
    await pool.close()
    assert calls.status("c") == "failed" and calls.outcome("c").cause == "the pool is closed"
    assert calls.status("a") == calls.status("b") == "lost"  # given, never answered
    calls.submit("d")
    assert calls.status("d") == "failed"
    context = CallContext(session_id="s", workspace="/nowhere")
    with pytest.raises(PoolError, match="not running"):
        await pool.run(
            Execute("e", "t", {}, context, {}, {}),
            network=False,
            token=CancelToken(),
            on_progress=print,
            limits=LIMITS,
        )


async def test_a_run_whose_task_is_cancelled_gives_its_call_up(make: Make) -> None:
    pool, fake, calls = await make(min_workers=1, max_workers=1)
    calls.submit("a", holdable=False)
    await turn()
    context = CallContext(session_id="s", workspace="/nowhere")
    waiting = asyncio.ensure_future(
        pool.run(
            Execute("b", "t", {}, context, {}, {}, pool.ticket()),
            network=False,
            token=CancelToken(),
            on_progress=print,
            limits=LIMITS,
            holdable=True,
        )
    )
    await turn()
    assert pool.statistics().queued == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pool.statistics().queued == 0
    fake.reply("w1", ok("a"))
    await turn()
    assert fake.executes("w1") == [["a"]]  # b was never sent


# --- several calls to a frame (SPEC H4 at depth N) ------------------------------------


@pytest.mark.spec("H4")
@pytest.mark.parametrize("multipart", [True, False])
async def test_H4_calls_of_one_turn_go_to_the_workers_in_frames_of_N(
    make: Make, multipart: bool
) -> None:
    pool, fake, calls = await make(worker_calls_per_frame=8, multipart_frames=multipart)
    names = [f"c{i}" for i in range(16)]
    for name in names:
        calls.submit(name)
    await turn()
    if multipart:  # one ZeroMQ message of 8 parts to each worker
        assert fake.executes("w1") == [names[:8]]
        assert fake.executes("w2") == [names[8:]]
    else:  # the same calls, a message each
        assert fake.executes("w1") == [[n] for n in names[:8]]
    assert (pool.statistics().held, pool.statistics().queued) == (14, 0)
    # The worker answers several calls in one message: each is read, in order.
    fake.reply("w1", *(ok(n) for n in names[:5]))
    assert calls.order == names[:5]
    fake.reply("w1", *(ok(n) for n in names[5:8]))
    fake.reply("w2", *(ok(n) for n in names[8:]))
    assert calls.order == names
    assert all(calls.status(n) == "ok" for n in names)
    assert pool.statistics().workers["idle"] == 2


@pytest.mark.spec("H4")
async def test_H4_at_most_N_calls_wait_at_a_worker(make: Make) -> None:
    pool, fake, calls = await make(worker_calls_per_frame=3, multipart_frames=True)
    for i in range(10):
        calls.submit(f"c{i}")
    await turn()
    # Frames of 3 (2 held behind each running call); the others wait in the pool.
    assert fake.executes("w1") == [["c0", "c1", "c2"]]
    assert fake.executes("w2") == [["c3", "c4", "c5"]]
    assert (held(pool), pool.statistics().queued) == (4, 4)
    # w1's first call ends: a busy worker may hold 3 behind its running call.
    fake.reply("w1", ok("c0"))
    await turn()
    assert fake.executes("w1")[-1] == ["c6", "c7"]
    assert fake.executes("w2")[-1] == ["c8"]
    assert (held(pool), pool.statistics().queued) == (6, 1)


@pytest.mark.spec("H4")
async def test_H4_below_the_maximum_each_call_gets_a_worker_of_its_own(make: Make) -> None:
    pool, fake, calls = await make(min_workers=1, max_workers=3, multipart_frames=True)
    for name in "abc":
        calls.submit(name)
    await turn()
    assert fake.executes("w1") == [["a"]]  # the others wait for workers that start
    await until(lambda: len(pool.worker_pids()) == 3)
    await turn()
    assert fake.executes("w2") == [["b"]] and fake.executes("w3") == [["c"]]
    assert held(pool) == 0


@pytest.mark.spec("H4")
async def test_H4_only_read_only_calls_of_the_same_limits_wait_behind_others(
    make: Make,
) -> None:
    pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    fake.workers["w1"].cgroup = object()  # type: ignore[assignment]  (its limits matter)
    calls.submit("writer", holdable=False)
    calls.submit("r1")
    await turn()
    assert fake.executes("w1") == [["writer"]]  # nothing behind a call that is not read-only
    fake.reply("w1", ok("writer"))
    await turn()
    assert fake.executes("w1")[-1] == ["r1"]
    big = Limits(wall_seconds=30, memory_bytes=2 << 30)
    calls.submit("r2", limits=big)  # its cgroup would need other limits
    calls.submit("r3")
    calls.submit("w", holdable=False)
    await turn()
    assert fake.executes("w1")[-1] == ["r3"]  # held; r2 and the writer wait in the pool
    assert (held(pool), pool.statistics().queued) == (1, 2)
    fake.reply("w1", ok("r1"), ok("r3"))
    await turn()
    assert fake.executes("w1")[-1] == ["r2"]  # first come first served, its limits set
    assert fake.workers["w1"].cgroup_limits == CgroupLimits.of(big)


@pytest.mark.spec("H4")
async def test_H4_no_two_calls_of_one_id_wait_at_one_worker(make: Make) -> None:
    pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    calls.submit("same")
    calls.submit("other")
    calls.submit("same")  # another session's call with the same id
    await turn()
    assert fake.executes("w1") == [["same", "other"]]
    assert pool.statistics().queued == 1
    fake.reply("w1", ok("same"), ok("other"))
    await turn()
    assert fake.executes("w1")[-1] == ["same"]
    fake.reply("w1", ok("same"))
    assert len(calls.done["same"]) == 2


@pytest.mark.spec("H4")
async def test_H4_a_cancelled_call_waiting_in_a_frame_is_withdrawn_and_only_it(
    make: Make,
) -> None:
    pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    for name in "abcd":
        calls.submit(name)
    await turn()
    assert fake.executes("w1") == [["a", "b", "c", "d"]]
    calls.tokens["c"].cancel(CancelSource.ABORT)
    (cancel,) = fake.control["w1"]  # by its ticket, on the control line
    assert isinstance(cancel, Cancel) and cancel.running
    fake.reply("w1", Withdrawn(cancel.ticket), control=True)
    assert calls.status("c") == "unstarted"
    fake.reply("w1", ok("a"), ok("b"), ok("d"))
    assert [calls.status(n) for n in "abd"] == ["ok"] * 3
    assert pool.statistics().workers["idle"] == 1  # not retired: nothing ran cancelled


@pytest.mark.spec("H4")
async def test_H4_a_result_that_overtakes_a_withdrawal_gives_the_call_back_first(
    make: Make,
) -> None:
    # Given three calls at a worker, the third recalled: the worker withdraws it on its
    # control line, and runs on — the Result of the fourth, on its call line, may come
    # first.
    _pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    for name in "abcd":
        calls.submit(name)
    await turn()
    calls.tokens["c"].cancel(CancelSource.ABORT)
    (cancel,) = fake.control["w1"]
    fake.reply("w1", ok("a"), ok("b"), ok("d"))
    assert calls.order == ["a", "b", "c", "d"]
    assert calls.status("c") == "unstarted" and calls.status("d") == "ok"
    fake.reply("w1", Withdrawn(cancel.ticket), control=True)  # late: nothing more
    assert len(calls.done["c"]) == 1


@pytest.mark.spec("H4")
async def test_H4_calls_held_behind_a_long_one_are_taken_back_for_an_idle_worker(
    make: Make,
) -> None:
    pool, fake, calls = await make(multipart_frames=True)
    for i in range(8):
        calls.submit(f"c{i}")
    await turn()
    assert fake.executes("w1") == [["c0", "c1", "c2", "c3"]]
    assert fake.executes("w2") == [["c4", "c5", "c6", "c7"]]
    fake.reply("w2", *(ok(f"c{i}") for i in range(4, 8)))  # w2 falls idle
    await turn()
    # w1 holds c1..c3 behind its long call: the later half is asked back
    recalled = [m for m in fake.control["w1"] if isinstance(m, Cancel)]
    assert [m.running for m in recalled] == [False, False]
    tickets = [m.ticket for m in recalled]
    fake.reply("w1", *(Withdrawn(t) for t in tickets), control=True)
    await turn()
    assert fake.executes("w2")[-1] == ["c2", "c3"]
    fake.reply("w2", ok("c2"), ok("c3"))
    fake.reply("w1", ok("c0"), ok("c1"))
    assert [calls.status(f"c{i}") for i in range(8)] == ["ok"] * 8
    assert held(pool) == 0


@pytest.mark.spec("H4")
async def test_H4_a_worker_left_unfit_gives_back_its_calls_to_run_elsewhere(
    make: Make,
) -> None:
    _pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    for name in "abc":
        calls.submit(name)
    await turn()
    calls.tokens["a"].cancel(CancelSource.INTERRUPT)
    # The cancelled call answers; the worker, unfit now, gives the others back.
    _, b, c = fake.sent["w1"][0]
    assert isinstance(b, Execute) and isinstance(c, Execute)
    fake.reply("w1", cancelled("a"), Withdrawn(b.ticket), Withdrawn(c.ticket))
    assert calls.status("a") == "cancelled"
    assert fake.sent["w1"][-1] == [Shutdown("retired")]
    fake.die("w1", code=0)
    await until(lambda: bool(fake.executes("w2")))
    assert fake.executes("w2") == [["b", "c"]]
    fake.reply("w2", ok("b"), ok("c"))
    assert calls.status("b") == calls.status("c") == "ok"


@pytest.mark.spec("H4", "D2")
async def test_H4_when_a_worker_dies_with_calls_given_those_not_answered_run_again(
    make: Make,
) -> None:
    _pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    for name in "abcd":
        calls.submit(name)
    await turn()
    fake.reply("w1", ok("a"))  # a ran to its end: its Result came
    fake.die("w1", sig=signal.SIGSEGV)  # b (running, c and d behind it), c, d: in doubt
    assert calls.status("a") == "ok" and not calls.done["b"]
    # Each runs again elsewhere, alone: it may be the crasher.
    await until(lambda: bool(fake.executes("w2")))
    assert fake.executes("w2") == [["b"]]
    fake.die("w2", sig=signal.SIGSEGV)  # b crashed this one, alone
    assert calls.status("b") == "lost"  # nothing was held behind it: it is the crasher
    await until(lambda: bool(fake.executes("w3")))
    assert fake.executes("w3") == [["c"]]
    fake.reply("w3", ok("c"))
    await turn()
    assert fake.executes("w3")[-1] == ["d"]
    fake.reply("w3", ok("d"))
    assert [calls.status(n) for n in "cd"] == ["ok", "ok"]


@pytest.mark.spec("H4", "D2")
async def test_H4_calls_in_doubt_run_again_alone_and_a_crasher_ends_lost(make: Make) -> None:
    # Given two calls at one worker, and every worker they run on dying under them
    pool, fake, calls = await make(min_workers=1, max_workers=1, multipart_frames=True)
    calls.submit("a")
    calls.submit("b")
    await turn()
    ran: dict[str, list[str]] = {"a": [], "b": []}
    for n in range(1, 2 + 2 * HOLD_RETRIES):
        worker = f"w{n}"
        if not fake.workers.get(worker):
            break
        await until(lambda w=worker: bool(fake.executes(w)) or bool(calls.done["b"]))
        for call_id in (c for sent in fake.executes(worker) for c in sent):
            ran[call_id].append(worker)
        fake.die(worker, sig=signal.SIGSEGV)
        await turn()
        if calls.done["a"] and calls.done["b"]:
            break
    # Then each ran once more, alone, on a worker of its own, and ended lost there:
    # alone, it was the crasher. No call ran more than 1 + HOLD_RETRIES times.
    assert ran == {"a": ["w1", "w2"], "b": ["w1", "w3"]}
    assert calls.status("a") == calls.status("b") == "lost"
    assert pool.statistics().queued == 0


# --- the executor: what is the same for every call of a session, made once -----------


async def test_a_sessions_context_and_limits_are_made_once_and_stay_its_own(
    make: Make, tmp_path: Path
) -> None:
    pool, fake, _ = await make(min_workers=1, max_workers=1, hold_calls=False)
    executor = PoolExecutor(pool, tool_limits={"noop": {"open_files": 99}})
    coordinator = Coordinator(tools_in_module("tests.worker_tools"), executor=executor)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()

    async def one(session: Any, call_id: str) -> Execute:
        turn = coordinator.submit(session, [ToolCall(call_id, "noop", {})])
        await until(lambda: any(call_id in sent for sent in fake.executes("w1")))
        execute = fake.sent["w1"][-1][0]
        assert isinstance(execute, Execute)
        fake.reply("w1", ok(call_id))
        (result,) = await turn
        assert result.text == "ok"
        return execute

    session = coordinator.open_session(first, session_id="s1", limits={"processes": 7})
    a, b = await one(session, "a"), await one(session, "b")
    assert a.context == b.context and a.context.workspace == str(first)
    assert a.limits == b.limits and (a.limits["processes"], a.limits["open_files"]) == (7, 99)
    assert len(executor._contexts) == len(executor._limits) == 1  # made once
    # A new session of the same id, after the first closed, has its own.
    coordinator.close_session(session)
    again = coordinator.open_session(second, session_id="s1")
    c = await one(again, "c")
    assert c.context.workspace == str(second) and c.limits["processes"] != 7
    coordinator.close()


# --- a policy session's own workers (N11) -------------------------------------------------


def _policy_call(pool: WorkerPool, calls: Calls, call_id: str, session_id: str) -> None:
    """A call of a policy session (its context names its proxy's key: ``egress``)."""
    context = CallContext(session_id=session_id, workspace="/nowhere", egress="key")
    execute = Execute(call_id, "t", {}, context, LIMITS.to_dict(), {}, pool.ticket())

    def done(outcome: Any) -> None:
        calls.done[call_id].append(outcome)
        calls.order.append(call_id)

    pool.submit(
        execute,
        network=False,
        token=CancelToken(),
        on_progress=lambda _: None,
        limits=LIMITS,
        done=done,
    )


@pytest.mark.spec("N11")
async def test_N11_a_policy_sessions_call_runs_on_a_worker_of_its_own_in_its_namespace(
    make: Make,
) -> None:
    pool, fake, calls = await make()
    made: list[str] = []

    def namespace(session_id: str) -> tuple[str, int]:
        made.append(session_id)
        return f"/run/netns/{session_id}", 4242

    pool.supervisor.netns_of = namespace
    # When a policy session's call and another session's come together
    _policy_call(pool, calls, "p1", "policy")
    calls.submit("plain")
    await until(lambda: _settled(fake, calls, "p1", "plain"))
    # Then the policy session's ran on a new worker, forked into its namespace, which
    # the pool had made for it first; the other session's on a shared worker
    (own,) = [w for w in fake.workers.values() if w.binding is not None]
    assert made == ["policy"]
    assert (own.netns, own.netns_inode) == ("/run/netns/policy", 4242)
    assert own.binding is not None and own.binding.egress
    assert fake.executes(own.id) == [["p1"]]
    assert ["plain"] in fake.executes("w1") + fake.executes("w2")
    assert calls.status("p1") == "ok" and calls.status("plain") == "ok"


@pytest.mark.spec("N11")
async def test_N11_a_namespace_that_cannot_be_made_ends_the_calls_waiting_and_the_next_tries_again(
    make: Make,
) -> None:
    pool, fake, calls = await make()

    def no_room(session_id: str) -> tuple[str, int]:
        raise SandboxStartError("the namespace could not be made: no room")

    pool.supervisor.netns_of = no_room
    # When the session's namespace cannot be made
    _policy_call(pool, calls, "p1", "policy")
    await until(lambda: "p1" in calls.done)
    # Then its waiting call ends, saying why, and no worker ran it outside the namespace
    assert calls.status("p1") == "failed"
    assert "the session's network" in str(calls.outcome("p1").cause)
    assert all(w.binding is None for w in fake.workers.values())
    # And the session's next call tries again, and runs once the namespace is made
    pool.supervisor.netns_of = lambda session_id: (f"/run/netns/{session_id}", 7)
    _policy_call(pool, calls, "p2", "policy")
    await until(lambda: _settled(fake, calls, "p2"))
    assert calls.status("p2") == "ok"


def _settled(fake: ScriptedProcesses, calls: Calls, *call_ids: str) -> bool:
    """Whether the calls are done; meanwhile every call a worker was given and that
    is not done is answered, as the worker would (an ``until`` step)."""
    for worker_id, sent in fake.sent.items():
        for message in sent:
            for part in message:
                if isinstance(part, Execute) and part.call_id not in calls.done:
                    fake.reply(worker_id, ok(part.call_id))
    return all(call_id in calls.done for call_id in call_ids)
