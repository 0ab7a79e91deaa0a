"""One blocking ``Client`` shared by threads (SPEC A1): a thread that follows an idle
open turn for as long as it lives never keeps another thread's request from its
answer, and every request is answered — or times out — within its own timeout."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client, ClientTimeout, ToolCall, ToolEnd
from toolpool.client.core import TurnItem

from .daemon_support import Daemon, shared_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("threads")) as running:
        yield running


def _in_threads(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run each job in a thread of its own, all at once; what each returned or raised."""
    outcomes: list[Any] = [None] * len(jobs)

    def run(index: int) -> None:
        try:
            outcomes[index] = jobs[index]()
        except BaseException as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)  # a hang guard: the test's own timeout ends it first
    assert not any(thread.is_alive() for thread in threads), "a thread never got its answer"
    return outcomes


@pytest.mark.spec("A1", "D5")
def test_threads_share_a_client_while_one_follows_an_idle_open_turn(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("one two three\n")
    with Client(runtime_dir=daemon.runtime, timeout=10) as client:
        session = client.session(workspace)
        turn = session.submit([], open=True)
        followed: list[TurnItem] = []
        follower = threading.Thread(target=lambda: followed.extend(turn.follow()))
        follower.start()  # it reads the socket, and waits: the turn is idle

        def status() -> int:
            return len(client.status()["sessions"])

        def tools() -> list[str]:
            return [t["name"] for t in client.tools()]

        def other_session(number: int) -> str:
            with client.session(workspace) as mine:
                calls = [ToolCall(f"r{number}", "read", {"path": "notes.txt"})]
                (result,) = mine.submit(calls).results(timeout=10)
                return result.text

        def in_the_open_turn(number: int) -> str:
            (call_id,) = turn.add([ToolCall(f"open{number}", "lookup", {"key": "alpha"})])
            return turn.result(call_id, timeout=10).text

        jobs: list[Callable[[], Any]] = []
        for number in range(3):
            jobs += [
                status,
                tools,
                lambda n=number: other_session(n),
                lambda n=number: in_the_open_turn(n),
            ]
        outcomes = _in_threads(jobs)
        turn.close()
        follower.join(30)
        assert not follower.is_alive()

    failures = [o for o in outcomes if isinstance(o, BaseException)]
    assert failures == []
    assert all(isinstance(n, int) and n >= 1 for n in outcomes[0::4])
    assert all("read" in names for names in outcomes[1::4])
    assert all("one two three" in text for text in outcomes[2::4])
    assert outcomes[3::4] == ["value of alpha"] * 3
    # The follower saw every call of the open turn end, then the turn's end.
    ended = {item.call_id for item in followed if isinstance(item, ToolEnd)}
    assert ended == {"open0", "open1", "open2"}
    assert followed[-1].type == "turn_end"


@pytest.mark.spec("A1")
def test_a_threads_timeout_is_its_own_while_another_thread_reads(
    daemon: Daemon, workspace: Path
) -> None:
    """A call that outlives a waiting thread's timeout: that thread gets its
    ClientTimeout, the reading thread is not disturbed, and the call's result
    still reaches whoever waits for it after."""
    marker = workspace / "go"
    with Client(runtime_dir=daemon.runtime, timeout=10) as client:
        session = client.session(workspace)
        turn = session.submit([], open=True)
        followed: list[TurnItem] = []
        follower = threading.Thread(target=lambda: followed.extend(turn.follow()))
        follower.start()
        (slow,) = turn.add([ToolCall("slow", "wait_for", {"name": "go"})])

        def impatient() -> Any:
            return turn.result(slow, timeout=0.3)

        (outcome,) = _in_threads([impatient])
        assert isinstance(outcome, ClientTimeout)
        assert "call slow did not end within 0.3 s" in str(outcome)
        marker.write_text("now")  # the call may end: its result is still there
        assert not turn.result(slow, timeout=20).is_error
        turn.close()
        follower.join(30)
        assert not follower.is_alive()
    assert [i.call_id for i in followed if isinstance(i, ToolEnd)] == ["slow"]


@pytest.mark.spec("A1")
def test_closing_the_client_ends_a_thread_that_follows(daemon: Daemon, workspace: Path) -> None:
    """A client closed while another thread follows an open turn: that thread ends
    with the connection's error, and the close does not hang."""
    from toolpool import DaemonUnavailable

    client = Client(runtime_dir=daemon.runtime, timeout=10)
    client.connect()
    turn = client.session(workspace).submit([], open=True)
    outcome: list[BaseException] = []

    def follow() -> None:
        try:
            list(turn.follow())
        except DaemonUnavailable as exc:
            outcome.append(exc)

    follower = threading.Thread(target=follow)
    follower.start()
    client.status()  # answered while the follower reads
    client.close()
    follower.join(30)
    assert not follower.is_alive()
    assert len(outcome) == 1 and "closed" in str(outcome[0])
