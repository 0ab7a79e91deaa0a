"""The daemon's own doors, tried from inside: a confined command and a hostile Python
tool's ``execute`` look for the control socket wherever the runtime dir lives (X2),
for the daemon's secrets (X9); the operator's required mechanisms (X11), root (X6)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpool import Client, ToolCall
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import ROOT, daemon_env, running_daemon

PROFILE = SandboxProfile.probe()
HOSTILE = ("--tool-modules", "tests.hostile_tools")


def _location(kind: str) -> Path:
    tag = f"toolpool-test-{uuid.uuid4().hex[:8]}"
    if kind == "run-user":
        return Path(f"/run/user/{os.getuid()}") / tag
    if kind == "var-tmp":
        return Path("/var/tmp") / tag
    return Path("/srv") / tag / "custom" / "rt"  # a path of the operator's choosing


@pytest.fixture(params=["run-user", "var-tmp", "custom"])
def runtime_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    runtime = _location(request.param)
    top = runtime if request.param != "custom" else runtime.parents[1]
    created_parent = not runtime.parent.exists()
    yield runtime
    shutil.rmtree(top, ignore_errors=True)
    if created_parent and request.param == "run-user":
        shutil.rmtree(runtime.parent, ignore_errors=True)


def _call(tool: str, **arguments: object) -> ToolCall:
    return ToolCall(f"c-{uuid.uuid4().hex[:6]}", tool, arguments)


@pytest.mark.spec("X2")
@pytest.mark.skipif(not PROFILE.active("bwrap"), reason="bubblewrap is off here")
def test_X2_no_control_socket_inside_wherever_the_runtime_dir_lives(
    tmp_path: Path, workspace: Path, runtime_dir: Path
) -> None:
    with running_daemon(tmp_path, *HOSTILE, runtime=runtime_dir) as daemon:
        socket_path = daemon.runtime / "daemon.sock"
        assert socket_path.exists()
        probe = (
            f"ls -A {daemon.runtime} 2>/dev/null | wc -l; test -e {socket_path} && echo VISIBLE; "
            f'{sys.executable} -I -S -c "import socket; s = socket.socket(socket.AF_UNIX); '
            f"s.connect('{socket_path}'); print('CONNECTED')\" 2>&1 | tail -1"
        )
        with (
            Client(runtime_dir=daemon.runtime, timeout=30) as client,
            client.session(workspace) as session,
        ):
            command, tool = session.submit(
                [
                    _call("bash", command=probe),
                    _call("reach_daemon", socket_path=str(socket_path)),
                ]
            ).results()
    # The command sees an empty runtime dir: no socket to find, none to connect to.
    assert not command.is_error, command.text
    lines = command.text.splitlines()
    assert lines[0] == "0", command.text
    assert "VISIBLE" not in command.text and "CONNECTED" not in command.text
    # A Python tool can name the socket (it shares the worker's view), but the daemon
    # refuses its connection.
    assert tool.text.startswith("refused"), tool.text


@pytest.mark.spec("X2")
def test_X2_a_python_tool_cannot_pose_as_a_worker(tmp_path: Path, workspace: Path) -> None:
    with running_daemon(tmp_path, *HOSTILE) as daemon:
        endpoint = f"ipc://{daemon.runtime}/workers-{daemon.pid}/workers.sock"
        with (
            Client(runtime_dir=daemon.runtime, timeout=30) as client,
            client.session(workspace) as session,
        ):
            joined, after = session.submit(
                [_call("join_pool", endpoint=endpoint), _call("bash", command="echo still")]
            ).results()
    assert joined.text == "refused", joined.text
    assert after.text.startswith("still")  # and the pool goes on


@pytest.mark.spec("X9")
def test_X9_the_daemons_environment_reaches_neither_commands_nor_tools(
    tmp_path: Path, workspace: Path
) -> None:
    secret = f"sk-{uuid.uuid4().hex}"
    env = {"TOOLPOOL_TEST_SECRET": secret, "ANTHROPIC_API_KEY": secret, "OPERATOR_FLAG": "on"}
    env["TOOLPOOL_ENV_PASSTHROUGH"] = "OPERATOR_FLAG"
    with (
        running_daemon(tmp_path, *HOSTILE, env=env) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=30) as client,
        client.session(workspace) as session,
    ):
        command, tool, passed = session.submit(
            [
                _call("bash", command="env"),
                _call("environment_value", name="ANTHROPIC_API_KEY"),
                _call("bash", command="echo flag=$OPERATOR_FLAG"),
            ]
        ).results()
    assert secret not in command.text
    assert tool.text == "<unset>"
    assert "flag=on" in passed.text


@pytest.mark.spec("X11")
def test_X11_a_required_mechanism_that_is_off_stops_the_daemon(tmp_path: Path) -> None:
    env = {**daemon_env(tmp_path), "TOOLPOOL_REQUIRE_SANDBOX": "landlock"}
    done = subprocess.run(
        [
            sys.executable, "-m", "toolpool", "daemon", "run",
            "--runtime-dir", str(tmp_path / "rt"), "--min-workers", "1",
            "--sandbox-disabled", "landlock",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "required sandbox mechanisms are off" in done.stderr
    assert "landlock: disabled by configuration" in done.stderr


@pytest.mark.spec("X6")
def test_X6_status_and_log_say_when_the_daemon_runs_as_root(
    tmp_path: Path, workspace: Path
) -> None:
    with running_daemon(tmp_path) as daemon:
        with Client(runtime_dir=daemon.runtime, timeout=30) as client:
            status = client.status()
        done = subprocess.run(
            [sys.executable, "-m", "toolpool", "status", "--runtime-dir", str(daemon.runtime)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        logged = [str(line) for line in daemon.log_lines()]
    root = os.geteuid() == 0
    assert status["running_as_root"] is root
    assert ("dedicated unprivileged user" in done.stdout) is root
    assert any("dedicated unprivileged user" in str(m) for m in logged) is root
