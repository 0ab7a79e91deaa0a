"""One client connection, two drivers: the sans-IO connection on its own (bytes in,
events and replies out, no socket at all), then the blocking and the asyncio client
doing the same things against a real daemon (SPEC D5, P8, S4, S5)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from toolpool import (
    AsyncClient,
    Client,
    ClientProtocolError,
    ClientTimeout,
    DaemonUnavailable,
    ErrorCode,
    MessageEnd,
    MessageStart,
    RequestFailed,
    TextBlock,
    ToolCall,
    ToolEnd,
    ToolMessage,
    ToolResult,
    ToolStart,
    TurnEnd,
)
from toolpool.client import ApprovalRequested, ClientError
from toolpool.client.connection import Connection
from toolpool.client.core import FORGET_BATCH, TurnItem
from toolpool.client.operation import Operation
from toolpool.protocol import (
    Accepted,
    ApprovalReply,
    ApprovalRequest,
    Bye,
    Error,
    EventSelection,
    Hello,
    Message,
    Ping,
    Reply,
    SessionOpened,
    Submit,
    TurnEvent,
    Welcome,
    decode,
    encode,
    event_to_wire,
)

from .daemon_support import Daemon, shared_daemon

# --- the connection alone: frames in, events and replies out ----------------------------


def sent(connection: Connection) -> list[Message]:
    return [decode(frame) for frame in connection.take_outgoing()]


def request_id(message: Message) -> str:
    value = getattr(message, "request_id", None)
    assert isinstance(value, str)
    return value


def connected(name: str = "test") -> Connection:
    connection = Connection("ipc:///nowhere", timeout=7.0)
    connection.start()
    hello = connection.hello(name, 1.0)
    (message,) = sent(connection)
    assert isinstance(message, Hello) and message.client == name
    connection.receive(encode(Welcome(message.request_id, 1, 4242, ["read", "write"])))
    assert hello.done()
    hello.outcome()
    return connection


def opened(connection: Connection, handler: Any = None) -> str:
    opening = connection.open_session("/ws", {"gate": "ask"}, handler)
    (message,) = sent(connection)
    connection.receive(encode(SessionOpened(request_id(message), "s1")))
    return opening.outcome()


def result(call_id: str, text: str = "ok") -> ToolResult:
    return ToolResult(call_id, "noop", (TextBlock(text),))


def events(turn_id: str, *items: Any) -> bytes:
    return encode(TurnEvent(turn_id, [event_to_wire(item) for item in items]))


def submitted(connection: Connection, call_ids: list[str]) -> tuple[Operation[Any], Submit]:
    submitting = connection.submit("s1", [ToolCall(c, "noop") for c in call_ids], None, False)
    (message,) = sent(connection)
    assert isinstance(message, Submit)
    return submitting, message


def test_the_handshake_is_frames_out_and_a_welcome_in() -> None:
    connection = connected("me")
    assert connection.daemon_pid == 4242
    assert connection.tool_names == ["read", "write"]
    connection.close()
    assert sent(connection) == [Bye()]
    with pytest.raises(DaemonUnavailable, match="closed"):
        connection.status()


def test_nothing_is_asked_before_the_connection_starts() -> None:
    with pytest.raises(DaemonUnavailable, match="not connected"):
        Connection("ipc:///nowhere", 1.0).status()


def test_a_turns_frames_fed_in_pieces() -> None:
    connection = connected()
    opened(connection)
    submitting, message = submitted(connection, ["a", "b"])
    # its acceptance and its first events arrive before anyone reads the reply
    connection.receive(encode(Accepted(message.request_id, "t1", ["a", "b"])))
    connection.receive(events("t1", ToolStart("a", "noop", {}, "Noop")))
    log = submitting.outcome()
    assert log.call_ids == ["a", "b"]
    cursor = connection.cursor(log, follow=False)
    first = cursor.next()
    assert first.done()
    assert isinstance(first.outcome(), ToolStart)
    waiting, ended, a_done = (
        cursor.next(),
        connection.turn_end(log, None),
        connection.call_end(log, "a", None),
    )
    assert not waiting.done() and not ended.done() and not a_done.done()
    connection.receive(encode(Ping()))  # pings change nothing
    assert not waiting.done()
    connection.receive(
        events("t1", ToolEnd("a", "noop", result("a")), ToolStart("b", "noop", {}, "Noop"))
    )
    assert waiting.done() and a_done.done() and not ended.done()
    assert a_done.outcome().text == "ok"
    assert isinstance(waiting.outcome(), ToolEnd)
    assert isinstance(cursor.next().outcome(), ToolStart)
    results = (result("a"), result("b", "fine"))
    connection.receive(events("t1", ToolEnd("b", "noop", results[1]), TurnEnd(results)))
    assert ended.outcome() == results
    # the message events the daemon did not send are rebuilt, right before turn_end
    items = [cursor.next().outcome() for _ in range(6)]
    assert [type(i) for i in items] == [ToolEnd, *[MessageStart, MessageEnd] * 2, TurnEnd]
    assert cursor.finished
    # the turn is over: what still comes for it is not filed
    connection.receive(events("t1", ToolStart("late", "noop", {}, "Noop")))
    assert len(log.items) == 9


def test_a_results_only_turn_asks_for_fewer_events_and_holds_only_those() -> None:
    connection = connected()
    opened(connection)
    submitting = connection.submit("s1", [ToolCall("a", "noop")], None, False, "results")
    (message,) = sent(connection)
    assert isinstance(message, Submit) and message.events is EventSelection.RESULTS
    connection.receive(encode(Accepted(message.request_id, "t1", ["a"])))
    log = submitting.outcome()
    # a daemon that sends every event anyway: the turn holds those it asked for
    a = result("a")
    connection.receive(events("t1", ToolStart("a", "noop", {}, "Noop"), ToolEnd("a", "noop", a)))
    assert connection.call_end(log, "a", None).outcome() == a
    connection.receive(events("t1", MessageStart(ToolMessage.from_result(a)), TurnEnd((a,))))
    assert connection.turn_end(log, None).outcome() == (a,)
    assert [type(item) for item in log.items] == [ToolEnd, TurnEnd]
    # and a turn of every event still holds every event, its message events rebuilt
    submitting, message = submitted(connection, ["b"])
    assert message.events is EventSelection.ALL
    connection.receive(encode(Accepted(message.request_id, "t2", ["b"])))
    b = result("b")
    connection.receive(events("t2", ToolStart("b", "noop", {}, "Noop"), ToolEnd("b", "noop", b)))
    connection.receive(events("t2", TurnEnd((b,))))
    assert [type(item) for item in submitting.outcome().items] == [
        ToolStart,
        ToolEnd,
        MessageStart,
        MessageEnd,
        TurnEnd,
    ]


def test_a_reply_for_an_unknown_session_is_the_daemons_refusal() -> None:
    connection = connected()
    submitting, message = submitted(connection, ["a"])
    connection.receive(encode(Error(message.request_id, "unknown_session", "no session 's1'")))
    with pytest.raises(RequestFailed, match="unknown_session") as refused:
        submitting.outcome()
    assert refused.value.code == "unknown_session"
    # events and approvals of turns and sessions it does not know change nothing
    connection.receive(events("t9", ToolStart("x", "noop", {}, "Noop")))
    connection.receive(encode(_approval_request("a1", session="s9", turn="t9")))
    assert sent(connection) == []
    assert connection.failure is None


def test_a_reply_nobody_waits_for_is_dropped_and_a_timeout_forgets_its_request() -> None:
    connection = connected()
    submitting, message = submitted(connection, ["a"])
    assert submitting.timeout == 7.0  # the connection's default
    error = submitting.expired()
    assert isinstance(error, ClientTimeout) and "7 s" in str(error)
    connection.receive(encode(Accepted(message.request_id, "t1", ["a"])))
    connection.receive(encode(Reply("r999")))
    assert not submitting.done()
    assert connection._turns == {} and connection.replies == {}


def test_a_protocol_error_fails_the_connection() -> None:
    connection = connected()
    status = connection.status()
    connection.receive(b"\xc1 this is not msgpack")
    assert status.done()
    with pytest.raises(ClientProtocolError, match="not a msgpack frame"):
        status.outcome()
    with pytest.raises(ClientProtocolError):
        connection.status()
    connection.receive(encode(Reply("r2", {"pid": 1})))  # after the end nothing counts


def test_an_unreadable_event_or_a_wrong_reply_is_a_protocol_error() -> None:
    connection = connected()
    status = connection.status()
    (message,) = sent(connection)
    connection.receive(encode(SessionOpened(request_id(message), "s1")))
    with pytest.raises(ClientProtocolError, match="expected Reply, got session_opened"):
        status.outcome()
    submitting, submit = submitted(connection, ["a"])
    connection.receive(encode(Accepted(submit.request_id, "t1", ["a"])))
    connection.receive(encode(TurnEvent("t1", [{"type": "teleport"}])))
    with pytest.raises(ClientProtocolError, match="unreadable event"):
        connection.turn_end(submitting.outcome(), None).outcome()


def test_a_reply_that_came_before_the_daemon_went_away_still_counts() -> None:
    connection = connected()
    answered, unanswered = connection.status(), connection.tools("mcp")
    first, _ = sent(connection)
    connection.receive(encode(Reply(request_id(first), {"pid": 1})))
    connection.lost()
    assert answered.outcome() == {"pid": 1}
    with pytest.raises(DaemonUnavailable, match="closed the connection"):
        unanswered.outcome()


def test_a_frame_over_the_limit_is_refused_before_it_is_queued() -> None:
    connection = connected()
    huge = ToolCall("w", "write", {"content": "x" * (64 * 1024 * 1024)})
    with pytest.raises(RequestFailed, match="frame limit"):
        connection.submit("s1", [huge], None, False)
    assert sent(connection) == []


def _approval_request(approval_id: str, session: str = "s1", turn: str = "t1") -> ApprovalRequest:
    call = ToolCall("w", "write", {"path": "x"}).to_dict()
    return ApprovalRequest(approval_id, session, turn, call, "Write", "diff", False, [], 5.0)


def _turn_with_approval(handler: Any) -> tuple[Connection, Any, list[Any]]:
    connection = connected()
    opened(connection, handler)
    queued: list[int] = []
    connection.on_outgoing = lambda: queued.append(1)
    submitting, message = submitted(connection, ["w"])
    connection.receive(encode(Accepted(message.request_id, "t1", ["w"])))
    deferred = connection.receive(encode(_approval_request("a1")))
    return connection, submitting.outcome(), deferred


def test_an_approval_is_answered_on_the_call_once_and_awaiting_is_optional() -> None:
    connection, log, deferred = _turn_with_approval(None)
    assert deferred == []
    (item,) = log.items
    assert isinstance(item, ApprovalRequested) and not item.answered
    assert item.call.name == "write" and item.label == "Write" and item.preview == "diff"
    answer = item.deny("not now")
    assert sent(connection) == [ApprovalReply("a1", False, "not now")]  # queued at once
    asyncio.run(_await(answer))  # and awaiting it changes nothing
    item.approve()
    assert sent(connection) == []  # the first answer counts
    assert item.answered


async def _await(answer: Any) -> None:
    assert await answer is None


def test_an_on_approval_handler_answers_and_the_request_joins_its_turn() -> None:
    connection, log, deferred = _turn_with_approval(lambda request: (False, "no writes"))
    assert deferred == []
    assert sent(connection) == [ApprovalReply("a1", False, "no writes")]
    (item,) = log.items
    assert item.answered


def test_an_async_handler_is_left_to_the_driver() -> None:
    async def handler(request: ApprovalRequested) -> bool:
        return True

    connection, log, deferred = _turn_with_approval(handler)
    (pending,) = deferred
    assert log.items == [] and sent(connection) == []
    connection.approvals.decide(pending.item, asyncio.run(pending.decision))
    assert sent(connection) == [ApprovalReply("a1", True, "")]
    assert log.items == [pending.item]
    # a driver that cannot await one denies the call, and the coroutine never runs
    connection, log, deferred = _turn_with_approval(handler)
    connection.approvals.refuse(deferred[0], "cannot await")
    assert sent(connection) == [ApprovalReply("a1", False, "cannot await")]


def test_following_a_turn_lets_go_of_what_it_passed() -> None:
    connection = connected()
    submitting, message = submitted(connection, [])
    connection.receive(encode(Accepted(message.request_id, "t1", [])))
    log = submitting.outcome()
    count = FORGET_BATCH * 2
    for n in range(count):  # one frame an event
        connection.receive(events("t1", ToolStart(f"c{n}", "noop", {}, "Noop")))
    connection.receive(events("t1", TurnEnd(())))
    cursor = connection.cursor(log, follow=True)
    taken = 0
    while not cursor.finished:
        cursor.next().outcome()
        taken += 1
    assert taken == count + 1
    assert len(log.items) < FORGET_BATCH


# --- both drivers against a real daemon ----------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("drivers")) as started:
        yield started


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, name, arguments)


Answer = Callable[[ApprovalRequested], Any]
Outcome = tuple[list[TurnItem], tuple[ToolResult, ...]]


@dataclass
class Scenario:
    """One turn: ``answer`` the approvals met in its stream, ``steer`` (action, call
    id) once that call has started; ``options`` for its session."""

    calls: list[ToolCall]
    answer: Answer | None = None
    steer: tuple[str, str] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def action_at(self, item: TurnItem) -> str | None:
        """The steering action to take after ``item``, if any."""
        if self.steer is None or not isinstance(item, ToolStart):
            return None
        action, call_id = self.steer
        return action if item.call_id == call_id else None


def blocking_run(daemon: Daemon, workspace: Path, scenario: Scenario) -> Outcome:
    """The turn with ``Client``."""
    items: list[TurnItem] = []
    with (
        Client(runtime_dir=daemon.runtime, timeout=20) as client,
        client.session(workspace, **scenario.options) as session,
    ):
        turn = session.submit(scenario.calls)
        for item in turn:
            items.append(item)
            if isinstance(item, ApprovalRequested) and scenario.answer is not None:
                scenario.answer(item)
            if action := scenario.action_at(item):
                time.sleep(0.3)
                getattr(session, action)()
        return items, turn.results(timeout=20)


async def _async_run(daemon: Daemon, workspace: Path, scenario: Scenario) -> Outcome:
    items: list[TurnItem] = []
    client = AsyncClient(runtime_dir=daemon.runtime, timeout=20)
    async with client, client.session(workspace, **scenario.options) as session:
        turn = await session.submit(scenario.calls)
        async for item in turn:
            items.append(item)
            if isinstance(item, ApprovalRequested) and scenario.answer is not None:
                scenario.answer(item)  # a plain call: no await
            if action := scenario.action_at(item):
                await asyncio.sleep(0.3)
                await getattr(session, action)()
        return items, await turn.results(timeout=20)


def async_run(daemon: Daemon, workspace: Path, scenario: Scenario) -> Outcome:
    """The turn with ``AsyncClient``, on a loop of its own."""
    return asyncio.run(_async_run(daemon, workspace, scenario))


Run = Callable[[Daemon, Path, Scenario], Outcome]
DRIVERS = [pytest.param(blocking_run, id="Client"), pytest.param(async_run, id="AsyncClient")]


def answer_by_call(item: ApprovalRequested) -> None:
    """Approve "yes", deny the rest; the answers' return values are dropped."""
    if item.call.id == "yes":
        item.approve()
    else:
        item.deny("not today")


