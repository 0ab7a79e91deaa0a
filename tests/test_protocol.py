"""The wire format: every message round-trips; bad bytes raise one error type."""

from __future__ import annotations

import io
from typing import Any

import msgpack
import pytest

from toolpool.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    BridgeReady,
    Execute,
    Exited,
    Heartbeat,
    McpCall,
    McpCancel,
    McpProgress,
    McpResult,
    Message,
    Progress,
    ProtocolError,
    Ready,
    Result,
    Shutdown,
    Spawn,
    Spawned,
    decode,
    encode,
    read_frame,
    write_frame,
)

MESSAGES: list[Message] = [
    Ready("w1", 1234),
    Execute(
        "c1",
        "read",
        {"path": "a.txt", "n": [1, None, {"k": 1.5}]},
        {"workspace": "/w", "extra_roots": []},
        {"wall_seconds": 3.0},
        {"/w/a.txt": {"mtime_ns": 1, "partial": False}},
    ),
    Progress("c1", {"lines": 3}),
    Progress("c1", "chunk of output\n"),
    Result("c1", "ok", {"call_id": "c1"}, {"wall_seconds": 0.1}, {"/w/a.txt": None}),
    Heartbeat("w1", 35_000_000),
    Shutdown("retired"),
    Spawn("w2", {"endpoint": "ipc:///x"}),
    Spawned("w2", 99),
    Exited(99, signal=9),
    Exited(98, exit_code=3),
    BridgeReady("files", [{"name": "read_file", "inputSchema": {"type": "object"}}]),
    BridgeReady("broken", error="[Errno 2] No such file or directory: 'npx'"),
    McpCall("c1", "read_file", {"path": "/srv/a.txt"}),
    McpProgress("c1", 2, 10.0, "two of ten"),
    McpProgress("c1", 0.5),
    McpResult("c1", [{"type": "image", "data": "iVBO", "mimeType": "image/png"}]),
    McpResult("c1", [{"type": "text", "text": "no such file"}], is_error=True),
    McpCancel("c1"),
]


@pytest.mark.spec("D2")
@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.type.value)
def test_every_message_round_trips(message: Message) -> None:
    assert decode(encode(message)) == message


def test_ready_carries_the_protocol_version() -> None:
    assert decode(encode(Ready("w", 1))).version == PROTOCOL_VERSION  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (b"\xc1", "not a msgpack frame"),
        (b"", "not a msgpack frame"),
        (msgpack.packb([1, 2]), "holds a list, not a map"),
        (msgpack.packb({"t": "teleport"}), "unknown message type 'teleport'"),
        (msgpack.packb({"x": 1}), "unknown message type None"),
        (msgpack.packb({"t": "ready", "pid": 1}), "bad ready message"),
        (msgpack.packb({"t": "ready", "worker_id": "w", "pid": 1, "extra": 2}), "bad ready"),
        (msgpack.packb({"t": "ready", "worker_id": 7, "pid": 1}), "ready.worker_id is a int"),
        (msgpack.packb({"t": "spawned", "worker_id": "w", "pid": "1"}), "spawned.pid is a str"),
        (msgpack.packb({1: 2}), "not a msgpack frame"),  # non-string keys refused
        (msgpack.packb({"t": "mcp_result", "call_id": "c", "content": "x"}), "is a str"),
        (msgpack.packb({"t": "mcp_progress", "call_id": "c", "progress": "1"}), "is a str"),
    ],
)
def test_bad_bytes_raise_protocol_error(frame: Any, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        decode(frame)


def test_oversized_frames_are_refused_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    header = (MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    with pytest.raises(ProtocolError, match="exceeds"):
        read_frame(io.BytesIO(header))


def test_length_prefixed_frames_over_a_stream() -> None:
    stream = io.BytesIO()
    for message in MESSAGES:
        write_frame(stream, message)
    stream.seek(0)
    read = []
    while (message := read_frame(stream)) is not None:
        read.append(message)
    assert read == MESSAGES
    last = encode(MESSAGES[-1])
    truncated = io.BytesIO(len(last).to_bytes(4, "big") + last[:-3])
    with pytest.raises(ProtocolError, match="ended inside a frame"):
        read_frame(truncated)


class Trickle(io.RawIOBase):
    """A pipe that hands out one byte per read, as a slow pipe may."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk, self.data = self.data[:1], self.data[1:]
        return chunk


def test_short_reads_are_continued() -> None:
    stream = io.BytesIO()
    write_frame(stream, MESSAGES[1])
    assert read_frame(Trickle(stream.getvalue())) == MESSAGES[1]  # type: ignore[arg-type]
