"""SPEC L9 through real daemons, as an attacker would try it: more shells than a
session, a client (over two sessions) and the daemon may run; a flood of multi-byte
characters past spill_bytes; a half-written character; shells that spend their CPU
time, memory and processes. Each refusal and each end names its limit. Each daemon runs
twice: shells in their session's sandbox (V5), and in a sandbox of their own."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client
from toolpool.models import ErrorCode, ToolResult
from toolpool.sandbox.cgroups import CgroupTree
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import Daemon, running_daemon, shared_daemon
from .shell_support import (
    call,
    marked,
    marker,
    read_until,
    shell_status,
    sleeping,
    start,
    wait_state,
    wait_until,
)

PER_CLIENT = 20  # the module daemon's max_background_shells_per_client
MECHANISMS = {"in-session": "", "own-sandbox": "session"}  # what sandbox_disabled adds


@pytest.fixture(scope="module", params=list(MECHANISMS))
def disabled(request: pytest.FixtureRequest) -> str:
    """Off besides: nothing (shells in the session's sandbox), or the session mechanism."""
    return MECHANISMS[request.param]


def flags(disabled: str, *more: str) -> tuple[str, ...]:
    off = ",".join(m for m in (disabled, *more) if m)
    return ("--sandbox-disabled", off) if off else ()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, disabled: str) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("shell-limits")
    cap = ("--max-background-shells-per-client", str(PER_CLIENT))
    with shared_daemon(tmp, *cap, *flags(disabled)) as shared:
        yield shared


def connect(daemon: Daemon) -> Client:
    return Client(runtime_dir=daemon.runtime, timeout=60)


def refused(session: Any, command: str) -> ToolResult:
    result = call(session, "bash", command=command, run_in_background=True)
    assert result.is_error, result.text
    return result


def state_line(result: ToolResult, shell_id: str) -> str:
    return next(line for line in result.text.splitlines() if line.startswith(f"Shell {shell_id} "))


# --- how many run ---------------------------------------------------------------------


@pytest.mark.spec("L9")
def test_L9_a_second_session_of_the_same_client_meets_the_clients_cap(
    daemon: Daemon, workspace: Path
) -> None:
    mark = marker()
    with connect(daemon) as client, client.session(workspace) as first:
        second = client.session(workspace)
        # Given a session that runs the 16 shells a session may.
        for _ in range(16):
            start(first, f"sleep {mark}")
        # When it asks for a 17th, then its client's second session for more.
        over_session = refused(first, f"sleep {mark}")
        shells = [start(second, f"sleep {mark}")[0] for _ in range(PER_CLIENT - 16)]
        over_client = refused(second, f"sleep {mark}")
        # Then the session's cap and the client's each refuse, naming themselves.
        assert over_session.error_code is ErrorCode.LIMIT_EXCEEDED
        assert "already runs 16 background shells, the most a session may (16)" in (
            over_session.text
        )
        assert over_client.error_code is ErrorCode.LIMIT_EXCEEDED
        assert f"max_background_shells_per_client = {PER_CLIENT}" in over_client.text
        assert f"This client already runs {PER_CLIENT} background shells" in over_client.text
        # Another client is not held to this one's count.
        with connect(daemon) as other, other.session(workspace) as theirs:
            start(theirs, f"sleep {mark}")
        # And a shell ended gives its place back to the client.
        assert not call(second, "kill_shell", shell_id=shells[0]).is_error
        start(second, f"sleep {mark}")
        second.close()
    wait_until(lambda: marked(mark) == [], "every shell of the test ended with its session")


