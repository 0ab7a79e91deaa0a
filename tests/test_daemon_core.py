"""The daemon's core without sockets or processes (SPEC D5, H1, L5, L6, P8): frames in
through ``DaemonCore.receive``, frames out to an in-memory transport, tools run by the
in-process executor. What these tests prove takes milliseconds, not a daemon's start;
the end-to-end tests (tests/test_daemon.py) prove the same core on real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import tool
from toolpool.daemon.clients import ClientGone
from toolpool.daemon.core import DaemonCore
from toolpool.engine import Coordinator
from toolpool.protocol import (
    PROTOCOL_VERSION,
    Accepted,
    Ack,
    ApprovalReply,
    ApprovalRequest,
    Bye,
    CloseSession,
    Error,
    EventSelection,
    Hello,
    Message,
    OpenSession,
    Reply,
    SessionOpened,
    Status,
    Submit,
    TurnEvent,
    Welcome,
    decode,
    encode,
)

from .support import ticks

ME = (0, b"me")
OTHER = (0, b"other")


@tool(read_only=True)
def echo(text: str) -> str:
    """Say it back."""
    return text


@tool
def note(text: str) -> str:
    """Not read-only: a gate asks about it."""
    return f"noted {text}"


class Wire:
    """The in-memory transport: every message the core sends, decoded, by address;
    an address in ``gone`` has left (its sends fail as ROUTER_MANDATORY's do)."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, bytes], list[Message]] = {}
        self.frames: dict[tuple[int, bytes], int] = {}
        self.gone: set[tuple[int, bytes]] = set()

    def send(self, address: tuple[int, bytes], frames: list[bytes]) -> None:
        if address in self.gone:
            raise ClientGone("the connection is gone")
        self.frames[address] = self.frames.get(address, 0) + 1
        self.sent.setdefault(address, []).extend(decode(f) for f in frames)

    def take(self, address: tuple[int, bytes]) -> list[Message]:
        return self.sent.pop(address, [])


class Harness:
    def __init__(self, core: DaemonCore, wire: Wire, workspace: Path) -> None:
        self.core, self.wire, self.workspace = core, wire, workspace
        self._ids = iter(range(1, 10**9))

    def send(self, message: Message, address: tuple[int, bytes] = ME) -> None:
        self.core.receive(address, [encode(message)])

    def rid(self) -> str:
        return f"r{next(self._ids)}"

    def hello(self, address: tuple[int, bytes] = ME) -> None:
        self.send(Hello(self.rid(), PROTOCOL_VERSION, "test"), address)
        (welcome,) = self.wire.take(address)
        assert isinstance(welcome, Welcome)

    def open(self, address: tuple[int, bytes] = ME, **options: Any) -> str:
        self.send(OpenSession(self.rid(), str(self.workspace), options), address)
        (opened,) = self.wire.take(address)
        assert isinstance(opened, SessionOpened), opened
        return opened.session_id

    def calls(self, *texts: str, tool: str = "echo") -> list[dict[str, Any]]:
        return [
            {"id": f"c{i}", "name": tool, "arguments": {"text": t}} for i, t in enumerate(texts)
        ]

    async def turn(
        self,
        session_id: str,
        calls: list[dict[str, Any]],
        address: tuple[int, bytes] = ME,
        events: EventSelection = EventSelection.ALL,
    ) -> list[Message]:
        """Submit, and the messages sent back until this turn's end (a turn before it,
        still running, may end in between: its messages are there too)."""
        request = self.rid()
        self.send(Submit(request, session_id, calls, events=events), address)
        got: list[Message] = []
        for _ in range(10_000):  # a hang guard: a turn of echoes ends in a few ticks
            got += self.wire.take(address)
            accepted = [m for m in got if isinstance(m, Accepted) and m.request_id == request]
            if accepted and any(_ends(m, accepted[0].turn_id) for m in got):
                return got
            await ticks(1)
        raise AssertionError(f"the turn did not end: {got}")


def _ends(message: Message, turn_id: str) -> bool:
    return (
        isinstance(message, TurnEvent)
        and message.turn_id == turn_id
        and any(e["type"] == "turn_end" for e in message.events)
    )


def _types(messages: list[Message]) -> list[str]:
    out: list[str] = []
    for m in messages:
        out += [e["type"] for e in m.events] if isinstance(m, TurnEvent) else [m.type.value]
    return out


@pytest.fixture
async def harness(tmp_path: Path, workspace: Path) -> AsyncIterator[Harness]:
    coordinator = Coordinator([echo, note])
    wire = Wire()
    loop = asyncio.get_running_loop()
    core = DaemonCore(
        coordinator, None, wire, defer=loop.call_soon, spill_dir=tmp_path,
        max_sessions_per_client=3, max_sessions=4,
    )  # fmt: skip
    yield Harness(core, wire, workspace)
    core.end_sessions()
    await ticks(5)
    coordinator.close()


# --- the handshake, bad input -----------------------------------------------------------------


@pytest.mark.spec("D5")
async def test_D5_hello_first_then_requests_and_bad_input_gets_an_error(harness: Harness) -> None:
    harness.send(Status("s1"))
    (refused,) = harness.wire.take(ME)
    assert isinstance(refused, Error) and "say hello first" in refused.message
    harness.send(Hello("h1", PROTOCOL_VERSION + 1, "old"))
    (version,) = harness.wire.take(ME)
    assert isinstance(version, Error) and version.code == "version"
    harness.core.receive(ME, [b"\xc1garbage"])
    (garbage,) = harness.wire.take(ME)
    assert isinstance(garbage, Error) and garbage.code == "protocol"
    harness.core.receive(ME, [b"one", b"two"])
    (parts,) = harness.wire.take(ME)
    assert isinstance(parts, Error) and "one frame per message" in parts.message
    harness.hello()
    harness.send(Status("s2"))
    (status,) = harness.wire.take(ME)
    assert isinstance(status, Reply) and status.data["clients"] == 1


# --- turns and their events -------------------------------------------------------------------


@pytest.mark.spec("D5", "M2", "L2")
async def test_D5_a_turns_events_in_order_and_batched(harness: Harness) -> None:
    harness.hello()
    session = harness.open()
    before = harness.wire.frames[ME]
    got = await harness.turn(session, harness.calls("a", "b"))
    assert isinstance(got[0], Accepted) and got[0].call_ids == ["c0", "c1"]
    types = _types(got[1:])
    assert types[-1] == "turn_end" and types.count("tool_start") == types.count("tool_end") == 2
    ends = [e for m in got if isinstance(m, TurnEvent) for e in m.events if e["type"] == "tool_end"]
    assert [
        e["result"]["content"][0]["text"] for e in sorted(ends, key=lambda e: e["call_id"])
    ] == [
        "a",
        "b",
    ]
    # The events of one turn of the loop leave in one frame: fewer frames than events
    # (a call's tool_end and the turn_end it brings share one, however the calls fall)
    assert harness.wire.frames[ME] - before < len(types) + 1
    # message_start/message_end stay in the daemon: the client makes them (L2)
    assert "message_start" not in types and "message_end" not in types


@pytest.mark.spec("H1")
async def test_H1_results_only_is_sent_tool_end_and_turn_end_alone(harness: Harness) -> None:
    harness.hello()
    session = harness.open()
    got = await harness.turn(session, harness.calls("a"), events=EventSelection.RESULTS)
    assert _types(got) == ["accepted", "tool_end", "turn_end"]


# --- sessions: owned, bounded ------------------------------------------------------------------


@pytest.mark.spec("L6")
async def test_L6_sessions_are_bounded_per_client_and_per_daemon(harness: Harness) -> None:
    harness.hello()
    harness.hello(OTHER)
    mine = [harness.open() for _ in range(3)]
    harness.send(OpenSession(harness.rid(), str(harness.workspace), {}))
    (refused,) = harness.wire.take(ME)
    assert isinstance(refused, Error) and refused.code == "limit"
    assert "max_sessions_per_client" in refused.message
    harness.open(OTHER)
    harness.send(OpenSession(harness.rid(), str(harness.workspace), {}), OTHER)
    (full,) = harness.wire.take(OTHER)
    assert isinstance(full, Error) and "max_sessions allows" in full.message
    # Another client's session is not this one's to use or close
    harness.send(CloseSession(harness.rid(), mine[0]), OTHER)
    (unknown,) = harness.wire.take(OTHER)
    assert isinstance(unknown, Error) and unknown.code == "unknown_session"
    harness.send(CloseSession(harness.rid(), mine[0]))
    assert isinstance(harness.wire.take(ME)[0], Reply)
    await ticks(5)
    assert harness.core.status()["session_tables"]["sessions"] == 3


@pytest.mark.spec("D5", "L6")
async def test_D5_a_client_that_left_has_its_sessions_closed(harness: Harness) -> None:
    harness.hello()
    harness.open()
    harness.wire.gone.add(ME)  # its connection is gone: the next send fails
    harness.send(Status("s"))
    await ticks(5)
    status = harness.core.status()
    assert status["clients"] == 0 and status["session_tables"]["sessions"] == 0
    harness.hello(OTHER)
    harness.send(Bye(), OTHER)
    assert harness.core.status()["clients"] == 0


# --- approvals (P8) ------------------------------------------------------------------------------


async def _asked(harness: Harness, session: str, call: dict[str, Any]) -> ApprovalRequest:
    harness.send(Submit(harness.rid(), session, [call]))
    for _ in range(1000):
        for message in harness.wire.take(ME):
            if isinstance(message, ApprovalRequest):
                return message
        await ticks(1)
    raise AssertionError("no approval request")


@pytest.mark.spec("P8")
@pytest.mark.parametrize("allowed", [True, False])
async def test_P8_the_gate_asks_the_client_and_its_answer_decides(
    harness: Harness, allowed: bool
) -> None:
    harness.hello()
    session = harness.open(gate="ask")
    asked = await _asked(harness, session, harness.calls("x", tool="note")[0])
    assert asked.session_id == session and asked.call["name"] == "note"
    harness.send(ApprovalReply(asked.approval_id, allowed, "" if allowed else "no"))
    got = await harness.turn(session, [])  # an empty turn after it: the first has ended
    ends = [e for m in got if isinstance(m, TurnEvent) for e in m.events if e["type"] == "tool_end"]
    (end,) = [e for e in ends if e["call_id"] == "c0"]
    assert end["result"].get("is_error", False) is not allowed
    assert len(harness.core.sessions.approvals) == 0


@pytest.mark.spec("P8")
async def test_P8_no_answer_in_time_and_a_client_that_leaves_are_denials(harness: Harness) -> None:
    harness.hello()
    session = harness.open(gate="ask", approval_timeout=0.01)
    await _asked(harness, session, harness.calls("x", tool="note")[0])
    got = await harness.turn(session, [])
    texts = [
        e["result"]["content"][0]["text"]
        for m in got
        if isinstance(m, TurnEvent)
        for e in m.events
        if e["type"] == "tool_end"
    ]
    assert texts == ["Not approved: no answer within 0.01 s."]
    patient = harness.open(gate="ask")
    await _asked(harness, patient, harness.calls("y", tool="note")[0])
    assert len(harness.core.sessions.approvals) == 1
    harness.core.forget_client(ME)
    await ticks(5)
    assert len(harness.core.sessions.approvals) == 0


# --- the window (L5) ----------------------------------------------------------------------


@pytest.mark.spec("L5")
async def test_L5_a_client_that_does_not_acknowledge_holds_its_turns(
    tmp_path: Path, workspace: Path
) -> None:
    coordinator = Coordinator([echo])
    wire = Wire()
    core = DaemonCore(
        coordinator, None, wire, defer=asyncio.get_running_loop().call_soon,
        spill_dir=tmp_path, client_buffer_bytes=4096,
    )  # fmt: skip
    harness = Harness(core, wire, workspace)
    try:
        harness.hello()
        session = harness.open()
        big = "z" * 3000
        # The first turn's results fill the window: what follows waits on disk, held
        harness.send(Submit(harness.rid(), session, harness.calls(big, big, big)))
        await ticks(50)
        client = core.clients.table[ME]
        assert client.outbox.held and client.hold.on
        sent_while_held = wire.frames[ME]
        await ticks(50)
        assert wire.frames[ME] == sent_while_held  # nothing more leaves unacknowledged
        # Acknowledging everything sent lets the rest out, and the hold goes
        harness.send(Ack(client.outbox.sent))
        for _ in range(100):
            if not client.outbox.held:
                break
            harness.send(Ack(client.outbox.sent))
            await ticks(1)
        assert not client.outbox.held and not client.hold.on
        assert wire.frames[ME] > sent_while_held
    finally:
        core.end_sessions()
        await ticks(5)
        coordinator.close()
