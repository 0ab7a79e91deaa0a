"""Background shells (F6): bash's run_in_background, bash_output and kill_shell, through
a real daemon — what they read, what ends them (kill_shell, the session's close, the
daemon's stop and death, their wall time), how they are confined, and that they
belong to their session, not to the worker that started them.

Every shell's processes are found by a marker in their command line (a sleep of an
odd length, ``shell_support.marker``): "none left" means no live process carries it.

Each daemon runs twice: with session sandboxes, where a shell starts in its session's
sandbox (V5), and with the ``session`` mechanism off, where it gets a sandbox of its
own; every promise holds alike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from toolpool import Client
from toolpool.errors import ToolError
from toolpool.models import ErrorCode
from toolpool.pool.shell_process import SHELL_MARK, remove_stale_shells
from toolpool.sandbox.profile import SandboxProfile
from toolpool.tools.bash import bash
from toolpool.tools.shells import bash_output, kill_shell

from .daemon_support import ROOT, Daemon, daemon_env, running_daemon, shared_daemon, start_daemon
from .shell_support import (
    call,
    marked,
    marker,
    output_part,
    read_until,
    shell_status,
    sleeping,
    start,
    wait_state,
    wait_until,
)
from .tool_support import tool_context

PROFILE = SandboxProfile.probe()
needs_bwrap = pytest.mark.skipif(not PROFILE.active("bwrap"), reason="bubblewrap is off here")
MECHANISMS = {"in-session": (), "own-sandbox": ("--sandbox-disabled", "session")}


@pytest.fixture(scope="module", params=list(MECHANISMS))
def mechanism(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The daemon's flags: shells in the session's sandbox, or in one of their own."""
    return MECHANISMS[request.param]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, mechanism: tuple[str, ...]
) -> Iterator[Daemon]:
    # One call per worker: every call of a test runs on a new worker, so no shell
    # can lean on the worker that started it.
    tmp = tmp_path_factory.mktemp("shells")
    with shared_daemon(tmp, "--max-calls-per-worker", "1", *mechanism) as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as connected:
        yield connected


# --- reading ---------------------------------------------------------------------------


@pytest.mark.spec("F6")
def test_F6_each_read_gets_the_new_output_and_the_state_follows_the_command(
    client: Client, workspace: Path
) -> None:
    # Given a command that prints, waits for a sign, prints again, then exits 7.
    command = (
        "echo one; until [ -e go1 ]; do sleep 0.05; done; echo two; "
        "until [ -e go2 ]; do sleep 0.05; done; echo three; exit 7"
    )
    with client.session(workspace) as session:
        shell_id, started = start(session, command)
        assert started.text.startswith(f"Started background shell {shell_id}: echo one;")
        assert "bash_output" in started.text and "kill_shell" in started.text
        # When its output is read while it runs, then read again after more came.
        first, running = read_until(session, shell_id, "one")
        assert "two" not in first
        assert running.text.endswith(f"Shell {shell_id} is running.")
        assert running.details["shell_state"] == "running"
        (workspace / "go1").touch()
        second, _ = read_until(session, shell_id, "two")
        # Then the second read holds only what came after the first.
        assert "one" not in second
        (workspace / "go2").touch()
        wait_state(client, session, shell_id, "exited")
        last = call(session, "bash_output", shell_id=shell_id)
        assert output_part(last) == "three"
        assert last.text.endswith(f"Shell {shell_id} exited with code 7.")
        assert (last.details["shell_state"], last.details["shell_exit_code"]) == ("exited", 7)
        again = call(session, "bash_output", shell_id=shell_id)
        assert output_part(again) == "(no new output)"


@pytest.mark.spec("F6")
def test_F6_a_filter_keeps_the_lines_it_matches_and_passes_over_the_rest(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace) as session:
        shell_id, _ = start(session, "printf 'keep 1\\ndrop 2\\nkeep 3\\n'")
        wait_state(client, session, shell_id, "exited")
        kept = call(session, "bash_output", shell_id=shell_id, filter="^keep")
        assert output_part(kept) == "keep 1\nkeep 3"
        # What the filter passed over is not read again.
        rest = call(session, "bash_output", shell_id=shell_id)
        assert output_part(rest) == "(no new output)"
        nothing = call(session, "bash_output", shell_id=shell_id, filter="x")
        assert output_part(nothing) == "(no new output matching the filter)"