@pytest.mark.spec("L9")
def test_L9_the_daemons_cap_holds_across_clients(tmp_path: Path, workspace: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("max_background_shells = 3\n")
    mark = marker()
    with (
        running_daemon(tmp_path, "--config", str(config)) as daemon,
        connect(daemon) as one,
        connect(daemon) as two,
        one.session(workspace) as mine,
        two.session(workspace) as theirs,
    ):
        # Given three shells of two clients, the most this daemon runs.
        first, _ = start(mine, f"sleep {mark}")
        start(mine, f"sleep {mark}")
        start(theirs, f"sleep {mark}")
        # When either client asks for one more, it is refused naming the daemon's cap.
        for session in (mine, theirs):
            over = refused(session, f"sleep {mark}")
            assert over.error_code is ErrorCode.LIMIT_EXCEEDED
            assert "(max_background_shells = 3)" in over.text
        # Then one ended makes room, for any client.
        call(mine, "kill_shell", shell_id=first)
        start(theirs, f"sleep {mark}")
    assert marked(mark) == []


# --- output past spill_bytes ---------------------------------------------------------------


@pytest.mark.spec("L9")
def test_L9_a_flood_of_multibyte_characters_stops_whole_at_spill_bytes_and_runs_on(
    daemon: Daemon, workspace: Path
) -> None:
    # Given `yes é` ("é\n", 3 bytes a line) with a spill_bytes that falls inside an é.
    spill = 100_000  # byte 99,999 starts an é: the cut must come before it
    mark = marker()
    with connect(daemon) as client, client.session(workspace, limits={"spill_bytes": spill}) as s:
        shell_id, _ = start(s, f": {mark}; yes é; :")  # (bash, marked, stays its parent)
        # When it floods past the cap and is read, again and again.
        wait_until(lambda: shell_status(client, s, shell_id)["output_bytes"] > spill, "the cap")  # type: ignore[index]
        reads = [call(s, "bash_output", shell_id=shell_id) for _ in range(5)]
        size = shell_status(client, s, shell_id)["output_bytes"]  # type: ignore[index]
        # Then every read is whole characters, the file stops at the last whole one
        # before the cap with the note, and the command runs on (its output dropped).
        assert all("\ufffd" not in r.text for r in reads)
        assert all(state_line(r, shell_id) == f"Shell {shell_id} is running." for r in reads)
        told = f"was truncated at {spill} bytes (the spill_bytes limit)."
        assert told in reads[0].text
        where = re.search(r"Its output file (\S+) was truncated", reads[0].text)
        assert where is not None
        data = Path(where[1]).read_bytes()
        note = f"\n[output truncated at {spill} bytes: spill_bytes]\n".encode()
        assert data == "é\n".encode() * 33_333 + note  # 99,999 bytes, then the note
        assert shell_status(client, s, shell_id)["output_bytes"] == size == len(data)  # type: ignore[index]
        assert sleeping(mark) == 0 and marked(mark)  # the command still runs
        call(s, "kill_shell", shell_id=shell_id)
    assert marked(mark) == []


@pytest.mark.spec("L9")
def test_L9_a_half_written_character_is_offered_only_once_it_is_whole(
    daemon: Daemon, workspace: Path
) -> None:
    # Given a command that writes "a" and the first byte of "é", then waits.
    mark = marker()
    command = f": {mark}; printf 'a\\303'; until [ -e go ]; do sleep 0.05; done; printf '\\251!'"
    with connect(daemon) as client, client.session(workspace) as session:
        shell_id, _ = start(session, command)
        # When its first write has been read.
        first, _ = read_until(session, shell_id, "a")
        # Then the lone lead byte is held back: a read ends before it, not inside "é".
        assert first == "a"
        assert shell_status(client, session, shell_id)["output_bytes"] == 1  # type: ignore[index]
        # And once the rest of the character came, the next read begins with it whole.
        (workspace / "go").touch()
        wait_state(client, session, shell_id, "exited")
        last = call(session, "bash_output", shell_id=shell_id)
        assert last.text.startswith("é!\n"), last.text
    assert marked(mark) == []


# --- a limit that ends a shell ----------------------------------------------------------------


def _controllers() -> frozenset[str]:
    tree = CgroupTree.probe() if SandboxProfile.probe().active("cgroups") else None
    return frozenset() if tree is None else tree.controllers


CONTROLLERS = _controllers()
HOG = "while :; do :; done"


@pytest.mark.spec("L9")
@pytest.mark.parametrize(
    ("command", "limits", "controller", "reason", "limit"),
    [
        pytest.param(
            HOG,  # one process: RLIMIT_CPU's SIGKILL comes as the cgroup passes the limit
            {"cpu_seconds": 1},
            "cpuacct",
            "it used up its CPU time limit (cpu_seconds = 1)",
            ("cpu_seconds", 1),
            id="cpu-one-process",
        ),
        pytest.param(
            f"({HOG}) & {HOG}",  # two: their sum passes first, the watch ends them
            {"cpu_seconds": 1},
            "cpuacct",
            "it used up its CPU time limit (cpu_seconds = 1)",
            ("cpu_seconds", 1),
            id="cpu-two-processes",
        ),
        pytest.param(
            f"{sys.executable} -I -S -c 'x = \"x\" * (1 << 30)'",
            {"memory_bytes": 128 << 20},
            "memory",
            "it ran out of memory (memory_bytes = 134217728)",
            ("memory_bytes", 128 << 20),
            id="memory",
        ),
        pytest.param(
            "for i in $(seq 40); do sleep 300 & done; wait",
            {"processes": 16},
            "pids",
            "it reached its process limit (processes = 16)",
            ("processes", 16),
            id="processes",
        ),
    ],
)
def test_L9_a_limit_that_ends_a_background_shell_is_named_as_limit_exceeded(
    daemon: Daemon,
    workspace: Path,
    command: str,
    limits: dict[str, Any],
    controller: str,
    reason: str,
    limit: tuple[str, int],
) -> None:
    if controller not in CONTROLLERS:
        pytest.skip(f"no {controller} cgroup controller here: the shell's limit is per process")
    mark = marker()
    with connect(daemon) as client, client.session(workspace, limits=limits) as session:
        # Given a shell that goes past its limit.
        shell_id, _ = start(session, f": {mark}; {command}")
        # When it has been ended, and its output is read.
        wait_state(client, session, shell_id, "killed")
        read = call(session, "bash_output", shell_id=shell_id)
        # Then the read is limit_exceeded, naming the limit and its value.
        assert read.is_error and read.error_code is ErrorCode.LIMIT_EXCEEDED, read.text
        assert state_line(read, shell_id) == f"Shell {shell_id} was killed ({reason})."
        assert (read.details["limit"], read.details["limit_value"]) == limit
        assert read.details["shell_state"] == "killed"
        # And nothing of it is left ("killed" is said as its ending begins).
        wait_until(lambda: marked(mark) == [], "the shell's processes ended")


@pytest.mark.spec("L9")
def test_L9_without_cgroups_a_cpu_hog_is_named_by_its_rlimits_signal(
    tmp_path: Path, workspace: Path, disabled: str
) -> None:
    # Given no cgroup to count the shell's CPU: its per-process RLIMIT_CPU is all.
    mark = marker()
    with (
        running_daemon(tmp_path, *flags(disabled, "cgroups")) as daemon,
        connect(daemon) as client,
        client.session(workspace, limits={"cpu_seconds": 1}) as session,
    ):
        shell_id, _ = start(session, f": {mark}; {HOG}")
        # When the rlimit's SIGXCPU has ended it.
        wait_state(client, session, shell_id, "killed")
        read = call(session, "bash_output", shell_id=shell_id)
        # Then the limit is named all the same.
        assert read.error_code is ErrorCode.LIMIT_EXCEEDED, read.text
        reason = "it used up its CPU time limit (cpu_seconds = 1)"
        assert state_line(read, shell_id) == f"Shell {shell_id} was killed ({reason})."
    assert marked(mark) == []


@pytest.mark.spec("L9")
def test_L9_a_command_that_exits_137_by_itself_is_not_a_limits_end(
    daemon: Daemon, workspace: Path
) -> None:
    with connect(daemon) as client, client.session(workspace) as session:
        shell_id, _ = start(session, "exit 137")
        wait_state(client, session, shell_id, "exited")
        read = call(session, "bash_output", shell_id=shell_id)
        assert not read.is_error
        assert state_line(read, shell_id) == f"Shell {shell_id} exited with code 137."
        assert "limit" not in read.details
