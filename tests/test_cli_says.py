"""What the command line says, tried as a new user would: a setting it cannot use is
named with its path as written (E8); what the daemon left out is said by every
command that shows the daemon (E9); ``toolpool audit`` finds the log of a daemon
started with ``--audit-log`` (R1); a workspace that is not there is a usage error
(E2)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from toolpool.client.control import ExitCode

from .daemon_support import ROOT, daemon_env, running_daemon


def toolpool(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolpool", *args], capture_output=True, text=True, cwd=ROOT,
        env=daemon_env(tmp), timeout=120, check=False,
    )  # fmt: skip


def _error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("toolpool: error: ")]
    return line


@pytest.mark.spec("E8")
@pytest.mark.parametrize("action", ["start", "run"])
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--log-file", "/proc/nonexistent/d.log"], "log_file = '/proc/nonexistent/d.log': "),
        (["--runtime-dir", "/proc/nonexistent"], "runtime_dir = '/proc/nonexistent': "),
        (["--curve-secret-key", "X"], "curve_secret_key = 'X' (flag --curve-secret-key)"),
        (["--tool-modules", "nope.mod"], "tool_modules = 'nope.mod': no module 'nope.mod'"),
    ],
)
def test_E8_a_setting_that_cannot_be_used_is_named_as_written(
    tmp_path: Path, action: str, flags: list[str], named: str
) -> None:
    runtime = [] if "--runtime-dir" in flags else ["--runtime-dir", str(tmp_path / "rt")]
    done = toolpool(tmp_path, "daemon", action, *runtime, *flags)
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    line = _error_line(done)
    assert named in line, line
    # Neither an OS error's raw form nor a Python repr of the value
    for raw in ("[Errno", "PosixPath", "('", "No such file or directory:"):
        assert raw not in line, line


@pytest.mark.spec("E8")
def test_E8_a_file_that_holds_no_curve_key_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "server.key_secret"
    junk.write_text("not a key\n")
    done = toolpool(
        tmp_path, "daemon", "run", "--runtime-dir", str(tmp_path / "rt"),
        "--tcp", "127.0.0.1:0", "--curve-secret-key", str(junk),
        "--curve-authorized-keys", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE
    assert f"curve_secret_key = '{junk}': no CURVE secret key in it" in _error_line(done)


@pytest.mark.spec("E2")
def test_E2_call_in_a_workspace_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    done = toolpool(
        tmp_path, "call", "--workspace", str(tmp_path / "nowhere"), "read", '{"path": "x"}',
        "--runtime-dir", str(tmp_path / "rt"),
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE  # as README's table says: 2, not 1
    assert "--workspace" in _error_line(done) and "no such directory" in _error_line(done)


@pytest.mark.spec("R1")
def test_R1_audit_finds_the_log_of_a_daemon_started_with_audit_log(
    tmp_path: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("a\n")
    log = tmp_path / "audit.jsonl"
    with running_daemon(tmp_path, "--audit-log", str(log)) as daemon:
        runtime = str(daemon.runtime)
        called = toolpool(
            tmp_path, "call", "read", '{"path": "a.txt"}', "--workspace", str(workspace),
            "--runtime-dir", runtime,
        )  # fmt: skip
        assert called.returncode == 0, called.stderr
    # When nothing names the log but the runtime dir of the daemon that kept it
    printed = toolpool(tmp_path, "audit", "--json", "--runtime-dir", runtime)
    assert printed.returncode == 0, printed.stderr
    (record,) = [json.loads(line) for line in printed.stdout.splitlines()]
    assert (record["tool"], record["status"]) == ("read", "ok")
    # A daemon started there without one leaves no log to find
    with running_daemon(tmp_path):
        pass
    none = toolpool(tmp_path, "audit", "--runtime-dir", runtime)
    assert none.returncode == ExitCode.USAGE and "no audit log" in _error_line(none)


@contextmanager
def _in_background(tmp_path: Path, *flags: str) -> Iterator[subprocess.CompletedProcess[str]]:
    runtime = str(tmp_path / "rt")
    started = toolpool(tmp_path, "daemon", "start", "--runtime-dir", runtime, *flags)
    try:
        yield started
    finally:
        assert toolpool(tmp_path, "daemon", "stop", "--runtime-dir", runtime).returncode == 0


@pytest.mark.spec("E9")
def test_E9_mcp_servers_left_out_are_said_by_start_status_and_tools(tmp_path: Path) -> None:
    # Given the README's two kinds of server, neither reachable here
    servers = {
        "mcpServers": {
            "files": {"command": str(tmp_path / "no-such-npx"), "args": ["-y", "server"]},
            "search": {"url": "http://127.0.0.1:9/mcp", "trusted": True},
        }
    }
    (tmp_path / "mcp.json").write_text(json.dumps(servers))
    runtime = str(tmp_path / "rt")
    with _in_background(tmp_path, "--mcp-servers", str(tmp_path / "mcp.json")) as started:
        assert started.returncode == 0, started.stderr
        status = toolpool(tmp_path, "status", "--runtime-dir", runtime)
        daemon_status = toolpool(tmp_path, "daemon", "status", "--runtime-dir", runtime)
        listed = toolpool(tmp_path, "tools", "--runtime-dir", runtime)
        as_json = toolpool(tmp_path, "status", "--json", "--runtime-dir", runtime)
    # Then each command that shows the daemon names both, and why
    for said in (started.stderr, status.stdout, daemon_status.stdout, listed.stderr):
        assert "MCP server 'files' is left out" in said, said
        assert "no-such-npx" in said
        assert "MCP server 'search' is left out" in said, said
    assert listed.returncode == 0 and json.loads(listed.stdout)  # the rest is listed
    left_out = json.loads(as_json.stdout)["mcp_left_out"]
    assert {item["server"] for item in left_out} == {"files", "search"}