@pytest.mark.spec("P8", "D5")
@pytest.mark.parametrize("run", DRIVERS)
def test_P8_approve_and_deny_from_the_event_stream(
    run: Run, daemon: Daemon, workspace: Path
) -> None:
    calls = [
        call("yes", "write", path="yes.txt", content="y"),
        call("no", "write", path="no.txt", content="n"),
    ]
    items, results = run(
        daemon, workspace, Scenario(calls, answer_by_call, options={"gate": "ask"})
    )
    asked = [i for i in items if isinstance(i, ApprovalRequested)]
    assert [a.call.id for a in asked] == ["yes", "no"]
    assert all(a.answered for a in asked)
    assert not results[0].is_error
    assert results[1].error_code is ErrorCode.DENIED
    assert results[1].text == "not today"
    assert (workspace / "yes.txt").read_text() == "y"
    assert not (workspace / "no.txt").exists()


@pytest.mark.spec("P8")
async def test_P8_async_answers_may_be_awaited_or_not(daemon: Daemon, workspace: Path) -> None:
    client = AsyncClient(runtime_dir=daemon.runtime, timeout=20)
    async with client, client.session(workspace, gate="ask") as session:
        turn = await session.submit(
            [
                call("awaited", "write", path="a.txt", content="a"),
                call("plain", "write", path="p.txt", content="p"),
                call("refused", "bash", command="echo no"),
            ]
        )
        async for item in turn:
            if isinstance(item, ApprovalRequested):
                if item.call.id == "awaited":
                    await item.approve()
                elif item.call.id == "plain":
                    item.approve()
                else:
                    await item.deny("awaited denial")
        results = await turn.results(timeout=20)
    assert [r.error_code for r in results] == [None, None, ErrorCode.DENIED]
    assert results[2].text == "awaited denial"


