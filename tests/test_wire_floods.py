"""SPEC L2, L3, L5 without a daemon: events on the wire, chunks, the outbox window."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolpool.client import DaemonUnavailable
from toolpool.client.connection import Connection
from toolpool.client.core import TurnLog
from toolpool.daemon.outbox import Outbox
from toolpool.models import (
    Event,
    MessageEnd,
    MessageStart,
    TextBlock,
    ToolCall,
    ToolEnd,
    ToolMessage,
    ToolResult,
    ToolStart,
    TurnEnd,
)
from toolpool.protocol import (
    PROTOCOL_VERSION,
    Accepted,
    Ack,
    Chunk,
    Error,
    EventReader,
    EventSelection,
    FailureCode,
    Hello,
    ProtocolError,
    Reassembly,
    Submit,
    TurnEvent,
    Welcome,
    chunked,
    decode,
    encode,
    event_to_wire,
)


def _result(call_id: str, text: str) -> ToolResult:
    return ToolResult(call_id, "read", (TextBlock(text),))


@pytest.mark.spec("L2")
def test_L2_a_result_crosses_once_and_the_reader_rebuilds_every_event() -> None:
    big = "x" * 100_000
    a, b = _result("a", big), _result("b", "small")
    events: list[Event] = [
        ToolStart("a", "read", {"path": "f"}, "Read f"),
        ToolEnd("a", "read", a),
        ToolEnd("b", "read", b),
        MessageStart(ToolMessage.from_result(a)),
        MessageEnd(ToolMessage.from_result(a)),
        MessageStart(ToolMessage.from_result(b)),
        MessageEnd(ToolMessage.from_result(b)),
        TurnEnd((a, b)),
    ]
    frame = encode(TurnEvent("t", [event_to_wire(e) for e in events]))
    assert frame.count(big.encode()) == 1  # once, in a's tool_end
    message = decode(frame)
    assert isinstance(message, TurnEvent)
    reader = EventReader()
    rebuilt = reader.read_all(message.events)
    assert rebuilt == events
    start, end = rebuilt[3], rebuilt[4]
    assert isinstance(start, MessageStart) and isinstance(end, MessageEnd)
    assert start.message is end.message  # one message of a result, built once


@pytest.mark.spec("L2")
def test_L2_a_results_only_reader_passes_over_the_other_events() -> None:
    # Whether the daemon sent only what a results-only turn asked for or every event
    # (one that predates the selection), the turn holds the same events.
    a = _result("a", "x")
    every: list[Event] = [
        ToolStart("a", "read", {}, "Read"),
        ToolEnd("a", "read", a),
        MessageStart(ToolMessage.from_result(a)),
        MessageEnd(ToolMessage.from_result(a)),
        TurnEnd((a,)),
    ]
    wanted = [every[1], every[4]]
    for sent in (every, wanted):
        reader = EventReader(EventSelection.RESULTS)
        assert reader.read_all([event_to_wire(e) for e in sent]) == wanted


@pytest.mark.spec("L2")
def test_L2_a_reference_to_a_result_that_did_not_arrive_is_refused() -> None:
    reader = EventReader()
    with pytest.raises(ValueError, match="did not arrive"):
        reader.read_all([{"type": "message_start", "call_id": "nope"}])
    with pytest.raises(ValueError, match="did not arrive"):
        reader.read_all([{"type": "turn_end", "call_ids": ["nope"]}])
    with pytest.raises(ValueError, match="did not arrive"):
        reader.read_all([{"type": "turn_end", "call_ids": [["not", "a", "string"]]}])
    end = event_to_wire(ToolEnd("a", "read", _result("a", "x")))
    reader.read_all([end])
    with pytest.raises(ValueError, match="second tool_end"):
        reader.read_all([end])


@pytest.mark.spec("L3")
def test_L3_a_large_frame_goes_as_chunks_and_comes_back_whole() -> None:
    frame = encode(
        TurnEvent("t", [event_to_wire(ToolEnd("a", "read", _result("a", "z" * 10_000)))])
    )
    parts = chunked(frame, stream=7, size=1000)
    assert len(parts) == len(frame) // 1000 + 1
    assert all(len(p) < 1100 for p in parts)  # a chunk's frame is its data plus a little
    joined = Reassembly()
    outputs = []
    for part in parts:
        message = decode(part)
        assert isinstance(message, Chunk) and message.stream == 7
        outputs.append(joined.add(message))
    assert outputs[:-1] == [None] * (len(parts) - 1)
    assert outputs[-1] == frame
    assert not joined.pending
    assert chunked(b"small", stream=1, size=1000) == [b"small"]


@pytest.mark.spec("L3")
def test_L3_interleaved_or_oversized_chunks_are_protocol_errors() -> None:
    joined = Reassembly(limit=10)
    joined.add(Chunk(1, b"12345"))
    with pytest.raises(ProtocolError, match="inside stream 1"):
        joined.add(Chunk(2, b"x"))
    with pytest.raises(ProtocolError, match="over 10 bytes"):
        Reassembly(limit=10).add(Chunk(1, b"x" * 11))


def _outbox(tmp_path: Path, window: int) -> tuple[Outbox, list[bytes]]:
    sent: list[bytes] = []
    return Outbox(sent.append, window, tmp_path / "client.frames"), sent


@pytest.mark.spec("L5")
def test_L5_the_outbox_never_has_more_than_its_window_out(tmp_path: Path) -> None:
    outbox, sent = _outbox(tmp_path, window=100)
    frames = [bytes([i]) * 30 for i in range(10)]
    for frame in frames:
        outbox.push(frame)
    assert sent == frames[:3]  # 90 bytes out; a fourth would pass 100
    assert outbox.held and outbox.spilled == 7 * 30
    assert (tmp_path / "client.frames").stat().st_size == 7 * 30  # waiting on disk
    received = 0
    while outbox.spilled:
        received += 30  # the client reads one frame and says so
        outbox.ack(received)
        assert outbox.in_flight <= 100
    assert sent == frames  # all of them, in order, none twice
    assert outbox.peak <= 100
    assert outbox.spilled == 0 and outbox.stalled() == 0
    outbox.close()
    assert not (tmp_path / "client.frames").exists()


@pytest.mark.spec("L5")
def test_L5_a_frame_larger_than_the_window_leaves_alone(tmp_path: Path) -> None:
    outbox, sent = _outbox(tmp_path, window=10)
    outbox.push(b"a" * 50)  # nothing is out: it goes
    outbox.push(b"b")
    assert sent == [b"a" * 50] and outbox.held
    outbox.ack(10**9)  # more than was sent counts as all of it
    assert sent == [b"a" * 50, b"b"] and not outbox.held


@pytest.mark.spec("L5")
def test_L5_a_held_client_counts_as_stalled_only_while_its_acks_stand_still(
    tmp_path: Path,
) -> None:
    outbox, _ = _outbox(tmp_path, window=10)
    assert outbox.stalled() == 0
    outbox.push(b"x" * 10)
    outbox.push(b"y" * 10)  # spilled: from now on, held
    assert outbox.stalled(now=10**9) > 0
    outbox.ack(5)  # some progress, still held: the clock starts again
    assert outbox.held
    later = outbox.stalled(now=10**9)
    outbox.ack(5)  # no progress
    assert outbox.stalled(now=10**9) == later
    outbox.close()
    assert outbox.stalled() == 0
    outbox.push(b"z")  # after close nothing goes anywhere
    assert not outbox.held


# --- the client's side: the sans-IO connection --------------------------------------


def _client() -> tuple[Connection, TurnLog]:
    connection = Connection("ipc:///nowhere", timeout=7.0)
    connection.start()
    connection.hello("test", 1.0)
    (hello,) = [decode(f) for f in connection.take_outgoing()]
    assert isinstance(hello, Hello)
    connection.receive(encode(Welcome(hello.request_id, PROTOCOL_VERSION, 4242, ["read"])))
    submitting = connection.submit("s1", [ToolCall("a", "read", {})], None, False)
    (submit,) = [decode(f) for f in connection.take_outgoing()]
    assert isinstance(submit, Submit)
    connection.receive(encode(Accepted(submit.request_id, "t1", ["a"])))
    return connection, submitting.outcome()


@pytest.mark.spec("L2", "L3", "L5")
def test_L3_the_client_joins_chunks_rebuilds_the_turn_and_acknowledges() -> None:
    connection, log = _client()
    a = _result("a", "q" * 600_000)
    ending: list[Event] = [
        ToolEnd("a", "read", a),
        MessageStart(ToolMessage.from_result(a)),
        TurnEnd((a,)),
    ]
    frame = encode(TurnEvent("t1", [event_to_wire(e) for e in ending]))
    parts = chunked(frame, stream=1, size=100_000)
    for part in parts[:-1]:
        connection.receive(part)
    assert not log.items  # nothing before the last chunk
    connection.receive(parts[-1])
    assert log.results == (a,)
    assert log.items == ending
    acks = [m for m in map(decode, connection.take_outgoing()) if isinstance(m, Ack)]
    assert acks and acks[-1].received <= sum(len(p) for p in parts)
    assert acks[0].received >= 256 * 1024  # in steps, not per frame
    assert connection.failure is None


@pytest.mark.spec("L5")
def test_L5_the_daemons_last_word_fails_the_connection_even_mid_stream() -> None:
    connection, _ = _client()
    parts = chunked(encode(TurnEvent("t1", [{"type": "x" * 50_000}])), stream=3, size=10_000)
    connection.receive(parts[0])
    connection.receive(encode(Error(None, FailureCode.DISCONNECTED, "it stalled")))
    assert isinstance(connection.failure, DaemonUnavailable)
    assert "it stalled" in str(connection.failure)
