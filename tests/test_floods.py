"""SPEC L2, L3, L5, L6, L7 against a real daemon: huge results, a client that does
not read, many sessions, a daemon killed mid-run."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client, ToolCall
from toolpool.client import DaemonUnavailable, RequestFailed
from toolpool.models import MessageStart, ToolEnd
from toolpool.sandbox.cgroups import discover

from .daemon_support import running, running_daemon, start_daemon, stop_daemon

# Each test runs a daemon through a flood; the waits inside are hang guards of up to
# 120 s, so the module's timeout is past them.
pytestmark = pytest.mark.timeout(400)

MiB = 1024 * 1024
WINDOW = 8 * MiB  # the smallest client_buffer_bytes


def _big_file(path: Path, megabytes: int) -> Path:
    """``megabytes`` MB a read returns whole: 500 lines of 2000 characters per MB
    (the read tool's default is 2000 lines of up to 2000 characters)."""
    line = "y" * 1999 + "\n"
    path.write_text(line * (500 * megabytes))
    return path


def _reads(name: str, n: int) -> list[ToolCall]:
    return [ToolCall(f"r{i}", "read", {"path": name}) for i in range(n)]


def wait_for(condition: Callable[[], object], timeout: float) -> None:
    """Poll until ``condition()`` holds; ``timeout`` is a hang guard, far past need."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _buffer_of(status: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((b for b in status["client_buffers"].values() if b["name"] == name), None)


UNBUDGETED: dict[str, Any] = {"turn_output_chars": 0, "limits": {"output_bytes": 16 * MiB}}


@pytest.mark.spec("L2", "L3", "L5")
@pytest.mark.parametrize(("calls", "megabytes"), [(20, 4), (200, 1)])
def test_L3_no_turn_fails_because_of_the_size_of_its_results(
    tmp_path: Path, workspace: Path, calls: int, megabytes: int
) -> None:
    """With the smallest window, the 4 MB results pass it again and again: a client
    that reads gets every one, once, in order, through the spill file and back."""
    _big_file(workspace / "big.txt", megabytes)
    env = {"TOOLPOOL_CLIENT_BUFFER_BYTES": str(WINDOW)} if megabytes == 4 else {}
    with (
        running_daemon(tmp_path, env=env) as daemon,
        Client(runtime_dir=daemon.runtime, name="reader") as client,
        client.session(workspace, **UNBUDGETED) as session,
    ):
        turn = session.submit(_reads("big.txt", calls))
        if env:  # read only once the window is full and frames wait on disk
            with Client(runtime_dir=daemon.runtime) as watcher:
                wait_for(lambda: (_buffer_of(watcher.status(), "reader") or {})["held"], 120)
        items = list(turn)
        results = turn.results()
        buffer = _buffer_of(client.status(), "reader")
    if env:  # the window was full, frames waited on disk, and none was lost
        assert (
            buffer is not None
            and buffer["frames_spilled"] > 0
            and buffer["peak_in_flight_bytes"] <= WINDOW
        )
    assert [r.call_id for r in results] == [f"r{i}" for i in range(calls)]
    assert not any(r.is_error for r in results), results[0].text[:300]
    assert all(len(r.text) >= megabytes * 1_000_000 for r in results)
    ends = [i for i in items if isinstance(i, ToolEnd)]
    assert sorted(e.call_id for e in ends) == sorted(r.call_id for r in results)  # once each
    starts = [i for i in items if isinstance(i, MessageStart)]
    assert [m.message.content for m in starts] == [r.text for r in results]  # rebuilt


@pytest.mark.spec("L5")
def test_L5_a_client_that_does_not_read_is_held_then_let_go(
    tmp_path: Path, workspace: Path
) -> None:
    _big_file(workspace / "big.txt", 4)
    env = {"TOOLPOOL_CLIENT_BUFFER_BYTES": str(WINDOW), "TOOLPOOL_CLIENT_STALL_SECONDS": "3"}
    with running_daemon(tmp_path, env=env) as daemon, Client(runtime_dir=daemon.runtime) as other:
        flooder = Client(runtime_dir=daemon.runtime, name="flooder").__enter__()
        try:
            session = flooder.session(workspace, **UNBUDGETED)
            turn = session.submit(_reads("big.txt", 150))  # and then it reads nothing
            held: list[dict[str, Any]] = []

            def is_held() -> bool:
                buffer = _buffer_of(other.status(), "flooder")
                held.append(buffer or {})
                return buffer is not None and buffer["held"]

            wait_for(is_held, timeout=120)
            assert held[-1]["spilled_bytes"] > 0  # waiting on disk
            # Meanwhile the other client's calls all complete.
            with other.session(workspace) as mine:
                small = mine.submit([ToolCall(f"s{i}", "noop", {}) for i in range(20)]).results()
            assert not any(r.is_error for r in small)
            # The daemon's own accounting never had more than the window out to it.
            wait_for(lambda: _buffer_of(other.status(), "flooder") is None, timeout=120)
            assert max(b.get("peak_in_flight_bytes", 0) for b in held) <= WINDOW
            assert not other.status()["sessions"]  # its session is closed, its turn aborted
            lines = [str(line.get("msg", "")) for line in daemon.log_lines()]
            assert any("flooder stalled" in line and "disconnected" in line for line in lines)
            with pytest.raises(DaemonUnavailable, match="client_stall_seconds"):
                turn.results(timeout=60)
        finally:
            flooder.close()


@pytest.mark.spec("L6")
def test_L6_sessions_are_bounded_per_client_and_per_daemon(tmp_path: Path, workspace: Path) -> None:
    env = {"TOOLPOOL_MAX_SESSIONS_PER_CLIENT": "3", "TOOLPOOL_MAX_SESSIONS": "4"}
    with (
        running_daemon(tmp_path, env=env) as daemon,
        Client(runtime_dir=daemon.runtime) as one,
        Client(runtime_dir=daemon.runtime) as two,
    ):
        mine = [one.session(workspace) for _ in range(3)]
        with pytest.raises(RequestFailed, match="max_sessions_per_client") as refused:
            one.session(workspace)
        assert refused.value.code == "limit"
        two.session(workspace)
        with pytest.raises(RequestFailed, match="max_sessions allows"):
            two.session(workspace)
        mine[0].close()
        two.session(workspace)  # a closed session frees its place


@pytest.mark.spec("L6")
def test_L6_closed_sessions_leave_nothing_in_the_daemons_tables(
    tmp_path: Path, workspace: Path
) -> None:
    with running_daemon(tmp_path) as daemon, Client(runtime_dir=daemon.runtime) as client:
        for _ in range(5000):
            client.session(workspace).close()
        wait_for(lambda: not any(client.status()["session_tables"].values()), timeout=60)
        assert client.status()["sessions"] == {}


@pytest.mark.spec("L7")
def test_L7_the_next_start_removes_what_a_killed_daemon_left(tmp_path: Path) -> None:
    first = start_daemon(tmp_path)
    with Client(runtime_dir=first.runtime) as client:
        cgroups_used = client.status()["sandbox"]["cgroups"]["active"]
    tree = first.tree()
    left = [first.runtime / f"{kind}-{first.pid}" for kind in ("scratch", "spill", "workers")]
    assert all(p.is_dir() for p in left)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    wait_for(lambda: not any(running(p) for p in tree), timeout=60)  # its pool follows it
    assert all(p.is_dir() for p in left)  # a killed daemon cleans nothing
    (tmp_path / "again").mkdir()
    second = start_daemon(tmp_path / "again", runtime=first.runtime)
    try:
        assert not any(p.exists() for p in left)
        messages = [str(line.get("msg", "")) for line in second.log_lines()]
        said = [m for m in messages if "an earlier daemon left" in m]
        assert said and all(p.name in said[0] for p in left)
        if cgroups_used:
            # Gone — removed by this start, or by a daemon that the suite's other worker
            # started meanwhile in the same parent cgroup (its start removes them too)
            cgroups = [h.own / f"toolpool-{first.pid}" for h in discover()]
            assert cgroups and not any(c.exists() for c in cgroups)
            for named in [m for m in messages if "cgroups an earlier daemon left" in m]:
                # what this start names as removed was a dead daemon's, never a live one's
                removed = [Path(c) for c in named.split(": ", 1)[1].split(", ")]
                assert all(not running(int(c.name.split("-")[1])) for c in removed)
    finally:
        assert stop_daemon(second) == 0


@pytest.mark.spec("L7")
def test_L7_a_stale_group_removed_meanwhile_by_another_start_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a dead daemon's cgroup tree that another daemon, starting at the same moment,
    # is removing: one of its groups vanishes while this start walks the tree
    from toolpool.sandbox import cgroups

    stale = tmp_path / "toolpool-999999999"
    for name in ("w1", "w2/sub", "w3"):
        (stale / name).mkdir(parents=True)
    real_scandir = cgroups.os.scandir

    def scandir(path: Any) -> Any:
        if Path(path) == stale / "w2":  # listed above it, gone when descended into
            (stale / "w2" / "sub").rmdir()
            (stale / "w2").rmdir()
        return real_scandir(path)

    monkeypatch.setattr(cgroups.os, "scandir", scandir)
    hierarchy = cgroups.Hierarchy(1, tmp_path, tmp_path, frozenset({"pids"}))
    monkeypatch.setattr(cgroups, "discover", lambda: [hierarchy])
    monkeypatch.setattr(cgroups, "_kill_members", lambda group: None)  # no members here
    # When this start removes what dead daemons left
    removed = cgroups.remove_stale_cgroups(alive=lambda pid: False)
    # Then it is no error: the tree is gone, and said so
    assert removed == [str(stale)]
    assert not stale.exists()