@pytest.mark.spec("P8")
@pytest.mark.parametrize("run", DRIVERS)
def test_P8_on_approval_handlers_in_both_drivers(run: Run, daemon: Daemon, workspace: Path) -> None:
    def decide(request: ApprovalRequested) -> Any:
        return True if request.call.id == "yes" else (False, "handled")

    calls = [call("yes", "write", path="h.txt", content="h"), call("no", "bash", command="true")]
    options = {"gate": "ask", "on_approval": decide}
    items, results = run(daemon, workspace, Scenario(calls, options=options))
    assert [i.call.id for i in items if isinstance(i, ApprovalRequested)] == ["yes", "no"]
    assert [r.error_code for r in results] == [None, ErrorCode.DENIED]
    assert results[1].text == "handled"


def shape(items: list[TurnItem]) -> list[tuple[str, str | None]]:
    return [(str(getattr(i.type, "value", i.type)), getattr(i, "call_id", None)) for i in items]


@pytest.mark.spec("D5")
def test_D5_both_clients_see_the_same_events_for_the_same_turn(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "in.txt").write_text("alpha\n")
    calls = [
        call("r", "read", path="in.txt"),
        call("w", "write", path="out.txt", content="beta\n"),
        call("v", "write", path="out.txt", content="gamma\n"),
    ]
    blocking_items, blocking_results = blocking_run(daemon, workspace, Scenario(calls))
    (workspace / "out.txt").unlink()
    async_items, async_results = async_run(daemon, workspace, Scenario(calls))
    assert shape(blocking_items) == shape(async_items)
    assert shape(blocking_items)[-1] == ("turn_end", None)
    assert [(r.call_id, r.text) for r in blocking_results] == [
        (r.call_id, r.text) for r in async_results
    ]
    assert [r.is_error for r in blocking_results] == [False, False, False]


