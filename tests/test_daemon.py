"""The daemon and the client library end to end: a real daemon subprocess, real
sockets, real workers (SPEC D1, D5, M1-M2, P8 over the wire)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from toolpool import (
    AsyncClient,
    Client,
    ClientTimeout,
    DaemonUnavailable,
    ErrorCode,
    RequestFailed,
    ToolCall,
    ToolEnd,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    UpdateKind,
)
from toolpool.client import ApprovalRequested
from toolpool.client.core import FORGET_BATCH
from toolpool.protocol import MAX_FRAME_BYTES, Hello, Status, decode, encode
from toolpool.providers import parse_tool_calls

from .conftest import SHARED_ROOTS
from .daemon_support import (
    ROOT,
    Daemon,
    daemon_env,
    running,
    shared_daemon,
    start_daemon,
    stop_daemon,
)

FIXTURES = Path(__file__).parent / "fixtures" / "providers"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("daemon")) as started:
        yield started


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=20) as connected:
        yield connected


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, name, arguments)


def gated(release: str, before: str = "waiting", after: str = "released") -> str:
    """A bash command that prints ``before``, waits until the file ``release`` exists
    in the workspace (its working directory), then prints ``after``: the test, not a
    clock, decides when it goes on."""
    return f"echo {before}; while [ ! -e {release} ]; do sleep 0.02; done; echo {after}"


def first_progress(turn: Any, call_id: str) -> list[Any]:
    """Read ``turn`` up to the first progress event of ``call_id``; what was read."""
    seen = []
    for event in turn:
        seen.append(event)
        if (
            isinstance(event, ToolUpdate)
            and event.call_id == call_id
            and event.kind is UpdateKind.PROGRESS
        ):
            return seen
    raise AssertionError(f"{call_id} reported no progress")


def eventually(condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll until ``condition()`` holds. ``timeout`` is a hang guard only: what is
    waited for is expected within a fraction of a second."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# --- turns ------------------------------------------------------------------------------


@pytest.mark.spec("D5", "S2")
def test_D5_parallel_safe_calls_and_exclusive_ones(client: Client, workspace: Path) -> None:
    (workspace / "a.txt").write_text("alpha\n")
    with client.session(workspace) as session:
        turn = session.submit(
            [
                call("r1", "nap", seconds=0.3),
                call("r2", "nap", seconds=0.3),
                call("w", "write", path="b.txt", content="beta\n"),
                call("r3", "read", path="a.txt"),
            ]
        )
        order = [(type(e).__name__, e.call_id) for e in turn if isinstance(e, ToolStart | ToolEnd)]
        results = turn.results()
    # the two safe naps ran side by side, the write alone, the read after it
    assert order[:2] == [("ToolStart", "r1"), ("ToolStart", "r2")]
    assert order.index(("ToolStart", "w")) > max(
        order.index(("ToolEnd", "r1")), order.index(("ToolEnd", "r2"))
    )
    assert order.index(("ToolStart", "r3")) > order.index(("ToolEnd", "w"))
    assert [r.call_id for r in results] == ["r1", "r2", "w", "r3"]  # S6
    assert not any(r.is_error for r in results)
    assert (workspace / "b.txt").read_text() == "beta\n"


@pytest.mark.spec("D5", "P9")
def test_D5_events_stream_before_the_turn_ends(client: Client, workspace: Path) -> None:
    # The command prints "first", then waits for a file that the test creates only
    # once it has seen "first": had events been held back until the command ended,
    # the test would never see it, and the command would run into its timeout (a
    # hang guard) before the file exists.
    command = gated("release", before="first", after="second")
    with client.session(workspace) as session:
        turn = session.submit([call("b", "bash", command=command, timeout=30)])
        seen = first_progress(turn, "b")
        (workspace / "release").touch()
        rest = list(turn)
        (result,) = turn.results()
    assert seen[-1].data == "first\n"  # streamed while the command waited for the test
    # The command ended by the release, not by its timeout: "first" came before its end
    assert result.text == "first\nsecond\nExit code: 0"
    kinds = [e.type if isinstance(e, str) else e.type.value for e in seen + rest]
    assert kinds[-1] == "turn_end"
    assert kinds.count("message_start") == kinds.count("message_end") == 1  # M2


@pytest.mark.spec("M1", "M2")
def test_M2_results_and_messages_over_the_wire(client: Client, workspace: Path) -> None:
    with client.session(workspace) as session:
        turn = session.submit([call("x", "nope"), call("y", "noop")])
        results = turn.results()
        events = turn.events
    assert results[0].error_code is ErrorCode.TOOL_NOT_FOUND  # a result, not an exception
    assert results[1].text == "ok"
    turn_end = events[-1]
    assert isinstance(turn_end, TurnEnd)
    assert turn_end.results == results


# --- approvals ----------------------------------------------------------------------------


@pytest.mark.spec("P8", "D5")
def test_P8_approvals_approved_and_denied_over_the_wire(client: Client, workspace: Path) -> None:
    asked: list[ApprovalRequested] = []

    def decide(request: ApprovalRequested) -> Any:
        asked.append(request)
        return True if request.call.id == "yes" else (False, "not today")

    with client.session(workspace, gate="ask", on_approval=decide) as session:
        results = session.submit(
            [
                call("look", "read", path="."),  # read-only: not asked
                call("yes", "write", path="new.txt", content="hello\n"),
                call("no", "bash", command="echo should not run"),
            ]
        ).results()
    assert [r.call.id for r in asked] == ["yes", "no"]
    assert asked[0].preview.startswith("--- /dev/null")  # the diff, for the user to judge
    assert asked[0].label == "Write"
    assert not results[0].is_error
    assert not results[1].is_error
    assert results[2].error_code is ErrorCode.DENIED
    assert results[2].text == "not today"
    assert (workspace / "new.txt").read_text() == "hello\n"


@pytest.mark.spec("P8")
def test_P8_no_answer_in_time_is_a_denial(client: Client, workspace: Path) -> None:
    with client.session(workspace, gate="ask", approval_timeout=0.5) as session:
        turn = session.submit([call("w", "write", path="x.txt", content="x")])
        items = list(turn)
    request = next(i for i in items if isinstance(i, ApprovalRequested))
    assert not request.answered
    (result,) = turn.results()
    assert result.error_code is ErrorCode.DENIED
    assert result.text == "Not approved: no answer within 0.5 s."
    assert not (workspace / "x.txt").exists()


@pytest.mark.spec("P8")
def test_P8_approval_answered_from_the_event_stream(client: Client, workspace: Path) -> None:
    with client.session(workspace, gate="ask") as session:
        turn = session.submit([call("w", "write", path="x.txt", content="x")])
        for item in turn:
            if isinstance(item, ApprovalRequested):
                item.approve()
        (result,) = turn.results()
    assert not result.is_error


@pytest.mark.spec("P8")
def test_P8_policy_rules(client: Client, workspace: Path) -> None:
    policy = [
        {"tool": "bash", "action": "deny"},
        {"read_only": True, "action": "allow"},
        {"permission": "write", "action": "ask"},
    ]
    asked: list[str] = []
    with client.session(
        workspace,
        gate="policy",
        policy=policy,
        on_approval=lambda r: asked.append(r.call.id) or True,
    ) as session:
        results = session.submit(
            [
                call("ls", "ls"),
                call("sh", "bash", command="true"),
                call("wr", "write", path="p.txt", content="p"),
            ]
        ).results()
    assert [r.is_error for r in results] == [False, True, False]
    assert results[1].error_code is ErrorCode.DENIED
    assert "policy rule 0" in results[1].text
    assert asked == ["wr"]
    with pytest.raises(RequestFailed, match="policy rule 0"):
        client.session(workspace, gate="policy", policy=[{"action": "maybe"}])


# --- interrupts ---------------------------------------------------------------------------


def wait_started(turn: Any, call_id: str) -> list[Any]:
    seen = []
    for event in turn:
        seen.append(event)
        if isinstance(event, ToolStart) and event.call_id == call_id:
            time.sleep(0.3)
            return seen
    raise AssertionError(f"{call_id} never started")


@pytest.mark.spec("S4", "D5")
def test_S4_interrupt_mid_turn(client: Client, workspace: Path) -> None:
    with client.session(workspace) as session:
        turn = session.submit(
            [
                call("cancel", "nap", seconds=60),
                call("block", "chore", seconds=1),
                call("queued", "write", path="q.txt", content="q"),
            ]
        )
        wait_started(turn, "block")
        session.interrupt()
        results = turn.results()
    assert [r.error_code for r in results] == [ErrorCode.INTERRUPTED, None, ErrorCode.SKIPPED]
    assert not (workspace / "q.txt").exists()


@pytest.mark.spec("S5", "D5")
def test_S5_abort_mid_turn(client: Client, workspace: Path) -> None:
    with client.session(workspace) as session:
        turn = session.submit([call("a", "chore", seconds=60), call("b", "nap", seconds=60)])
        wait_started(turn, "b")
        turn.abort()
        results = turn.results()
    assert [r.text for r in results] == ["Tool execution cancelled."] * 2


@pytest.mark.spec("S7", "S8", "D5")
def test_S7_a_failed_call_stops_its_siblings_over_the_wire(client: Client, workspace: Path) -> None:
    with client.session(workspace, on_error="cancel_siblings") as session:
        turn = session.submit(
            [
                call("nap", "nap", seconds=60),
                ToolCall("chore", "chore_until", {"name": "flag"}),
                call("fails", "read", path="missing.txt"),
                call("queued", "write", path="q.txt", content="q"),
            ]
        )
        for event in turn:
            if event.type.value == "tool_end" and event.call_id == "fails":
                (workspace / "flag").write_text("")  # the block call may finish now
        results = {r.call_id: r for r in turn.results()}
    sibling = {"call_id": "fails", "reason": "sibling_failed"}
    assert results["fails"].is_error
    assert "skipped_because" not in results["fails"].details
    assert results["nap"].error_code is ErrorCode.CANCELLED
    assert results["nap"].details["skipped_because"] == sibling
    assert not results["chore"].is_error  # "block": it finished
    assert results["queued"].error_code is ErrorCode.SKIPPED
    assert results["queued"].details["skipped_because"] == sibling
    assert not (workspace / "q.txt").exists()


# --- clients ------------------------------------------------------------------------------


@pytest.mark.spec("D5")
def test_D5_two_clients_with_separate_sessions_at_once(daemon: Daemon, tmp_path: Path) -> None:
    outcomes: dict[str, Any] = {}

    def work(name: str) -> None:
        root = tmp_path / name
        root.mkdir()
        with Client(runtime_dir=daemon.runtime) as c, c.session(root) as session:
            outcomes[name] = (
                session.id,
                session.submit(
                    [call("w", "write", path="f.txt", content=name), call("n", "nap", seconds=0.5)]
                ).results(),
            )

    threads = [threading.Thread(target=work, args=(n,)) for n in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes["left"][0] != outcomes["right"][0]
    for name in ("left", "right"):
        assert not any(r.is_error for r in outcomes[name][1])
        assert (tmp_path / name / "f.txt").read_text() == name


@pytest.mark.spec("D5")
def test_D5_a_session_belongs_to_its_client(daemon: Daemon, workspace: Path) -> None:
    with Client(runtime_dir=daemon.runtime) as owner, Client(runtime_dir=daemon.runtime) as other:
        session = owner.session(workspace)
        stolen = type(session)(other, session.id)
        with pytest.raises(RequestFailed, match="unknown_session"):
            stolen.submit([call("n", "noop")])
        session.close()
        with pytest.raises(RequestFailed, match="unknown_session"):
            session.submit([call("n", "noop")])


@pytest.mark.spec("D5")
def test_D5_a_client_that_disconnects_mid_turn_is_cleaned_up(
    daemon: Daemon, client: Client, workspace: Path
) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from toolpool import Client, ToolCall
        client = Client(runtime_dir={str(daemon.runtime)!r}).__enter__()
        session = client.session({str(workspace)!r})
        turn = session.submit([ToolCall("b", "bash", {{"command": "sleep 1234.5"}})])
        for event in turn:
            if event.type.value == "tool_update" or event.type.value == "tool_start":
                print("started", flush=True)
                time.sleep(600)
        """
    )
    before = client.status()["sessions"]
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT
    ) as rogue:
        assert rogue.stdout is not None
        assert rogue.stdout.readline().strip() == "started"
        assert len(client.status()["sessions"]) == len(before) + 1  # opened before "started"
        rogue.kill()
        rogue.wait()
    deadline = time.monotonic() + 30  # a hang guard: the cleanup takes a second or two
    while len(client.status()["sessions"]) > len(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.status()["sessions"] == before  # its session was closed

    def sleepers() -> str:
        found = subprocess.run(["pgrep", "-f", "sleep 1234.5"], capture_output=True, text=True)
        return found.stdout

    # Its command is ended too: the session's close aborts the call, whose worker
    # then ends the command (SIGTERM, grace, SIGKILL), which may finish just after.
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sleepers() == ""


# --- async client ---------------------------------------------------------------------------


@pytest.mark.spec("D5", "P8")
async def test_D5_async_client(daemon: Daemon, workspace: Path) -> None:
    async def approve(request: ApprovalRequested) -> bool:
        await asyncio.sleep(0.01)
        return request.call.name == "write"

    async with AsyncClient(runtime_dir=daemon.runtime) as client:
        assert "bash" in client.tool_names
        async with client.session(workspace, gate="ask", on_approval=approve) as session:
            turn = await session.submit(
                [
                    call("w", "write", path="a.txt", content="a"),
                    call("b", "bash", command="echo no"),
                ]
            )
            kinds = [getattr(e.type, "value", e.type) async for e in turn]
            results = await turn.results()
            long = await session.submit([call("n", "nap", seconds=60)])
            async for event in long:  # the nap runs (in flight: interrupted, not skipped)
                if isinstance(event, ToolStart) and event.call_id == "n":
                    break
            await session.interrupt()
            (interrupted,) = await long.results(timeout=10)
        status = await client.status()
    assert kinds[-1] == "turn_end"
    assert "approval_request" in kinds
    assert not results[0].is_error
    assert results[1].error_code is ErrorCode.DENIED
    assert interrupted.error_code is ErrorCode.INTERRUPTED
    assert status["pid"] == daemon.pid


# --- provider formats over the wire ---------------------------------------------------------

PROVIDER_CASES = [
    ("openai_chat_completion.json", "openai", "openai"),
    ("openai_responses_response.json", "openai-responses", "openai-responses"),
    ("anthropic_message.json", "anthropic", "anthropic"),
    ("gemini_response.json", None, "gemini"),  # format detected by the daemon
]


@pytest.mark.spec("M1")
@pytest.mark.parametrize(("fixture", "format", "back"), PROVIDER_CASES)
def test_M1_provider_output_in_results_back_in_the_same_shape(
    client: Client, workspace: Path, fixture: str, format: str | None, back: str
) -> None:
    payload = json.loads((FIXTURES / fixture).read_text())
    (workspace / "README.md").write_text("# hello\n")
    (workspace / "notes.txt").write_text("notes\n")
    with client.session(workspace) as session:
        turn = session.submit(payload, format=format)
        converted = turn.results_as(back)
        results = turn.results()
    sent = parse_tool_calls(payload, format)
    assert [(r.call_id, r.tool_name) for r in results] == [(c.id, c.name) for c in sent]
    assert results[0].text == "value of alpha"  # lookup ran in a worker
    if back == "anthropic":
        assert converted["role"] == "user"
        ids = [b["tool_use_id"] for b in converted["content"]]
    elif back == "openai":
        ids = [m["tool_call_id"] for m in converted]
    elif back == "openai-responses":
        ids = [m["call_id"] for m in converted]
    else:
        ids = [p["functionResponse"]["name"] for p in converted["parts"]]
        assert ids == [r.tool_name for r in results]
        return
    assert ids == [r.call_id for r in results]


# --- bad input ------------------------------------------------------------------------------


def raw_socket(daemon: Daemon) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    socket.connect(str(daemon.endpoint()["ipc"]))
    return context, socket


@pytest.mark.spec("D5")
def test_D5_bad_input_gets_clear_errors_and_the_daemon_keeps_serving(
    daemon: Daemon, client: Client, workspace: Path
) -> None:
    context, socket = raw_socket(daemon)
    try:
        socket.send(b"\xc1garbage")
        assert decode(socket.recv()).message.startswith("not a msgpack frame")  # type: ignore[union-attr]
        socket.send(b"\x81\xa1t\xa8teleport")
        reply = decode(socket.recv())
        assert reply.code == "protocol" and "unknown message type 'teleport'" in reply.message  # type: ignore[union-attr]
        socket.send(encode(Status("s1")))
        reply = decode(socket.recv())
        assert "say hello first" in reply.message  # type: ignore[union-attr]
        socket.send(encode(Hello("h1", version=99)))
        reply = decode(socket.recv())
        assert reply.code == "version"  # type: ignore[union-attr]
        socket.send_multipart([b"two", b"frames"])
        assert "one frame per message" in decode(socket.recv()).message  # type: ignore[union-attr]
    finally:
        socket.close()
        context.term()
    # an unknown session and a tool that does not exist
    from toolpool.client.sync import Session

    with pytest.raises(RequestFailed, match="unknown_session"):
        Session(client, "no-such-session").submit([call("x", "noop")])
    with client.session(workspace) as session:
        (result,) = session.submit([call("x", "no_such_tool")]).results()
    assert result.error_code is ErrorCode.TOOL_NOT_FOUND
    # bad session options
    with pytest.raises(RequestFailed, match="unknown session option 'colour'"):
        client.session(workspace, colour="blue")
    with pytest.raises(RequestFailed, match="'warp' is not a limit"):
        client.session(workspace, limits={"warp": 9})
    with pytest.raises(RequestFailed, match="not a directory"):
        client.session(workspace / "missing")
    assert client.status()["pid"] == daemon.pid


@pytest.mark.spec("D5")
def test_D5_oversized_frames(daemon: Daemon, client: Client, workspace: Path) -> None:
    huge = "x" * (MAX_FRAME_BYTES + 1)
    # the client library refuses to send it, with a clear error
    with client.session(workspace) as session, pytest.raises(RequestFailed, match="frame limit"):
        session.submit([call("w", "write", path="big", content=huge)])
    # a raw peer that sends one anyway gets an error back, and others are served
    context, socket = raw_socket(daemon)
    try:
        socket.send(huge.encode())
        assert "exceeds" in decode(socket.recv()).message  # type: ignore[union-attr]
    finally:
        socket.close()
        context.term()
    assert client.status()["pid"] == daemon.pid


def test_client_errors_are_transport_errors(tmp_path: Path) -> None:
    with pytest.raises(DaemonUnavailable, match="no toolpool daemon runs"):
        Client(runtime_dir=tmp_path)
    with pytest.raises(DaemonUnavailable, match="no toolpool daemon answers"):
        Client(f"ipc://{tmp_path}/nothing.sock", connect_timeout=0.3).connect()
    assert issubclass(ClientTimeout, TimeoutError)


# --- logs, CLI ------------------------------------------------------------------------------


@pytest.mark.spec("D1")
def test_D1_logs_are_json_lines_with_ids(client: Client, daemon: Daemon, workspace: Path) -> None:
    with client.session(workspace) as session:
        session.submit([call("logged", "noop")]).results()
    entries = daemon.log_lines()
    ended = [e for e in entries if e.get("call") == "logged"]
    assert ended
    assert {"ts", "level", "msg", "session", "turn", "call", "tool", "worker"} <= ended[-1].keys()
    assert ended[-1]["tool"] == "noop"
    assert any("sandbox" in str(e["msg"]) for e in entries)  # the profile is logged at start


def run_cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolpool", *args, "--runtime-dir", str(daemon.runtime)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


@pytest.mark.spec("D5")
def test_cli_call_tools_status(daemon: Daemon, workspace: Path) -> None:
    (workspace / "hi.txt").write_text("hello\n")
    done = run_cli(
        daemon,
        "call",
        "read",
        '{"path": "hi.txt"}',
        "--workspace",
        str(workspace),
        "--print-result",
    )
    assert done.returncode == 0, done.stderr
    assert "1\thello" in done.stdout
    failed = run_cli(daemon, "call", "read", '{"path": "nope.txt"}', "--workspace", str(workspace))
    assert failed.returncode == 1
    tools = run_cli(daemon, "tools", "--format", "mcp")
    definitions = json.loads(tools.stdout)
    read = next(t for t in definitions if t["name"] == "read")
    assert read["annotations"]["readOnlyHint"] is True
    status = run_cli(daemon, "status", "--json")
    assert json.loads(status.stdout)["pid"] == daemon.pid
    human = run_cli(daemon, "status")
    assert "workers" in human.stdout
    assert "sandbox" in human.stdout
    demo = run_cli(daemon, "demo")
    assert demo.returncode == 0, demo.stderr
    assert "through the daemon" in demo.stdout
    assert "turn end: 7 results, 0 errors" in demo.stdout


# --- the daemon's own life ----------------------------------------------------------------------


@pytest.mark.spec("D1")
def test_D1_sigterm_drains_a_running_turn(tmp_path: Path, workspace: Path) -> None:
    # A drain grace far past what the test needs (a hang guard, not a measure)
    daemon = start_daemon(tmp_path, "--config", str(_config(tmp_path, "drain_grace = 60\n")))
    with Client(runtime_dir=daemon.runtime) as client, client.session(workspace) as session:
        turn = session.submit([call("c", "bash", command=gated("release"))])
        first_progress(turn, "c")  # the command runs, and waits for the test
        daemon.process.send_signal(signal.SIGTERM)
        eventually(lambda: client.status()["draining"])  # the daemon took the signal
        with pytest.raises(RequestFailed, match="shutting_down"):
            session.submit([call("late", "noop")])  # no new turns while draining
        (workspace / "release").touch()  # only now can the call end: during the drain
        (result,) = turn.results()  # the running call finished during the drain
        assert result.text == "waiting\nreleased\nExit code: 0"
    assert stop_daemon(daemon) == 0


@pytest.mark.spec("D1")
def test_D1_second_sigterm_ends_at_once(tmp_path: Path, workspace: Path) -> None:
    # A drain and a call that would both outlast the test: only the second SIGTERM
    # can end the call while the test runs.
    config = _config(tmp_path, "drain_grace = 3600\n")
    daemon = start_daemon(tmp_path, "--config", str(config))
    with Client(runtime_dir=daemon.runtime) as client, client.session(workspace) as session:
        turn = session.submit([call("c", "chore", seconds=3600)])
        wait_started(turn, "c")
        daemon.process.send_signal(signal.SIGTERM)
        # The first signal was handled (two signals sent at once may arrive as one)
        eventually(lambda: client.status()["draining"])
        daemon.process.send_signal(signal.SIGTERM)
        (result,) = turn.results(timeout=40)  # a hang guard: it ends within a second or two
        assert result.error_code is ErrorCode.CANCELLED
    assert stop_daemon(daemon) == 0


@pytest.mark.spec("D5", "D2")
def test_D5_a_daemon_that_dies_is_noticed_and_leaves_nothing(
    tmp_path: Path, workspace: Path
) -> None:
    daemon = start_daemon(tmp_path)
    tree = daemon.tree()
    with Client(runtime_dir=daemon.runtime) as client, client.session(workspace) as session:
        turn = session.submit([call("c", "chore", seconds=60)])
        wait_started(turn, "c")
        daemon.process.send_signal(signal.SIGKILL)
        begun = time.monotonic()
        with pytest.raises(DaemonUnavailable, match="closed the connection"):
            turn.results()  # no timeout: only the connection's end ends this wait
        # That it was noticed, not timed out, the error says; this is a hang guard
        # (the disconnect is seen within milliseconds).
        assert time.monotonic() - begun < 30
    daemon.process.wait()
    deadline = time.monotonic() + 30  # a hang guard: the workers follow within a second
    while any(running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in tree if running(p)] == []  # workers and zygote died with it


def _config(tmp: Path, text: str) -> Path:
    path = tmp / "toolpool.toml"
    path.write_text(text)
    return path


@pytest.mark.spec("D1")
def test_D1_daemon_start_status_stop(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    env = daemon_env(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "toolpool", "daemon", *args, "--runtime-dir", str(runtime),
             "--min-workers", "1", "--tool-modules", "toolpool.tools"],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=90, check=False,
        )  # fmt: skip

    assert cli("status").returncode == 3
    started = cli("start")
    assert started.returncode == 0, started.stderr
    assert "toolpool daemon started" in started.stdout
    pid = int((runtime / "daemon.pid").read_text())
    SHARED_ROOTS.add(pid)  # not our child, but checked below
    try:
        assert cli("start").stdout.startswith("toolpool daemon is already running")
        status = cli("status")
        assert status.returncode == 0
        assert f"pid {pid}" in status.stdout
        assert oct(os.stat(runtime).st_mode)[-3:] == "700"  # the runtime dir is private
        assert oct(os.stat(runtime / "daemon.sock").st_mode)[-3:] == "600"
        assert oct(os.stat(runtime / "daemon.json").st_mode)[-3:] == "600"
        stopped = cli("stop")
        assert stopped.returncode == 0
        assert f"stopped (pid {pid})" in stopped.stdout
    finally:
        SHARED_ROOTS.discard(pid)
    assert not running(pid)
    assert cli("status").returncode == 3
    assert not (runtime / "daemon.sock").exists()
    # the run's worker logs stay for a look; the next start clears them
    assert (runtime / f"workers-{pid}" / "zygote.log").exists()
    again = cli("start")
    assert again.returncode == 0, again.stderr
    second = int((runtime / "daemon.pid").read_text())
    SHARED_ROOTS.add(second)
    try:
        assert [p.name for p in runtime.glob("workers-*")] == [f"workers-{second}"]
        assert cli("stop").returncode == 0
    finally:
        SHARED_ROOTS.discard(second)
    assert not running(second)


@pytest.mark.spec("D1")
def test_D1_refuses_a_second_daemon_and_an_open_tcp_port(daemon: Daemon, tmp_path: Path) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "toolpool", "daemon", "--runtime-dir", str(daemon.runtime)],
        capture_output=True, text=True, cwd=ROOT, env=daemon_env(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert second.returncode == 1
    assert "already running" in second.stderr
    exposed = subprocess.run(
        [sys.executable, "-m", "toolpool", "daemon", "--runtime-dir", str(tmp_path / "rt2"),
         "--tcp", "0.0.0.0:7777"],
        capture_output=True, text=True, cwd=ROOT, env=daemon_env(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert exposed.returncode == 1
    assert "without CURVE authentication" in exposed.stderr


@pytest.mark.spec("D5")
def test_D5_tcp_with_curve(tmp_path: Path, workspace: Path) -> None:
    import zmq.auth

    keys = tmp_path / "keys"
    clients = tmp_path / "authorized"
    keys.mkdir()
    clients.mkdir()
    _server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, _client_secret = zmq.auth.create_certificates(keys, "client")
    os.rename(client_public, clients / "client.key")
    config = _config(
        tmp_path,
        f'tcp = "127.0.0.1:0"\ncurve_secret_key = "{server_secret}"\n'
        f'curve_authorized_keys = "{clients}"\n',
    )
    daemon = start_daemon(tmp_path, "--config", str(config))
    try:
        info = daemon.endpoint()
        endpoint = str(info["tcp"])
        assert endpoint.startswith("tcp://127.0.0.1:")
        server_key = str(info["server_public_key"]).encode()
        cpub, csec = zmq.auth.load_certificate(keys / "client.key_secret")
        assert csec is not None
        trusted = Client(endpoint, curve=(server_key, cpub, csec))
        with trusted, trusted.session(workspace) as session:
            assert session.submit([call("n", "noop")]).results()[0].text == "ok"
        stranger_pub, stranger_sec = zmq.curve_keypair()
        with pytest.raises(DaemonUnavailable):
            Client(
                endpoint, curve=(server_key, stranger_pub, stranger_sec), connect_timeout=1
            ).connect()
        with pytest.raises(DaemonUnavailable):
            Client(endpoint, connect_timeout=1).connect()  # no CURVE at all
    finally:
        assert stop_daemon(daemon) == 0


# --- open turns over the wire ---------------------------------------------------------------


@pytest.mark.spec("S2", "D5")
def test_D5_open_turn_takes_calls_and_cancels_them_one_by_one(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace) as session:
        turn = session.submit([call("long", "nap", seconds=60)], open=True)
        assert turn.add([call("quick", "noop")]) == ["quick"]
        assert turn.result("quick", timeout=10).text == "ok"  # beside the long one (S2)
        turn.cancel("long")
        assert turn.result("long", timeout=10).error_code is ErrorCode.INTERRUPTED
        with pytest.raises(RequestFailed, match="unique"):
            turn.add([call("quick", "noop")])
        turn.close()
        assert [r.call_id for r in turn.results(timeout=10)] == ["long", "quick"]
        with pytest.raises(RequestFailed, match="unknown_turn"):
            turn.add([call("late", "noop")])


async def test_D5_async_open_turn(daemon: Daemon, workspace: Path) -> None:
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, client.session(workspace) as session:
        turn = await session.submit([], open=True)
        await turn.add([call("a", "nap", seconds=60), call("b", "noop")])
        assert (await turn.result("b", timeout=10)).text == "ok"
        await turn.cancel("a")
        await turn.close()
        results = await turn.results(timeout=10)
    assert [r.error_code for r in results] == [ErrorCode.INTERRUPTED, None]


def _followed(items: list[Any], calls: int) -> None:
    """Everything of a turn of ``calls`` noop calls arrived, in order, and once."""
    assert len(items) == 4 * calls + 1  # tool_start, tool_end, message_start/end; turn_end
    assert isinstance(items[-1], TurnEnd)
    ends = [i.call_id for i in items if isinstance(i, ToolEnd)]
    assert sorted(ends) == sorted(f"c{n}" for n in range(calls))


@pytest.mark.spec("D5")
def test_D5_following_a_turn_lets_go_of_what_was_read(client: Client, workspace: Path) -> None:
    with client.session(workspace) as session:
        turn = session.submit([call(f"c{n}", "noop") for n in range(150)], open=True)
        turn.close()
        followed = list(turn.follow())
        _followed(followed, 150)
        assert len(turn.events) < FORGET_BATCH < len(followed)  # what was read is gone
        assert turn.events == followed[-len(turn.events) :]
        assert len(turn.results()) == 150  # results are kept
        assert turn.result("c7").text == "ok"


@pytest.mark.spec("D5")
async def test_D5_async_follow_lets_go_of_what_was_read(daemon: Daemon, workspace: Path) -> None:
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, client.session(workspace) as session:
        turn = await session.submit([], open=True)
        await turn.add([call(f"c{n}", "noop") for n in range(150)])
        await turn.close()
        followed = [item async for item in turn.follow()]
        _followed(followed, 150)
        assert len(turn.events) < FORGET_BATCH < len(followed)
        assert len(await turn.results()) == 150


@pytest.mark.spec("D1")
def test_D1_signals_during_the_stop_never_kill_it_uncleanly(tmp_path: Path) -> None:
    """TERMs sent over and over while the daemon stops (a supervisor that insists)
    end it cleanly, whichever phase of the stop each one lands in."""
    daemon = start_daemon(tmp_path)
    tree = daemon.tree()
    while daemon.process.poll() is None:
        daemon.process.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    assert daemon.process.returncode == 0
    eventually(lambda: not any(running(p) for p in tree))
    assert not (daemon.runtime / "daemon.json").exists()
