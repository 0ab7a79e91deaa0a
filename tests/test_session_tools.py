"""Tools of the agent's own program, shipped with a session and run in toolpool's
workers (SPEC A5, A6): defined in a test body (closures), run confined, under the
session's limits and the pipeline, in workers bound to their session alone — and
never unpickled by the daemon."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from toolpool import AsyncClient, Client, RequestFailed, ToolCall, ToolContext, tool
from toolpool.client import shipping
from toolpool.client.errors import ShippingError
from toolpool.client.toolbox import AsyncToolbox
from toolpool.models import ErrorCode, ToolStart
from toolpool.sandbox.profile import SandboxProfile
from toolpool.tool import ValidationResult

from .daemon_support import Daemon, shared_daemon

PROFILE = SandboxProfile.probe()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("shipped")) as running:
        yield running


def _call(tool: str, **arguments: Any) -> ToolCall:
    return ToolCall(f"c-{uuid.uuid4().hex[:8]}", tool, arguments)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.spec("A5")
def test_A5_a_closure_of_a_test_body_runs_in_a_worker(daemon: Daemon, workspace: Path) -> None:
    # Given a closure over a local of this test, shipped with a session
    offset = 41

    def add(x: int) -> dict[str, int]:
        """Add the offset to x.

        Args:
            x: A number.
        """
        return {"sum": x + offset, "pid": os.getpid()}

    with (
        Client(runtime_dir=daemon.runtime) as client,
        client.session(workspace, tools=[add]) as session,
    ):
        # When the model calls it, well and badly
        ran, coerced, invalid = session.submit(
            [_call("add", x=1), _call("add", x="2"), _call("add", x="two")]
        ).results()
        listed = client.status()["sessions"][session.id]["shipped_tools"]
        assert [t.name for t in session.shipped_tools] == ["add"]
    # Then it ran in a worker of the daemon's: not this process, not the daemon
    assert not ran.is_error, ran.text
    answer = ran.to_dict()["content"][0]["text"]
    assert '"sum": 42' in answer
    pid = ran.details["worker_pid"]
    assert f'"pid": {pid}' in answer
    assert pid not in (os.getpid(), daemon.pid)
    # ... through the pipeline, with the schema its signature gives (P5)
    assert '"sum": 43' in coerced.text and coerced.details["coerced"]
    assert invalid.error_code is ErrorCode.INVALID_ARGUMENTS, invalid.text
    assert listed == ["add"]


@pytest.mark.spec("A5", "X7")
def test_A5_a_shipped_tool_meets_the_sessions_limits(daemon: Daemon, workspace: Path) -> None:
    def spin(seconds: float) -> str:
        """Spin the CPU.

        Args:
            seconds: For how long.
        """
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
        return "spun"

    with (
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
        client.session(workspace, tools=[spin], limits={"cpu_seconds": 1}) as session,
    ):
        (stopped,) = session.submit([_call("spin", seconds=30)]).results()
    assert stopped.error_code is ErrorCode.LIMIT_EXCEEDED, stopped.text
    assert "cpu_seconds" in stopped.text, stopped.text


@pytest.mark.spec("A5", "X2")
def test_A5_X2_a_shipped_tool_is_confined_as_a_workers_tool(
    daemon: Daemon, workspace: Path
) -> None:
    # Given a listener on this host's loopback, and the daemon's control socket
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    control = str(daemon.runtime / "daemon.sock")

    def escape() -> dict[str, str]:
        """Try the doors."""
        from toolpool.client import Client as Inner
        from toolpool.client import ClientError

        tried = {}
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            tried["loopback"] = "connected"
        except OSError as exc:
            tried["loopback"] = f"refused: {exc}"
        try:
            with Inner(f"ipc://{control}", connect_timeout=3.0, timeout=3.0) as inner:
                tried["daemon"] = f"answered: {inner.status()['pid']}"
        except (ClientError, OSError) as exc:
            tried["daemon"] = f"refused: {exc}"
        return tried

    try:
        with (
            Client(runtime_dir=daemon.runtime, timeout=60) as client,
            client.session(workspace, tools=[escape]) as session,
        ):
            (tried,) = session.submit([_call("escape")]).results()
    finally:
        listener.close()
    assert not tried.is_error, tried.text
    # The daemon refuses a confined process (X2) ...
    assert '"daemon": "refused' in tried.text, tried.text
    # ... and an offline session's worker has a network namespace of its own
    if PROFILE.active("netns"):
        assert '"loopback": "refused' in tried.text, tried.text


@pytest.mark.spec("A6")
def test_A6_a_bound_worker_takes_no_other_sessions_call_and_retires_with_its_session(
    daemon: Daemon, workspace: Path
) -> None:
    def whose_a() -> int:
        """This worker's pid."""
        return os.getpid()

    def whose_b() -> int:
        """This worker's pid."""
        return os.getpid()

    (workspace / "f.txt").write_text("x\n")
    seen_a: set[int] = set()
    others: set[int] = set()
    with (
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
        client.session(workspace, tools=[whose_a]) as a,
        client.session(workspace, tools=[whose_b]) as b,
        client.session(workspace) as plain,
    ):
        # When the three sessions' calls interleave, turn after turn
        for _ in range(4):
            turns = [
                a.submit([_call("whose_a"), _call("read", path="f.txt")]),
                b.submit([_call("whose_b"), _call("read", path="f.txt")]),
                plain.submit([_call("read", path="f.txt"), _call("bash", command="true")]),
            ]
            (bound_a, read_a), (bound_b, read_b), (read_p, bash_p) = (t.results() for t in turns)
            assert not bound_a.is_error and not bound_b.is_error, (bound_a.text, bound_b.text)
            seen_a.add(int(bound_a.text))
            others |= {int(bound_b.text), read_a.details["worker_pid"]}
            others.update(r.details["worker_pid"] for r in (read_b, read_p, bash_p))
        a.close()
        # Then a worker that loaded a's tools ran nothing but a's calls of them ...
        assert seen_a and not seen_a & others
        # ... and retires once a is closed, while the others go on
        deadline = time.monotonic() + 30  # a hang guard, not a measure
        while not all(_gone(pid) for pid in seen_a) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in seen_a)
        (again,) = b.submit([_call("whose_b")]).results()
        assert not again.is_error and int(again.text) not in seen_a


