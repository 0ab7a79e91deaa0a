"""The bash tool (SPEC F1, T2; issue "built-in tools"): streaming, caps, timeouts,
cancellation, and no process left behind — in-process and in a real worker."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from toolpool import ErrorCode, ToolCall, ToolResult, ToolSpec, UpdateKind
from toolpool.engine import Coordinator, Session
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.tool import InterruptBehavior
from toolpool.tools.bash import MAX_OUTPUT_CHARS, bash
from toolpool.tools.support.bash_runs import _kill_unstarted

from .support import EventLog, until

_marks = itertools.count(1)


def marker() -> str:
    """A sleep duration no other process uses, to find ours among all processes."""
    return f"{1000 + next(_marks)}.{time.time_ns() % 1_000_000}"


def running(mark: str) -> list[int]:
    """Every process on the machine whose command line mentions ``mark``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if mark in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.info["pid"])
    return found


async def until_gone(mark: str, timeout: float = 30.0) -> list[int]:
    """The processes of ``mark`` still running: none as soon as they are gone, the
    rest after ``timeout``, a hang guard (they end within a second or two)."""
    deadline = time.monotonic() + timeout
    while (left := running(mark)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return left


@pytest.fixture
def session(workspace: Path) -> tuple[Coordinator, Session]:
    coordinator = Coordinator([bash])
    return coordinator, coordinator.open_session(workspace)


async def run(
    session: tuple[Coordinator, Session], command: str, log: EventLog | None = None, **args: object
) -> ToolResult:
    coordinator, sess = session
    call = ToolCall("b", "bash", {"command": command, **args})
    (result,) = await coordinator.run_turn(sess, [call], on_event=log)
    return result


@pytest.mark.spec("F1", "T2")
def test_bash_capabilities() -> None:
    spec = ToolSpec(bash)
    args = {"command": "ls"}
    assert spec.read_only(args) is False  # never read-only, even for ls
    assert spec.concurrency_safe(args) is False
    assert spec.interrupt_behavior(args) is InterruptBehavior.CANCEL
    assert spec.activity({"command": "go test ./..."}) == "Running: go test ./..."
    assert spec.call_limits({"timeout": 600})["wall_seconds"] > 600


@pytest.mark.spec("F1")
async def test_output_and_exit_code(session: tuple[Coordinator, Session]) -> None:
    result = await run(session, "echo out; echo err >&2; pwd; exit 3")
    lines = result.text.splitlines()
    assert not result.is_error  # a failing command is a result the model reads
    assert lines[:2] == ["out", "err"]
    assert Path(lines[2]) == session[1].workspace
    assert lines[-1] == "Exit code: 3"


async def test_stdin_is_empty_and_empty_commands_are_refused(
    session: tuple[Coordinator, Session],
) -> None:
    assert (await run(session, "cat; echo done")).text.splitlines()[0] == "done"
    refused = await run(session, "   ")
    assert refused.error_code is ErrorCode.EXECUTION_FAILED
    assert refused.text == "The command is empty."


async def test_progress_streams_before_the_command_ends(
    session: tuple[Coordinator, Session],
) -> None:
    # The command prints "first", then waits for a file the test creates only once
    # "first" has reached it as progress: had the output been held back until the
    # end, the command would run into its timeout (a hang guard) instead.
    log = EventLog()
    coordinator, sess = session
    release = sess.workspace / "release"
    command = f"echo first; while [ ! -e {release.name} ]; do sleep 0.02; done; echo second"
    turn = coordinator.submit(
        sess, [ToolCall("b", "bash", {"command": command, "timeout": 30})], on_event=log
    )
    await until(lambda: bool(log.updates(UpdateKind.PROGRESS)))
    assert [u.data for u in log.updates(UpdateKind.PROGRESS)] == ["first\n"]
    assert log.ends() == []  # streamed while the command waited for the test
    release.touch()
    (result,) = await turn
    assert result.text == "first\nsecond\nExit code: 0"  # released, not timed out
    assert "".join(u.data for u in log.updates(UpdateKind.PROGRESS)) == "first\nsecond\n"


async def test_huge_output_is_capped_and_the_spill_file_is_complete(
    session: tuple[Coordinator, Session],
) -> None:
    result = await run(session, "seq 1 300000")
    text = result.text
    assert len(text) < MAX_OUTPUT_CHARS + 500
    assert text.startswith("1\n2\n3\n")
    assert "characters left out" in text
    assert "299999\n300000\nExit code: 0" in text
    spill = Path(text.splitlines()[-1].split(": ", 1)[1])
    assert spill.is_relative_to(session[1].scratch_dir)
    assert spill.read_text() == "".join(f"{i}\n" for i in range(1, 300001))
    session[0].close_session(session[1])
    assert not spill.exists()  # the scratch directory goes with the session


async def test_timeout_ends_the_command(session: tuple[Coordinator, Session]) -> None:
    mark = marker()
    started = time.monotonic()
    result = await run(session, f"echo begun; sleep {mark}", timeout=0.5)
    # A hang guard (it ends in about 0.5 s); the sleep alone would take 1000+ s
    assert time.monotonic() - started < 30
    assert result.error_code is ErrorCode.EXECUTION_FAILED
    assert "begun" in result.text
    assert "Command timed out after 0.5 s" in result.text
    assert await until_gone(mark) == []


@pytest.mark.parametrize(
    "template",
    [
        "setsid sleep {mark} > /dev/null 2>&1 & echo started",
        "nohup sleep {mark} > /dev/null 2>&1 & echo started",
        # a background daemon that keeps our stdout open: the call must not hang
        "(trap '' HUP TERM; sleep {mark}) & echo started",
        "setsid sh -c 'sleep {mark}' & echo started",
    ],
    ids=["setsid", "nohup", "holds-stdout", "setsid-holds-stdout"],
)
async def test_background_processes_end_with_the_call(
    session: tuple[Coordinator, Session], template: str
) -> None:
    mark = marker()
    started = time.monotonic()
    result = await run(session, template.format(mark=mark))
    assert result.text.startswith("started")
    # A hang guard: the call ends within the drain (1 s) and the kill grace (2 s);
    # waiting for the background sleep would take 1000+ s
    assert time.monotonic() - started < 30
    assert await until_gone(mark) == []


@pytest.mark.spec("S4")
@pytest.mark.parametrize("ignore_term", [False, True])
async def test_cancel_ends_the_whole_tree(
    session: tuple[Coordinator, Session], ignore_term: bool
) -> None:
    mark = marker()
    trap = "trap '' TERM; " if ignore_term else ""
    coordinator, sess = session
    log = EventLog()
    call = ToolCall("b", "bash", {"command": f"{trap}setsid sleep {mark} & sleep {mark}; wait"})
    turn = coordinator.submit(sess, [call], on_event=log)
    await until(lambda: len(running(mark)) >= 2)
    turn.interrupt()
    (result,) = await turn
    assert result.error_code is ErrorCode.INTERRUPTED
    assert await until_gone(mark) == []


class _StatusPipe:
    """A sandbox's status pipe as ``Confinement.finish`` reads it: to its end."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def finish(self) -> None:
        while os.read(self.fd, 4096):
            pass
        os.close(self.fd)


@pytest.mark.spec("S4")
def test_a_sandbox_cancelled_before_its_start_was_seen_ends_with_what_it_started() -> None:
    # Given a sandbox whose command started, setsid child and all, before its ready
    # byte was read: they hold the status pipe's write end
    status, ready = os.pipe()
    process = subprocess.Popen(
        ["bash", "-c", "setsid sleep 1000 & sleep 1000; wait"],
        pass_fds=(ready,),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    os.close(ready)
    deadline = time.monotonic() + 30  # a hang guard
    while len(psutil.Process(process.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) == 2
    # When a cancel ends it as a sandbox that did not start
    _kill_unstarted(process, _StatusPipe(status))  # type: ignore[arg-type]
    # Then its command went with it (else reading the status to its end never returns):
    # what is left is in its exit (its files closed), gone within the hang guard
    _, alive = psutil.wait_procs(children, timeout=20)
    assert alive == []


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    # cancel_grace far past the worker's answer (milliseconds), so that a slow machine
    # cannot turn "answered" into "killed"
    config = PoolConfig(
        min_workers=1, max_workers=1, tool_modules=("toolpool.tools.bash",), cancel_grace=30
    )
    async with WorkerPool(config) as pool:
        yield pool


@pytest.mark.spec("D4")
async def test_in_a_worker_cancel_reaches_the_command_by_signal(
    pool: WorkerPool, workspace: Path
) -> None:
    coordinator = Coordinator([bash], executor=PoolExecutor(pool))
    session = coordinator.open_session(workspace)
    mark = marker()
    log = EventLog()
    call = ToolCall("b", "bash", {"command": f"echo go; nohup sleep {mark} & sleep {mark}"})
    turn = coordinator.submit(session, [call], on_event=log)
    await until(lambda: bool(log.updates(UpdateKind.PROGRESS)))
    assert log.updates(UpdateKind.PROGRESS)[0].data == "go\n"  # streamed from the worker
    turn.abort()
    (result,) = await turn
    assert result.error_code is ErrorCode.CANCELLED
    assert result.details["escalation"] == "answered"  # the worker's SIGTERM handler did it
    assert await until_gone(mark) == []
    done = await coordinator.run_turn(session, [ToolCall("c", "bash", {"command": "echo ok"})])
    assert done[0].text == "ok\nExit code: 0"