@pytest.mark.spec("F6", "V10")
def test_F6_V10_a_shell_starts_where_the_sessions_last_command_ended(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace) as session:
        assert "Exit code: 0" in call(session, "bash", command="mkdir -p sub && cd sub").text
        shell_id, _ = start(session, "echo at:$(pwd)")
        read, _ = read_until(session, shell_id, "at:")
        assert f"at:{workspace / 'sub'}" in read


@pytest.mark.spec("F6")
def test_F6_unknown_ids_other_sessions_shells_and_bad_filters_are_refused(
    client: Client, workspace: Path
) -> None:
    mark = marker()
    with client.session(workspace) as mine, client.session(workspace) as other:
        shell_id, _ = start(mine, f"sleep {mark}")
        # Another session's shell is refused, exactly like an id that never was.
        for name in ("bash_output", "kill_shell"):
            refused = call(other, name, shell_id=shell_id)
            assert refused.is_error
            assert refused.text == f'No background shell "{shell_id}" in this session. ' + (
                "It has started none."
            )
        assert shell_status(client, mine, shell_id)["state"] == "running"  # type: ignore[index]
        unknown = call(mine, "bash_output", shell_id="nope")
        assert unknown.is_error
        listed = f"Its shells: {shell_id}."
        assert unknown.text == f'No background shell "nope" in this session. {listed}'
        bad = call(mine, "bash_output", shell_id=shell_id, filter="(unclosed")
        assert bad.is_error and bad.error_code is ErrorCode.VALIDATION_FAILED
        assert bad.text.startswith("filter is not a valid regular expression: missing )")
        assert not call(mine, "kill_shell", shell_id=shell_id).is_error
    assert marked(mark) == []


# --- what ends a shell -------------------------------------------------------------------


@pytest.mark.spec("F6")
def test_F6_kill_shell_ends_its_whole_tree_setsid_and_nohup_included(
    client: Client, workspace: Path
) -> None:
    escaped, nohup, own = marker(), marker(), marker()
    command = f"setsid sleep {escaped} & nohup sleep {nohup} >/dev/null 2>&1 & sleep {own}"
    with client.session(workspace) as session:
        shell_id, _ = start(session, command)
        wait_until(lambda: all(sleeping(m) for m in (escaped, nohup, own)), "all three sleeping")
        killed = call(session, "kill_shell", shell_id=shell_id)
        assert killed.text.startswith(f"Killed background shell {shell_id} (setsid sleep")
        # kill_shell answers once the shell is over: nothing of it is left by then.
        assert [marked(m) for m in (escaped, nohup, own)] == [[], [], []]
        read = call(session, "bash_output", shell_id=shell_id)
        assert read.text.endswith(f"Shell {shell_id} was killed (kill_shell).")
        again = call(session, "kill_shell", shell_id=shell_id)
        assert again.is_error
        ended = "is not running: it was killed (kill_shell)."
        assert again.text == f"Background shell {shell_id} {ended}"


@pytest.mark.spec("F6")
def test_F6_a_shell_outlives_the_worker_that_started_it(client: Client, workspace: Path) -> None:
    # Given a shell started by a worker that is retired after that one call.
    mark = marker()
    with client.session(workspace) as session:
        shell_id, started = start(session, f"echo ready; sleep {mark}")
        starter = started.details["worker_pid"]
        wait_until(lambda: not psutil.pid_exists(starter), "the starting worker retired")
        # When another worker reads it.
        read, last = read_until(session, shell_id, "ready")
        # Then it runs on, and its output is there.
        assert last.details["worker_pid"] != starter
        assert read == "ready" and last.text.endswith("is running.")
        # (its sleep starts after the echo: wait for it rather than race it)
        wait_until(lambda: sleeping(mark) == 1, "the shell's command sleeps on")
        call(session, "kill_shell", shell_id=shell_id)
    assert marked(mark) == []