@pytest.mark.spec("A6")
def test_A6_the_daemon_never_unpickles_a_shipped_tool(daemon: Daemon, workspace: Path) -> None:
    # Given a tool whose unpickling leaves a mark: the pid of the process that loads it
    marks = workspace / "marks"

    def leave_mark(path: str) -> str:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return path

    class Marker:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return leave_mark, (str(marks),)

    marker = Marker()

    def marked() -> int:
        """The pid of the worker that runs it."""
        assert marker  # the closure holds the marker: loading the tool loads it
        return os.getpid()

    with (
        Client(runtime_dir=daemon.runtime) as client,
        client.session(workspace, tools=[marked]) as session,
    ):
        (ran,) = session.submit([_call("marked")]).results()
        daemon_pid = client.daemon_pid
    # Then only the worker that ran it loaded it: not the daemon, not this client
    loaded = {int(line) for line in marks.read_text().split()}
    assert not ran.is_error, ran.text
    assert loaded == {int(ran.text)}
    assert daemon_pid not in loaded and os.getpid() not in loaded


@pytest.mark.spec("A5")
def test_A5_tools_a_worker_cannot_load_are_each_calls_error_naming_why(
    daemon: Daemon, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a tool using a module this program imports and the daemon's workers cannot
    (tmp_path / "only_here.py").write_text("def twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here  # type: ignore[import-not-found]

    monkeypatch.delitem(sys.modules, "only_here")  # gone again once the test ends

    def doubled(x: int) -> int:
        """Double x."""
        return int(only_here.twice(x))

    with (
        Client(runtime_dir=daemon.runtime) as client,
        client.session(workspace, tools=[doubled]) as session,
    ):
        (workspace / "f.txt").write_text("x\n")
        first, read = session.submit([_call("doubled", x=2), _call("read", path="f.txt")]).results()
        (second,) = session.submit([_call("doubled", x=3)]).results()
    # Then each call of it is an error that names the module, and nothing else fails
    for result in (first, second):
        assert result.error_code is ErrorCode.EXECUTION_FAILED, result.text
        assert "could not be loaded" in result.text and "'only_here'" in result.text
    assert not read.is_error, read.text


@pytest.mark.spec("A5")
def test_A5_a_tool_that_cannot_be_shipped_is_refused_naming_what(
    daemon: Daemon, workspace: Path
) -> None:
    numbers = (n for n in range(3))  # a generator: dill cannot pickle one

    def first() -> int:
        """The first number."""
        return next(numbers)

    with Client(runtime_dir=daemon.runtime) as client:
        with pytest.raises(ShippingError) as unpicklable:
            client.session(workspace, tools=[first])
        with pytest.raises(ShippingError) as per_call:
            client.session(workspace, tools=[tool(read_only=lambda args: True)(first)])
        with pytest.raises(ShippingError) as no_function:
            client.session(workspace, tools=[print])
        with pytest.raises(ShippingError) as no_hints:
            client.session(workspace, tools=[lambda x: x])
        assert client.status()["sessions"] == {}  # nothing was opened
    assert "'first'" in str(unpicklable.value)
    assert "closure variable 'numbers'" in str(unpicklable.value)
    assert "generator" in str(unpicklable.value)
    assert "read_only is a function" in str(per_call.value)
    assert "ship a function" in str(no_function.value)
    assert "needs a type hint" in str(no_hints.value)


@pytest.mark.spec("A6")
def test_A6_a_client_of_another_python_is_refused_naming_both(
    daemon: Daemon, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def noop() -> None:
        """Nothing."""

    monkeypatch.setattr(shipping, "PYTHON", "3.99")
    with Client(runtime_dir=daemon.runtime) as client:
        with pytest.raises(RequestFailed) as refused:
            client.session(workspace, tools=[noop])
        assert client.status()["sessions"] == {}
    assert refused.value.code == "bad_request"
    assert "'3.99'" in refused.value.message
    assert f"'{sys.version_info.major}.{sys.version_info.minor}'" in refused.value.message


@pytest.mark.spec("A5", "T2")
def test_A5_a_tool_keeps_its_options(daemon: Daemon, workspace: Path) -> None:
    # Given @tool functions with options: read-only, a validate and a preview of their own
    def positive(args: dict[str, Any], ctx: ToolContext) -> ValidationResult:
        if args["n"] < 0:
            return ValidationResult.failed("n must not be negative", code=7)
        return ValidationResult.passed()

    @tool(read_only=True, label="Peek", activity="Peeking at {n}")
    def peek(n: int) -> int:
        """Read n."""
        return n

    @tool(validate=positive, preview=lambda args, ctx: f"would write {args['n']}")
    def poke(n: int) -> int:
        """Write n."""
        return n

    asked: list[str] = []

    def approve(request: Any) -> bool:
        asked.append(f"{request.call.name}: {request.request.preview}")
        return True

    with (
        Client(runtime_dir=daemon.runtime) as client,
        client.session(workspace, tools=[peek, poke], gate="ask", on_approval=approve) as s,
    ):
        turn = s.submit([_call("peek", n=1), _call("poke", n=2), _call("poke", n=-1)])
        looked, wrote, refused = turn.results()
        starts = [e for e in turn.events if isinstance(e, ToolStart)]
    # Then the gate asked about the one that writes, with its preview, never the read-only
    assert asked == ["poke: would write 2"]
    assert (looked.text, wrote.text) == ("1", "2")
    # ... its validate refused in its worker (P6), and the label and activity are its own
    assert refused.error_code is ErrorCode.VALIDATION_FAILED and "negative" in refused.text
    start = next(e for e in starts if e.tool_name == "peek")
    assert (start.label, start.activity) == ("Peek", "Peeking at 1")


@pytest.mark.spec("A5", "A2")
async def test_A5_A2_a_toolbox_offers_the_tools_it_ships(daemon: Daemon, workspace: Path) -> None:
    calls = 0

    async def tally(word: str) -> str:
        """Say the word back, numbered.

        Args:
            word: Any word.
        """
        return f"{word} #{calls + 1}"

    async with AsyncClient(runtime_dir=daemon.runtime) as client:
        async with AsyncToolbox(client, workspace, tools=[tally]) as toolbox:
            offered = {d.name: d for d in await toolbox.definitions()}
            said = await toolbox.call("tally", {"word": "hi"})
        # A name the daemon has is its own: a shipped tool cannot take it
        with pytest.raises(RequestFailed, match="session tools refused: tool 'read'"):
            async with client.session(workspace, tools=[tool(name="read")(tally)]):
                pass
    assert "read" in offered and offered["tally"].description.startswith("Say the word")
    assert offered["tally"].schema["required"] == ["word"]
    assert said.text == "hi #1", said.text


@pytest.mark.spec("A6", "D4")
def test_A6_a_stubborn_tool_goes_with_its_session(daemon: Daemon, workspace: Path) -> None:
    # Given a shipped tool that ignores the cancel signal and sleeps
    started = workspace / "started"

    @tool(interrupt_behavior="cancel")
    def stubborn() -> str:
        """Sleep through everything."""
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        started.write_text(str(os.getpid()))
        time.sleep(120)
        return "woke"

    with Client(runtime_dir=daemon.runtime, timeout=60) as client:
        session = client.session(workspace, tools=[stubborn])
        session_id = session.id
        turn = session.submit([_call("stubborn")])
        deadline = time.monotonic() + 30  # hang guards, not measures
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(started.read_text())
        assert client.status()["sessions"][session_id]["bound_workers"] == [pid]
        # When the session closes under it
        session.close()
        (result,) = turn.results()
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Then the call ended cancelled, its worker is gone, and the session with it
        assert result.error_code is ErrorCode.CANCELLED, result.text
        assert _gone(pid)
        assert session_id not in client.status()["sessions"]
