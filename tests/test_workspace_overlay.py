"""A workspace of the session's own (SPEC V14, V15): with ``workspace_mode =
"overlay"`` the host directory is the lower layer of an overlay and never changes
while the session runs; the file tools and the commands see one tree — through a
real daemon, real mounts, real files."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpool import Client, ToolCall, ToolResult
from toolpool.engine import Coordinator
from toolpool.models import ErrorCode
from toolpool.sandbox.profile import SandboxProfile
from toolpool.tools import read_tool, write_tool
from toolpool.tools.bash import bash

from .daemon_support import Daemon, running_daemon, shared_daemon
from .shell_support import call, read_until, wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not SandboxProfile.probe().active("session"),
    reason="a workspace overlay needs session sandboxes and a daemon run as root",
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("overlays")) as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=120) as connected:
        yield connected


def output(result: ToolResult) -> str:
    assert result.text.endswith("Exit code: 0"), result.text
    return result.text.rsplit("\nExit code:", 1)[0]


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.text
    return result.text


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its text: what the host holds."""
    return {
        str(p.relative_to(root)): p.read_text() if p.is_file() else "<dir>"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.spec("V14")
@pytest.mark.spec("V15")
@pytest.mark.spec("V16")
def test_V14_V15_file_tools_and_commands_share_one_tree_and_the_host_never_changes(
    client: Client, workspace: Path
) -> None:
    # Given a host workspace with a file
    (workspace / "kept.txt").write_text("host\n")
    before = tree(workspace)
    with client.session(workspace, workspace_mode="overlay") as session:
        # When a file tool writes and a command reads, and the other way round
        ok(call(session, "write", path="made/by_tool.txt", content="tool\n"))
        assert output(call(session, "bash", command="cat made/by_tool.txt")) == "tool"
        output(call(session, "bash", command="echo cmd > by_cmd.txt; echo changed > kept.txt"))
        # Then every file tool reads the merged tree
        assert "cmd" in ok(call(session, "read", path="by_cmd.txt"))
        assert "changed" in ok(call(session, "read", path="kept.txt"))
        assert "by_cmd.txt" in ok(call(session, "grep", pattern="cmd"))
        assert "made/by_tool.txt" in ok(call(session, "glob", pattern="**/*.txt"))
        assert "made/" in ok(call(session, "ls", path="."))
        # And the read-before-write stamps work on it: an edit after the read goes on
        ok(call(session, "edit", path="kept.txt", old_string="changed", new_string="edited"))
        assert output(call(session, "bash", command="cat kept.txt")) == "edited"
        # And a background shell of the session sees it too
        shell = call(session, "bash", command="cat kept.txt", run_in_background=True)
        read_out, _ = read_until(session, str(shell.details["shell_id"]), "edited")
        assert "edited" in read_out
        # While the host's directory is as it was
        assert tree(workspace) == before
        status = client.status()["sessions"][session.id]["environment"]
        assert status["workspace_mode"] == "overlay" and status["root"] == "host"
        assert status["layer_bytes"] == 1024**3  # the daemon's default (V16)
        assert 0 < status["layer_used_bytes"] < 1024**2
    assert tree(workspace) == before


@pytest.mark.spec("V14")
def test_V14_two_overlay_sessions_over_one_directory_never_see_each_others_writes(
    client: Client, workspace: Path
) -> None:
    with (
        client.session(workspace, workspace_mode="overlay") as first,
        client.session(workspace, workspace_mode="overlay") as second,
        client.session(workspace) as direct,
    ):
        ok(call(first, "write", path="first.txt", content="1\n"))
        output(call(second, "bash", command="echo 2 > second.txt"))
        assert output(call(first, "bash", command="ls")) == "first.txt"
        assert output(call(second, "bash", command="ls")) == "second.txt"
        listed = call(direct, "ls", path=".")
        assert "first.txt" not in listed.text and "second.txt" not in listed.text
        refused = call(second, "read", path="first.txt")
        assert refused.is_error and "first.txt" in refused.text


@pytest.mark.spec("V14")
@pytest.mark.spec("V10")
def test_V14_the_working_directory_persists_into_a_directory_only_the_overlay_has(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace, workspace_mode="overlay") as session:
        first = output(call(session, "bash", command="mkdir -p sub/deep && cd sub/deep"))
        assert "reset" not in first
        assert output(call(session, "bash", command="pwd")) == str(workspace / "sub" / "deep")
    assert not (workspace / "sub").exists()


@pytest.mark.spec("V15")
def test_V15_a_symlink_a_command_makes_is_followed_in_the_sessions_view_never_the_hosts(
    client: Client, workspace: Path
) -> None:
    # Given a host file, which the session changes in its view
    (workspace / "real.txt").write_text("host copy\n")
    with client.session(workspace, workspace_mode="overlay") as session:
        make = (
            "echo session copy > real.txt; "
            f"ln -s {workspace}/real.txt absolute; ln -s real.txt relative; "
            "ln -s /etc/passwd outside"
        )
        output(call(session, "bash", command=make))
        # When file tools follow links into the workspace, by absolute and relative paths
        absolute, relative = (
            call(session, "read", path="absolute"),
            call(session, "read", path="relative"),
        )
        # Then they read the session's file, never the host's
        assert "session copy" in ok(absolute) and "session copy" in ok(relative)
        # And a link out of the roots is refused as ever (X4)
        outside = call(session, "read", path="outside")
        assert outside.is_error and "outside" in outside.text
    assert (workspace / "real.txt").read_text() == "host copy\n"
    assert sorted(os.listdir(workspace)) == ["real.txt"]


@pytest.mark.spec("V14")
@pytest.mark.spec("V16")
def test_V14_a_file_tool_that_fills_the_layer_fails_and_the_host_gets_nothing(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace, workspace_mode="overlay", layer_bytes=1024 * 1024) as session:
        # When a file tool writes past the session's layer_bytes
        big = call(session, "write", path="big.txt", content="x" * (2 * 1024 * 1024))
        # Then the write fails, whole (no partial file), and the host has nothing
        assert big.is_error and "space" in big.text.lower(), big.text
        listed = output(call(session, "bash", command="ls -a"))
        assert "big.txt" not in listed
        # And status counts the session's own size
        status = client.status()["sessions"][session.id]["environment"]
        assert status["layer_bytes"] == 1024 * 1024
        # And a command that fills it is limit_exceeded naming layer_bytes
        fill = call(session, "bash", command="head -c 3000000 /dev/zero > fill.bin")
        assert fill.error_code == ErrorCode.LIMIT_EXCEEDED and "layer_bytes" in fill.text
    assert os.listdir(workspace) == []


@pytest.mark.spec("V14")
def test_V14_a_closed_sessions_workspace_layer_is_unmounted(
    client: Client, daemon: Daemon, workspace: Path
) -> None:
    sandboxes = daemon.runtime / f"workers-{daemon.pid}" / "s"
    real = os.path.realpath(sandboxes)

    def mounted() -> list[str]:
        with open("/proc/self/mountinfo") as table:
            return [p for line in table if (p := line.split()[4]).startswith(real)]

    with client.session(workspace, workspace_mode="overlay") as session:
        ok(call(session, "write", path="a.txt", content="a\n"))  # no command: tools alone
        # (The turn's end is a checkpoint, B1: the overlay is mounted again over the
        # layer it froze, a moment after the turn's end.)
        wait_until(lambda: any(p.endswith("/w/merged") for p in mounted()), "it is mounted")
        during = mounted()
    wait_until(lambda: not set(during) & set(mounted()), "its mounts are gone")


@pytest.mark.spec("V14")
def test_V14_in_process_an_overlay_workspace_is_refused_never_written_in_place(
    workspace: Path,
) -> None:
    # The in-process coordinator has no layers: the tools refuse rather than write
    # the host's directory.
    coordinator = Coordinator([bash, read_tool, write_tool])
    try:
        session = coordinator.open_session(workspace, workspace_mode="overlay")
        calls = [
            ToolCall("w", "write", {"path": "a.txt", "content": "x"}),
            ToolCall("b", "bash", {"command": "echo x > b.txt"}),
        ]
        results = asyncio.run(coordinator.run_turn(session, calls))
    finally:
        coordinator.close()
    # (write is refused as it validates, bash as it starts)
    assert [r.error_code for r in results] == [
        ErrorCode.VALIDATION_FAILED,
        ErrorCode.SANDBOX_FAILED,
    ], results
    assert all('workspace_mode is "overlay"' in r.text for r in results)
    assert os.listdir(workspace) == []


@pytest.mark.spec("V14")
@pytest.mark.spec("V15")
def test_V14_without_session_sandboxes_each_command_gets_the_overlay_bound_in_its_own(
    workspace: Path, tmp_path: Path
) -> None:
    # Given a daemon whose commands get a bubblewrap each (the session mechanism off)
    (workspace / "kept.txt").write_text("host\n")
    with (
        running_daemon(tmp_path, "--sandbox-disabled", "session") as daemon,
        Client(runtime_dir=daemon.runtime, timeout=120) as client,
        client.session(workspace, workspace_mode="overlay") as session,
    ):
        # When a command changes the workspace, and a background shell reads it
        output(call(session, "bash", command="echo changed > kept.txt"))
        shell = call(session, "bash", command="cat kept.txt", run_in_background=True)
        # Then the shell and the file tools see the session's view
        read_out, _ = read_until(session, str(shell.details["shell_id"]), "changed")
        assert "changed" in read_out
        assert "changed" in ok(call(session, "read", path="kept.txt"))
    # And the host's file never changed
    assert (workspace / "kept.txt").read_text() == "host\n"


@pytest.mark.spec("V16")
def test_V16_the_doctor_mounts_a_sessions_layers_and_leaves_nothing_mounted() -> None:
    from toolpool.sandbox.layers import layers_self_check

    def ours() -> list[str]:
        with open("/proc/self/mountinfo") as table:
            return [line for line in table if "toolpool-layers-" in line]

    ok_, detail = layers_self_check()
    assert ok_, detail
    assert "overlays of / and of a directory" in detail
    assert ours() == []


@pytest.mark.spec("V16")
def test_V16_toolpool_status_prints_a_sessions_modes_and_layers(
    client: Client, daemon: Daemon, workspace: Path
) -> None:
    import io

    from rich.console import Console

    from toolpool.cli.status import print_status

    with client.session(workspace, workspace_mode="overlay") as session:
        before = io.StringIO()
        print_status(client.status(), Console(file=before, width=200))
        ok(call(session, "write", path="a.txt", content="a\n"))
        after = io.StringIO()
        print_status(client.status(), Console(file=after, width=200))
    assert f"root host, workspace overlay, layers not made yet of {1024**3}" in before.getvalue()
    assert "root host, workspace overlay, layers " in after.getvalue()
    assert "not made yet" not in after.getvalue()


@pytest.mark.spec("V15")
def test_V15_another_sessions_command_cannot_reach_a_sessions_view_through_proc(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with (
        client.session(workspace, workspace_mode="overlay") as first,
        client.session(other) as second,
    ):
        ok(call(first, "write", path="secret.txt", content="s3cr3t\n"))
        output(call(first, "bash", command="true"))  # its sandbox runs
        (box,) = client.status()["sessions"][first.id]["sandboxes"]
        holder = int(box["pid"])
        # When a command of another session looks for it through the host's /proc
        look = (
            f"cat /proc/{holder}/root{workspace}/secret.txt 2>/dev/null; "
            f"ls /proc/{holder} 2>/dev/null | head -1; echo done"
        )
        seen = output(call(second, "bash", command=look))
    # Then it finds nothing: its /proc is its own PID namespace's
    assert seen == "done", seen
