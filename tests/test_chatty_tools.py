"""SPEC L12: a tool that prints or reports progress in a tight loop does not stall
the daemon — its text arrives whole and in order, in fewer events than lines, and a
worker that floods its socket outright never keeps the daemon from other sessions.
Real daemon, real workers."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from toolpool import Client, ToolCall, ToolEnd, ToolUpdate
from toolpool.protocol import Progress, Result
from toolpool.protocol.wire import CallStatus
from toolpool.worker.lines import PROGRESS_TEXT, coalesced

from .daemon_support import running_daemon

MODULES = ("--tool-modules", "tests.hostile_tools")


@pytest.mark.spec("L12")
def test_L12_text_progress_waiting_together_goes_as_one_update_nothing_lost() -> None:
    waiting = [
        Progress("a", "1\n"),
        Progress("a", "2\n"),
        Progress("a", {"done": 2}),  # not text: as it is, and it ends the run
        Progress("a", "3\n"),
        Progress("b", "other call\n"),  # another call's: a run of its own
        Progress("a", "4\n"),
        Progress("a", "step 5"),  # reports that end no line are never run together
        Progress("a", "step 6"),
        Progress("a", "7\n"),
        Result("a", CallStatus.OK, {}),
    ]
    out = coalesced(list(waiting))
    assert out == [
        Progress("a", "1\n2\n"),
        Progress("a", {"done": 2}),
        Progress("a", "3\n"),
        Progress("b", "other call\n"),
        Progress("a", "4\n"),
        Progress("a", "step 5"),
        Progress("a", "step 6"),
        Progress("a", "7\n"),
        Result("a", CallStatus.OK, {}),
    ]
    # A long run is cut at PROGRESS_TEXT characters per update; joined, it is whole
    line = "x" * 1000 + "\n"
    many = coalesced([Progress("a", line) for _ in range(200)])
    assert all(isinstance(m, Progress) and len(m.data) <= PROGRESS_TEXT for m in many)
    assert 1 < len(many) < 200
    assert "".join(m.data for m in many if isinstance(m, Progress)) == line * 200


@pytest.mark.spec("L12")
def test_L12_a_tool_that_prints_line_by_line_is_read_whole_and_in_order(
    tmp_path: Path, workspace: Path
) -> None:
    lines = 20_000
    with (
        running_daemon(tmp_path, *MODULES) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=120) as client,
        client.session(workspace) as session,
    ):
        turn = session.submit([ToolCall("p", "print_lines", {"count": lines})])
        printed = []
        for event in turn:
            if isinstance(event, ToolUpdate) and event.call_id == "p":
                printed.append(event.data)
            elif isinstance(event, ToolEnd):
                assert not event.result.is_error, event.result.text
    # Every line, in order, nothing twice (in as many updates as flushes)
    assert "".join(printed) == "".join(f"{i}\n" for i in range(lines))
    assert len(printed) <= lines


@pytest.mark.spec("L12")
def test_L12_a_worker_flooding_its_socket_never_keeps_other_sessions_waiting(
    tmp_path: Path, workspace: Path
) -> None:
    release, seen = tmp_path / "release", workspace / "seen"
    counted = Path(f"{seen}.count")
    with (
        running_daemon(tmp_path, *MODULES) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=120) as flooding,
        Client(runtime_dir=daemon.runtime, timeout=120) as other,
        flooding.session(workspace) as loud,
        other.session(workspace) as quiet,
    ):
        # Given a call whose tool floods its worker's socket with progress frames,
        # faster than the daemon reads them (its sends block at ZeroMQ's high-water
        # mark: it goes at the daemon's pace), until the test releases it
        args = {"release": str(release), "seen": str(seen)}
        turn = loud.submit([ToolCall("f", "flood_progress", args)])
        for event in turn:
            if isinstance(event, ToolUpdate):
                break  # it floods
        # When another session runs calls meanwhile (the first leaves a mark the
        # flooding tool counts its frames at), they complete
        (noted,) = quiet.submit(
            [ToolCall("n", "write_note", {"path": "seen", "text": "x"})]
        ).results()
        assert not noted.is_error, noted.text
        for i in range(3):
            (result,) = quiet.submit([ToolCall(f"q{i}", "lookup", {"key": str(i)})]).results()
            assert result.text == f"value of {i}"
        for _ in range(6000):  # a hang guard: the count comes within ms
            if counted.exists() and counted.read_text():
                break
            time.sleep(0.01)
        release.touch()
        (flooded,) = turn.results()
        assert flooded.text.startswith("sent ")
    # Then the daemon read the other session's calls while the flood was young: a
    # few loop turns of 64 frames each, and ZeroMQ's buffers — not the flood's whole
    # backlog (a count, not a time: the flood goes at the daemon's pace)
    assert int(counted.read_text()) < 100_000


@pytest.mark.spec("L12")
@pytest.mark.parametrize("kind", ["surrogate", "object"])
def test_L12_progress_that_cannot_be_sent_fails_the_tool_not_its_worker(
    tmp_path: Path, workspace: Path, kind: str
) -> None:
    with (
        running_daemon(tmp_path, *MODULES) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=120) as client,
        client.session(workspace) as session,
    ):
        # Given a tool whose progress cannot be encoded (after some that can)
        turn = session.submit([ToolCall("u", "unsendable_progress", {"kind": kind})])
        updates = [e.data for e in turn if isinstance(e, ToolUpdate)]
        (failed,) = turn.results()
        # Then the tool's own report raised, in the tool: its call is the error
        assert failed.is_error and failed.error_code is not None
        assert failed.error_code.value == "execution_failed", failed.text
        assert "fine so far\n" in "".join(u for u in updates if isinstance(u, str))
        # and its worker goes on (not lost, not replaced), and so does the session
        pid = failed.details.get("worker_pid")
        assert isinstance(pid, int) and psutil.pid_exists(pid)
        (after,) = session.submit([ToolCall("l", "lookup", {"key": "k"})]).results()
        assert after.text == "value of k"
        assert psutil.pid_exists(pid) and pid in daemon.tree()
