"""SPEC V5: a background shell runs in its session's sandbox, through a real daemon
(every call here on a new worker) and real processes.

What it shares with the session's foreground commands (the sandbox, its /tmp) and
what it does not (another session's; their processes, the helper's); that what ends
it still ends everything it started, that its own cgroup and rlimits are still its
limits, and that a sandbox that dies under it, or cannot start it, is told apart.

Every shell's processes are found by a marker in their command line (a sleep of an
odd length, ``shell_support.marker``): "none left" means no live process carries it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from toolpool import Client, ErrorCode, ToolCall, ToolResult
from toolpool.engine import Coordinator
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.sandbox.cgroups import CgroupTree
from toolpool.sandbox.profile import SandboxProfile
from toolpool.tools.bash import bash

from .daemon_support import Daemon, running, running_daemon, shared_daemon
from .shell_support import (
    call,
    marked,
    marker,
    output_part,
    shell_status,
    sleeping,
    start,
    wait_state,
    wait_until,
)
from .support import until

PROFILE = SandboxProfile.probe()
pytestmark = pytest.mark.skipif(not PROFILE.active("session"), reason="no session sandboxes")
_TREE = CgroupTree.probe() if PROFILE.active("cgroups") else None
CONTROLLERS = frozenset() if _TREE is None else _TREE.controllers


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("bg-in-session")
    with shared_daemon(tmp, "--max-calls-per-worker", "1") as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as connected:
        yield connected


def output(result: ToolResult) -> str:
    """A foreground command's output (its exit code line cut)."""
    assert not result.is_error, result.text
    return result.text.rsplit("\nExit code:", 1)[0]


def holder(client: Client, session: Any) -> int:
    """The pid of the session's (one) sandbox's holder."""
    (sandbox,) = client.status()["sessions"][session.id]["sandboxes"]
    assert sandbox["state"] == "running", sandbox
    return int(sandbox["pid"])


def finished(client: Client, session: Any, command: str) -> str:
    """A background shell's whole output, once it exited."""
    shell_id, _ = start(session, command)
    wait_state(client, session, shell_id, "exited")
    return output_part(call(session, "bash_output", shell_id=shell_id))


def under(pid: int, ancestor: int) -> bool:
    try:
        return ancestor in {p.pid for p in psutil.Process(pid).parents()}
    except psutil.NoSuchProcess:
        return False


# --- what it shares, what it does not --------------------------------------------------------