@pytest.mark.spec("F6")
def test_F6_closing_the_session_ends_its_shells(client: Client, workspace: Path) -> None:
    mark, kept = marker(), marker()
    with client.session(workspace) as staying:
        kept_id, _ = start(staying, f"sleep {kept}")
        wait_until(lambda: sleeping(kept) == 1, "the other session's shell sleeps")
        with client.session(workspace) as closing:
            start(closing, f"setsid sleep {mark} & sleep {mark}")
            wait_until(lambda: sleeping(mark) == 2, "both sleeping")
            closed_id = closing.id
        wait_until(lambda: marked(mark) == [], "the closed session's shell ended")
        assert closed_id not in client.status()["sessions"]
        # Another session's shell is not touched.
        assert sleeping(kept) == 1 and shell_status(client, staying, kept_id) is not None
    wait_until(lambda: marked(kept) == [], "the other session's shell ended with it")


@pytest.mark.spec("F6")
def test_F6_status_lists_the_sessions_shells(
    client: Client, daemon: Daemon, workspace: Path
) -> None:
    mark = marker()
    with client.session(workspace) as session:
        shell_id, _ = start(session, f"echo hello; sleep {mark}")
        read_until(session, shell_id, "hello")
        argv = [sys.executable, "-m", "toolpool", "status", "--json"]
        printed = subprocess.run(
            [*argv, "--runtime-dir", str(daemon.runtime)],
            cwd=ROOT, env=daemon_env(daemon.runtime.parent), capture_output=True, text=True,
            check=True, timeout=60,
        )  # fmt: skip
        status = json.loads(printed.stdout)
        (listed,) = status["sessions"][session.id]["shells"]
        assert listed["shell_id"] == shell_id
        assert listed["command"] == f"echo hello; sleep {mark}"
        assert listed["state"] == "running"
        assert listed["pid"] > 0 and listed["started"] > 0
        assert listed["output_bytes"] == len("hello\n")
        assert status["background_shells"] >= 1
        shown = subprocess.run(
            [sys.executable, "-m", "toolpool", "status", "--runtime-dir", str(daemon.runtime)],
            cwd=ROOT, env=daemon_env(daemon.runtime.parent), capture_output=True, text=True,
            check=True, timeout=60,
        )  # fmt: skip
        assert f"shell {shell_id} running, pid {listed['pid']}, 6 bytes: echo hello" in shown.stdout
        call(session, "kill_shell", shell_id=shell_id)


@pytest.mark.spec("F6", "L9")
def test_F6_a_shell_is_stopped_at_its_wall_time(
    tmp_path: Path, workspace: Path, mechanism: tuple[str, ...]
) -> None:
    mark = marker()
    with (
        running_daemon(tmp_path, "--background-wall-seconds", "0.5", *mechanism) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
        client.session(workspace) as session,
    ):
        shell_id, _ = start(session, f"sleep {mark}")
        wait_state(client, session, shell_id, "timed_out")
        assert marked(mark) == []  # timed out means over: nothing of it runs
        read = call(session, "bash_output", shell_id=shell_id)
        assert read.text.endswith(
            f"Shell {shell_id} timed out (background_wall_seconds = 0.5) and was stopped."
        )
        # A limit ended it (L9): the read says so as limit_exceeded, naming it.
        assert read.is_error and read.error_code is ErrorCode.LIMIT_EXCEEDED
        assert (read.details["limit"], read.details["limit_value"]) == (
            "background_wall_seconds",
            0.5,
        )


@pytest.mark.spec("F6")
def test_F6_the_daemons_stop_ends_every_shell(
    tmp_path: Path, workspace: Path, mechanism: tuple[str, ...]
) -> None:
    marks = [marker(), marker()]
    with running_daemon(tmp_path, *mechanism) as daemon:  # stop_daemon checks its tree is gone
        with (
            Client(runtime_dir=daemon.runtime, timeout=60) as client,
            client.session(workspace) as one,
            client.session(workspace) as two,
        ):
            for session, mark in zip((one, two), marks, strict=True):
                start(session, f"setsid sleep {mark} & sleep {mark}")
            wait_until(lambda: all(sleeping(m) == 2 for m in marks), "every shell sleeping")
            # The client stays connected: the daemon's SIGTERM, not a session's close,
            # ends them.
            daemon.process.send_signal(signal.SIGTERM)
            assert daemon.process.wait(60) == 0
        assert [marked(m) for m in marks] == [[], []]