@pytest.mark.spec("S4", "D5")
@pytest.mark.parametrize("run", DRIVERS)
def test_S4_interrupt_from_both_drivers(run: Run, daemon: Daemon, workspace: Path) -> None:
    calls = [
        call("cancel", "nap", seconds=60),
        call("block", "chore", seconds=1),
        call("queued", "write", path="q.txt", content="q"),
    ]
    _, results = run(daemon, workspace, Scenario(calls, steer=("interrupt", "block")))
    assert [r.error_code for r in results] == [ErrorCode.INTERRUPTED, None, ErrorCode.SKIPPED]
    assert results[1].text == "chore done after 1.0"
    assert not (workspace / "q.txt").exists()


@pytest.mark.spec("S5", "D5")
@pytest.mark.parametrize("run", DRIVERS)
def test_S5_abort_from_both_drivers(run: Run, daemon: Daemon, workspace: Path) -> None:
    calls = [call("a", "chore", seconds=60), call("b", "nap", seconds=60)]
    _, results = run(daemon, workspace, Scenario(calls, steer=("abort", "b")))
    assert [r.text for r in results] == ["Tool execution cancelled."] * 2


@pytest.mark.spec("D5", "L2")
def test_D5_a_results_only_turn_in_both_drivers(daemon: Daemon, workspace: Path) -> None:
    calls = [call("a", "noop"), call("b", "chore", seconds=0.1)]
    with (
        Client(runtime_dir=daemon.runtime, timeout=20) as client,
        client.session(workspace) as session,
    ):
        every = session.submit(calls).results(timeout=20)
        turn = session.submit([call("c", "noop")], events="results")
        assert turn.result("c", timeout=20).text == "ok"
        items = list(turn)
    assert [type(i) for i in items] == [ToolEnd, TurnEnd]

    async def results_only() -> tuple[list[TurnItem], tuple[ToolResult, ...]]:
        client = AsyncClient(runtime_dir=daemon.runtime, timeout=20)
        async with client, client.session(workspace) as session:
            turn = await session.submit(calls, events=EventSelection.RESULTS)
            return [i async for i in turn], await turn.results(timeout=20)

    items, results = asyncio.run(results_only())
    assert [type(i) for i in items] == [ToolEnd, ToolEnd, TurnEnd]
    assert [(r.call_id, r.text) for r in results] == [(r.call_id, r.text) for r in every]


