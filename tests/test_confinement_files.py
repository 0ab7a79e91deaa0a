"""Nothing left, nothing readable (SPEC X8): the sessions' scratch and spill files of a
real daemon are private (0700 dirs under ``<runtime dir>/scratch-<pid>``), go with
their session and the daemon, are cleared after a crash at the next start, and
leave nothing in the daemon's TMPDIR. A session can read its own spill files; another
session cannot."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from toolpool import Client, ToolCall, ToolResult
from toolpool.engine import Coordinator
from toolpool.tools import bash as bash_tool
from toolpool.tools import read_tool

from .daemon_support import Daemon, running, start_daemon, stop_daemon

SPILL_MARK = "Full output ("


def start_daemon_with_tmpdir(tmp: Path, tmpdir: Path) -> Daemon:
    """``daemon_support.start_daemon`` with the daemon's TMPDIR set to ``tmpdir``."""
    return start_daemon(tmp, env={"TMPDIR": str(tmpdir)})


def bash(call_id: str, command: str) -> ToolCall:
    return ToolCall(call_id, "bash", {"command": command})


def spill_path(result: ToolResult) -> Path:
    line = next(x for x in result.text.splitlines() if x.startswith(SPILL_MARK))
    return Path(line.split(": ", 1)[1])


def gone(path: Path, timeout: float = 30.0) -> bool:
    """Whether ``path`` is gone, waiting for it up to ``timeout`` (a hang guard)."""
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not path.exists()


def modes_under(root: Path) -> dict[Path, int]:
    """Every path under ``root`` (itself included) and its permission bits."""
    found = {root: stat.S_IMODE(os.lstat(root).st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            found[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def assert_private(root: Path) -> None:
    """Directories 0700; files reachable only through them, never writable by others."""
    for path, mode in modes_under(root).items():
        if path.is_dir():
            assert mode == 0o700, f"{path} has mode {oct(mode)}"
        else:
            assert mode & 0o022 == 0, f"{path} has mode {oct(mode)}"
    # nothing of it is reachable by anyone else: every directory from the root is 0700


@pytest.mark.spec("X8")
def test_X8_scratch_is_private_and_nothing_is_left(tmp_path: Path, workspace: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    daemon = start_daemon_with_tmpdir(tmp_path, tmpdir)
    runtime, first = daemon.runtime, daemon.pid
    scratch_root = runtime / f"scratch-{first}"
    tree = daemon.tree()
    try:
        assert stat.S_IMODE(os.lstat(scratch_root).st_mode) == 0o700
        with Client(runtime_dir=runtime, timeout=60) as client:
            with client.session(workspace) as session, client.session(workspace) as other:
                calls = [
                    bash(f"b{i}", "seq 1 20000" if i % 4 == 0 else f"echo call {i}")
                    for i in range(20)
                ]
                results = session.submit(calls).results()
                assert all(not r.is_error for r in results), [r.text for r in results]
                spills = [spill_path(r) for r in results if SPILL_MARK in r.text]
                assert len(spills) == 5
                scratch = scratch_root / session.id
                assert all(s.is_relative_to(scratch) for s in spills)
                assert_private(scratch_root)
                assert_private(runtime)
                # its own spill file: readable by the session's read tool
                own = session.submit([ToolCall("r", "read", {"path": str(spills[0])})])
                (read,) = own.results()
                assert not read.is_error, read.text
                assert "\t1999\n" in read.text  # numbered lines of the spilled output
                # another session's: refused
                (refused,) = other.submit(
                    [ToolCall("r", "read", {"path": str(spills[0])})]
                ).results()
                assert refused.is_error
                assert "\t1999\n" not in refused.text
                other_scratch = scratch_root / other.id
                assert other_scratch.is_dir()
            # the sessions closed (the daemon closes them once their turns end): their
            # scratch went with them
            assert gone(scratch)
            assert gone(other_scratch)
            # one more session that keeps its spill files until the crash
            with client.session(workspace) as crashed:
                (kept,) = crashed.submit([bash("big", "seq 1 20000")]).results()
                left = spill_path(kept)
                daemon.process.send_signal(signal.SIGKILL)
                daemon.process.wait()
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
    deadline = time.monotonic() + 30  # a hang guard: they die within a second
    while any(running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in tree if running(p)] == []  # workers and zygote died with it
    assert left.exists()  # a crash leaves the scratch behind…

    again = start_daemon_with_tmpdir(tmp_path, tmpdir)
    second = again.pid
    try:
        # …the next start removes it (and the dead run's worker directory)
        assert not (runtime / f"scratch-{first}").exists()
        assert not (runtime / f"workers-{first}").exists()
        assert (runtime / f"scratch-{second}").is_dir()
        with Client(runtime_dir=runtime, timeout=60) as client, client.session(workspace) as s:
            (big,) = s.submit([bash("big", "seq 1 20000")]).results()
            assert spill_path(big).exists()
            assert_private(runtime)
    finally:
        assert stop_daemon(again) == 0
    # a clean stop keeps only the run's worker logs (cleared at the next start)
    assert sorted(p.name for p in runtime.iterdir()) == [f"workers-{second}"]
    assert_private(runtime)
    assert list(tmpdir.iterdir()) == []  # nothing of toolpool's in the daemon's TMPDIR


@pytest.mark.spec("X8")
async def test_X8_in_process_coordinator_owns_a_private_scratch_root(workspace: Path) -> None:
    coordinator = Coordinator([bash_tool, read_tool])
    session = coordinator.open_session(workspace)
    root = coordinator.scratch_root
    assert session.scratch_dir == root / session.id
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(session.scratch_dir).st_mode) == 0o700
    (result,) = await coordinator.run_turn(session, [bash("b", "seq 1 20000")])
    spill = spill_path(result)
    assert stat.S_IMODE(os.lstat(spill.parent).st_mode) == 0o700
    coordinator.close()
    assert not root.exists()


@pytest.mark.spec("X8")
async def test_X8_spill_files_are_0600(workspace: Path) -> None:
    coordinator = Coordinator([bash_tool])
    try:
        session = coordinator.open_session(workspace)
        (result,) = await coordinator.run_turn(session, [bash("b", "seq 1 20000")])
        assert stat.S_IMODE(os.lstat(spill_path(result)).st_mode) == 0o600
    finally:
        coordinator.close()