@pytest.mark.spec("F6")
def test_F6_a_dead_daemons_shells_go_with_it_and_its_next_start_cleans_up(
    tmp_path: Path, workspace: Path, mechanism: tuple[str, ...]
) -> None:
    mark = marker()
    runtime = tmp_path / "rt"
    first = start_daemon(tmp_path, *mechanism, runtime=runtime)
    try:
        with (
            Client(runtime_dir=runtime, timeout=60) as client,
            client.session(workspace) as session,
        ):
            start(session, f"setsid sleep {mark} & sleep {mark}")
            wait_until(lambda: sleeping(mark) == 2, "both sleeping")
            first.process.kill()  # a crash: no clean-up of its own
            first.process.wait()
    finally:
        if first.process.poll() is None:
            first.process.kill()
            first.process.wait()
    wait_until(lambda: marked(mark) == [], "the dead daemon's shell gone")
    with running_daemon(tmp_path, runtime=runtime):
        assert not (runtime / f"scratch-{first.pid}").exists()


def test_stale_shells_are_found_by_their_mark_and_killed() -> None:
    # Given a process marked as a shell of a daemon that is gone (cgroups and
    # bubblewrap, which end such processes otherwise, are not involved). The daemon
    # it names is this test's process, gone for this sweep alone: a daemon another
    # test starts meanwhile sweeps too, and must not take this one's orphan first.
    gone = os.getpid()
    env = {**os.environ, SHELL_MARK: f"{gone}:abcd0123"}
    orphan = subprocess.Popen(["sleep", marker()], env=env)
    try:
        # When the next start looks for them.
        killed = remove_stale_shells(lambda pid: pid != gone)
        # Then it is killed, and nothing else.
        assert killed == [orphan.pid]
        assert orphan.wait(30) == -signal.SIGKILL
    finally:
        orphan.kill()
        orphan.wait()


# --- confinement -----------------------------------------------------------------------


@needs_bwrap
@pytest.mark.spec("F6")
def test_F6_a_background_shell_is_confined_like_a_foreground_command(
    client: Client, daemon: Daemon, workspace: Path, outside: Path
) -> None:
    # Given escapes a foreground command cannot make: a file outside the workspace,
    # a write there, the daemon's runtime dir, the network.
    probe = (
        "cat {secret} 2>/dev/null || echo no-secret; "
        "touch {outside}/escape-{how} 2>/dev/null || echo no-write; "
        "ls {runtime} | wc -l; "
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
    )
    answers = {}
    with client.session(workspace) as session:
        for how in ("foreground", "background"):
            command = probe.format(
                secret=outside / "secret.txt", outside=outside, how=how, runtime=daemon.runtime
            )
            if how == "foreground":
                result = call(session, "bash", command=command)
                answers[how] = result.text.rsplit("\nExit code:", 1)[0]
                continue
            shell_id, _ = start(session, command)
            wait_state(client, session, shell_id, "exited")
            answers[how] = output_part(call(session, "bash_output", shell_id=shell_id))
    # Then both are refused alike: the secret and the runtime dir are not there, the
    # write fails, and only the loopback interface exists.
    assert answers["foreground"] == "no-secret\nno-write\n0\nlo"
    assert answers["background"] == answers["foreground"]
    assert list(outside.glob("escape-*")) == []


# --- without a pool ----------------------------------------------------------------------


@pytest.mark.spec("F6")
def test_F6_without_background_shells_the_tools_say_so(workspace: Path, tmp_path: Path) -> None:
    ctx = tool_context(workspace, scratch_dir=tmp_path / "scratch")
    with pytest.raises(ToolError, match="Background commands are not available here"):
        bash.execute({"command": "sleep 1", "run_in_background": True}, ctx)
    for tool in (bash_output, kill_shell):
        with pytest.raises(ToolError, match="Background shells are not available here"):
            tool.execute({"shell_id": "abc"}, ctx)