@pytest.mark.spec("V5", "V1", "F6")
def test_V5_a_background_shell_and_the_foreground_share_the_sessions_tmp_and_no_other(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    mark = marker()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with client.session(workspace) as session, client.session(elsewhere) as other:
        # Given a file a foreground command left in the session's /tmp.
        output(call(session, "bash", command="echo from-foreground > /tmp/fg"))
        # When a background shell reads it and leaves one of its own.
        read = finished(client, session, "cat /tmp/fg && echo from-background > /tmp/bg")
        # Then it read the foreground's, and the next foreground command reads its.
        assert read == "from-foreground"
        assert output(call(session, "bash", command="cat /tmp/bg")) == "from-background"
        # And another session's shell sees neither: its /tmp is its own.
        seen = finished(client, other, "ls -A /tmp; cat /tmp/fg /tmp/bg 2>&1 | wc -l")
        assert "fg" not in seen.split() and "bg" not in seen.split()
        # It runs in the session's one sandbox: under its holder, no sandbox of its own.
        shell_id, _ = start(session, f"sleep {mark}")
        wait_until(lambda: sleeping(mark) == 1, "the shell sleeps")
        box = holder(client, session)
        (sleeper,) = marked(mark, sleeps_only=True)
        assert under(sleeper, box)
        status = shell_status(client, session, shell_id)
        assert status is not None and under(int(status["pid"]), box)
        assert [p.pid for p in psutil.Process(sleeper).parents() if p.name() == "bwrap"] == [
            psutil.Process(box).ppid()
        ]  # the session's own bubblewrap is the only one above it
        call(session, "kill_shell", shell_id=shell_id)
    assert marked(mark) == []


@pytest.mark.spec("V5", "V10")
def test_V5_its_environment_start_directory_and_rlimits_are_a_shells(
    client: Client, workspace: Path
) -> None:
    limits = {"open_files": 321, "file_size_bytes": 3 << 20, "cpu_seconds": 7}
    probe = (
        "pwd; echo $HOME $TERM $PAGER; ulimit -n; ulimit -f; ulimit -St; ulimit -Ht; "
        "ulimit -c; ulimit -v; read -t 1 line; echo stdin:$?:$line; ls /proc/self/fd | wc -l; "
        "head -c 4194304 /dev/zero 2>/dev/null > /tmp/big; echo fsize:$?:$(stat -c %s /tmp/big)"
    )
    with client.session(workspace, limits=limits) as session:
        output(call(session, "bash", command="mkdir -p deep && cd deep"))
        lines = finished(client, session, probe).splitlines()
    memory = "unlimited" if "memory" in CONTROLLERS else str((1024 << 20) // 1024)
    assert lines[:3] == [str(workspace / "deep"), "/tmp/home dumb cat", "321"]
    # file size in 1024-byte blocks; CPU: SIGXCPU at 7 s, the kernel's SIGKILL at 8
    assert lines[3:8] == [str(3 << 10), "7", "8", "0", memory]
    # stdin is /dev/null (read meets its end at once); only stdio is open, and ls's own
    assert lines[8] == "stdin:1:"
    assert int(lines[9]) <= 4
    # a write past file_size_bytes fails (EFBIG), as in a shell's own sandbox: SIGXFSZ
    # is ignored, the writer not killed (128 + SIGXFSZ) by it
    assert lines[10] == f"fsize:1:{3 << 20}"


# --- what ends it ----------------------------------------------------------------------------


@pytest.mark.spec("V5", "F6")
def test_V5_kill_shell_ends_all_it_started_and_nothing_else_of_the_sandbox(
    client: Client, workspace: Path
) -> None:
    own, escaped, nohup, forked, stubborn = (marker() for _ in range(5))
    command = (
        f"setsid sleep {escaped} & nohup sleep {nohup} >/dev/null 2>&1 & "
        f"(sleep {forked} &) ; (trap '' TERM; sleep {stubborn}) & sleep {own}"
    )
    marks = (own, escaped, nohup, forked, stubborn)
    with client.session(workspace) as session:
        output(call(session, "bash", command="echo kept > /tmp/kept"))
        box = holder(client, session)
        shell_id, _ = start(session, command)
        wait_until(lambda: all(sleeping(m) == 1 for m in marks), "all five sleeping")
        status = shell_status(client, session, shell_id)
        assert status is not None
        init = int(status["pid"])
        # When it is killed.
        killed = call(session, "kill_shell", shell_id=shell_id)
        assert not killed.is_error, killed.text
        # Then once kill_shell answered nothing of it runs — its init neither — but
        # the session's sandbox runs on, its /tmp as it was.
        assert [marked(m) for m in marks] == [[]] * 5
        assert not running(init)
        assert running(box) and holder(client, session) == box
        assert output(call(session, "bash", command="cat /tmp/kept")) == "kept"


@pytest.mark.spec("V5", "F6")
def test_V5_closing_the_session_ends_its_shells_and_its_sandbox(
    client: Client, workspace: Path
) -> None:
    mark = marker()
    with client.session(workspace) as session:
        start(session, f"setsid sleep {mark} & (sleep {mark} &); sleep {mark}")
        wait_until(lambda: sleeping(mark) == 3, "all three sleeping")
        box = holder(client, session)
    wait_until(lambda: marked(mark) == [] and not running(box), "the shell and its sandbox ended")


@pytest.mark.spec("V5", "F6")
def test_V5_a_shell_that_exits_leaves_nothing_running(client: Client, workspace: Path) -> None:
    mark = marker()
    with client.session(workspace) as session:
        shell_id, _ = start(session, f"setsid sleep {mark} & (sleep {mark} &); echo out")
        wait_state(client, session, shell_id, "exited")
        # exited means over: what it left running was ended with its namespace
        wait_until(lambda: marked(mark) == [], "what it left running ended")
        assert output_part(call(session, "bash_output", shell_id=shell_id)) == "out"


@pytest.mark.spec("V5", "L9")
@pytest.mark.parametrize(
    ("command", "limits", "controller", "reason", "limit"),
    [
        pytest.param(
            "python3 -I -S -c 'x = \"x\" * (1 << 30)'",
            {"memory_bytes": 128 << 20},
            "memory",
            "it ran out of memory (memory_bytes = 134217728)",
            ("memory_bytes", 128 << 20),
            id="memory",
        ),
        pytest.param(
            "for i in $(seq 40); do sleep {mark} & done; wait",
            {"processes": 16},
            "pids",
            "it reached its process limit (processes = 16)",
            ("processes", 16),
            id="processes",
        ),
    ],
)
def test_V5_L9_its_cgroups_limit_is_still_named_as_its_own(
    client: Client,
    workspace: Path,
    command: str,
    limits: dict[str, Any],
    controller: str,
    reason: str,
    limit: tuple[str, int],
) -> None:
    if controller not in CONTROLLERS:
        pytest.skip(f"no {controller} cgroup controller here")
    mark = marker()
    with client.session(workspace, limits=limits) as session:
        # Given a foreground command of the session running alongside, in the sandbox.
        output(call(session, "bash", command="echo before > /tmp/before"))
        shell_id, _ = start(session, f": {mark}; " + command.format(mark=mark))
        wait_state(client, session, shell_id, "killed")
        read = call(session, "bash_output", shell_id=shell_id)
        # Then the shell's end is limit_exceeded naming its own limit,
        assert read.is_error and read.error_code is ErrorCode.LIMIT_EXCEEDED, read.text
        assert read.text.endswith(f"Shell {shell_id} was killed ({reason}).")
        assert (read.details["limit"], read.details["limit_value"]) == limit
        wait_until(lambda: marked(mark) == [], "the shell's processes ended")
        # and the session's sandbox, counted apart, runs on.
        assert output(call(session, "bash", command="cat /tmp/before")) == "before"


# --- what it cannot reach ----------------------------------------------------------------------


@pytest.mark.spec("V5", "V2", "V4")
def test_V5_a_shell_can_neither_see_nor_signal_the_foreground_nor_the_helper(
    client: Client, workspace: Path
) -> None:
    fg, bg = marker(), marker()
    attack = (
        "until [ -e go ]; do sleep 0.05; done; exec > seen.txt; "
        # every process it can see, by command line (the mark read from a file: no
        # command line of its own holds it)
        "grep -l -f mark /proc/[0-9]*/cmdline 2>/dev/null | wc -l; "
        "ls -d /proc/[0-9]* | wc -l; "
        # the host's pids of the foreground sleep and the helper, and every process
        "kill -KILL $(cat pids) 2>/dev/null; echo host-pids:$?; "
        "kill -KILL -1; echo after-kill-all; "
        f"sleep {bg}"
    )
    with client.session(workspace) as session:
        # Given a shell waiting for a sign, and a foreground command sleeping.
        shell_id, _ = start(session, attack)
        box = holder(client, session)
        turn = session.submit([ToolCall("fg", "bash", {"command": f"sleep {fg}"})])
        wait_until(lambda: sleeping(fg) == 1, "the foreground command sleeps")
        (sleeper,) = marked(fg, sleeps_only=True)
        (workspace / "pids").write_text(f"{sleeper} {box}\n")
        (workspace / "mark").write_text(f"{fg}\n")
        # When the shell looks for them and signals them, and everything it may.
        (workspace / "go").touch()
        wait_until(lambda: sleeping(bg) == 1, "the shell sleeps on, its attack done")
        # Then it saw nothing of the foreground, few processes at all (its init, its
        # shell, the pipeline's), and its signals reached none of them.
        found, count, host, last = (workspace / "seen.txt").read_text().splitlines()
        assert (found, host, last) == ("0", "host-pids:1", "after-kill-all")  # no such pids
        assert int(count) <= 5
        assert sleeping(fg) == 1 and psutil.pid_exists(sleeper) and running(box)
        turn.interrupt()
        (result,) = turn.results()
        assert result.error_code is ErrorCode.INTERRUPTED
        # And the other way round: a foreground command neither sees nor ends it.
        (workspace / "mark").write_text(f"{bg}\n")
        look = "grep -l -f mark /proc/[0-9]*/cmdline 2>/dev/null | wc -l; "
        look += "kill -KILL -1 2>/dev/null; echo ok"
        assert output(call(session, "bash", command=look)) == "0\nok"
        assert sleeping(bg) == 1
        assert shell_status(client, session, shell_id)["state"] == "running"  # type: ignore[index]
        call(session, "kill_shell", shell_id=shell_id)
    assert marked(fg) == [] and marked(bg) == []


@pytest.mark.spec("V5", "X2")
async def test_V5_X2_a_shell_in_the_sessions_sandbox_counts_as_confined(workspace: Path) -> None:
    """The daemon refuses local connections from what it confines: a shell started by
    the session sandbox's helper is no child of the pool's, and counts all the same."""
    mark = marker()
    config = PoolConfig(min_workers=1, max_workers=1, tool_modules=("toolpool.tools.bash",))
    async with WorkerPool(config) as pool:
        coordinator = Coordinator([bash], executor=PoolExecutor(pool))
        try:
            session = coordinator.open_session(workspace)
            command = {"command": f"setsid sleep {mark}", "run_in_background": True}
            (started,) = await coordinator.submit(session, [ToolCall("b", "bash", command)])
            assert not started.is_error, started.text
            await until(lambda: bool(marked(mark, sleeps_only=True)))
            (sleeping_pid,) = marked(mark, sleeps_only=True)
            assert pool.confines(sleeping_pid)
            assert pool.shells.sandboxes.confines(sleeping_pid)  # by its sandbox alone
            assert not pool.confines(os.getpid())
        finally:
            coordinator.close()
    assert marked(mark) == []


# --- a sandbox that dies, or cannot start it ---------------------------------------------


@pytest.mark.spec("V5", "X12")
def test_V5_X12_a_sandbox_that_died_ends_its_shells_and_the_next_starts_in_a_fresh_one(
    client: Client, workspace: Path
) -> None:
    mark, after = marker(), marker()
    with client.session(workspace) as session:
        # Given a shell running in the session's sandbox, and a file in its /tmp.
        output(call(session, "bash", command="echo old > /tmp/old"))
        shell_id, _ = start(session, f"setsid sleep {mark} & sleep {mark}")
        wait_until(lambda: sleeping(mark) == 2, "both sleeping")
        box = holder(client, session)
        # When the sandbox dies under it.
        os.kill(box, signal.SIGKILL)
        # Then the shell is over, killed by its sandbox's end (not an exit of its own).
        ended = wait_state(client, session, shell_id, "killed")
        assert ended["exit_code"] == 128 + signal.SIGKILL
        read = call(session, "bash_output", shell_id=shell_id)
        assert read.text.endswith(f"Shell {shell_id} was killed (its session's sandbox ended).")
        assert marked(mark) == []
        # And the next shell starts in a fresh sandbox: another holder, an empty /tmp.
        assert finished(client, session, "ls /tmp/old 2>&1 | grep -c 'No such'") == "1"
        fresh = holder(client, session)
        assert fresh != box and running(fresh)
        start(session, f"sleep {after}")
        wait_until(lambda: sleeping(after) == 1, "the next shell sleeps")
        (sleeper,) = marked(after, sleeps_only=True)
        assert under(sleeper, fresh)
    wait_until(lambda: marked(after) == [], "the session's close ended it")


@pytest.mark.spec("V5", "X12")
def test_V5_X12_a_start_its_sandbox_refuses_is_tried_three_times_then_sandbox_failed(
    tmp_path: Path, workspace: Path
) -> None:
    # Given a daemon whose PATH (the commands' too) is a directory of this host's
    # programs outside the roots: inside the session's sandbox, under its private
    # /tmp, it is not there, so its helper finds no bash to start.
    programs = tmp_path / "bin"
    programs.mkdir()
    for directory in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for program in Path(directory).iterdir():
            if not (programs / program.name).exists():
                (programs / program.name).symlink_to(program)
    with (
        running_daemon(tmp_path, env={"PATH": str(programs)}) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
        client.session(workspace) as session,
    ):
        # When a background shell is started.
        result = call(session, "bash", command="echo ran > ran.txt", run_in_background=True)
        # Then it is sandbox_failed, saying why, after three attempts; it never ran.
        assert result.is_error and result.error_code is ErrorCode.SANDBOX_FAILED, result.text
        why = "The sandbox could not start the command: cannot execute bash: No such file"
        assert why in result.text
        assert int(client.status()["sandbox_retries"]) == 2
        assert client.status()["sessions"][session.id]["shells"] == []
        assert not (workspace / "ran.txt").exists()
        assert running(holder(client, session))  # the sandbox itself runs on