@pytest.mark.spec("D5")
def test_D5_a_request_after_close_fails_at_once(daemon: Daemon) -> None:
    blocking = Client(runtime_dir=daemon.runtime)
    with blocking:
        pass
    with pytest.raises(DaemonUnavailable, match="closed"):
        blocking.status()

    async def closed_async() -> None:
        client = AsyncClient(runtime_dir=daemon.runtime)
        async with client:
            pass
        with pytest.raises(DaemonUnavailable, match="closed"):
            await client.status()

    asyncio.run(closed_async())


# --- a daemon that refuses the connection ------------------------------------------------


class _RefusingDaemon:
    """A ROUTER whose ZAP handler refuses every connection (as the daemon refuses a
    confined process): the client's socket never gets a peer to send to."""

    def __init__(self, path: Path) -> None:
        import threading

        import zmq

        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.zap = self.context.socket(zmq.REP)
        self.zap.bind("inproc://zeromq.zap.01")
        self.router = self.context.socket(zmq.ROUTER)
        self.router.zap_domain = b"refuse"
        self.router.bind(f"ipc://{path}")
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer)
        self._thread.start()

    def _answer(self) -> None:
        while not self._stop.is_set():
            if self.zap.poll(50):
                request = self.zap.recv_multipart()
                self.zap.send_multipart([b"1.0", request[1], b"400", b"no", b"", b""])
                self.refused += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.router.close(0)
        self.zap.close(0)
        self.context.term()


@pytest.mark.spec("D5")
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_refused_connection_is_an_error_not_a_hang(tmp_path: Path, driver: str) -> None:
    daemon = _RefusingDaemon(tmp_path / "daemon.sock")
    endpoint = f"ipc://{tmp_path / 'daemon.sock'}"
    try:
        if driver == "sync":
            with pytest.raises(ClientError):
                Client(endpoint, connect_timeout=1.0, timeout=1.0).__enter__()
        else:

            async def connect() -> None:
                async with AsyncClient(endpoint, connect_timeout=1.0, timeout=1.0):
                    pass

            with pytest.raises(ClientError):
                asyncio.run(connect())
        assert daemon.refused >= 1  # it was the refusal, not a missing socket
    finally:
        daemon.close()
