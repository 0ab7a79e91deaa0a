"""The wire format: every message round-trips; bad bytes raise one error type."""

from __future__ import annotations

import io
from typing import Any

import msgpack
import pytest

from toolpool.protocol import (
    MAX_FRAME_BYTES,
    MESSAGE_CLASSES,
    PROTOCOL_VERSION,
    Accepted,
    BridgeReady,
    CallContext,
    CallStatus,
    Error,
    EventSelection,
    Execute,
    Exited,
    FailureCode,
    Heartbeat,
    Hello,
    McpCall,
    McpCancel,
    McpProgress,
    McpResult,
    Message,
    MessageType,
    Progress,
    ProtocolError,
    Ready,
    Result,
    Shutdown,
    Spawn,
    Spawned,
    Steer,
    SteerAction,
    Submit,
    TurnEvent,
    decode,
    encode,
    read_frame,
    write_frame,
)
from toolpool.protocol.fields import struct

MESSAGES: list[Message] = [
    Ready("w1", 1234),
    Execute(
        "c1",
        "read",
        {"path": "a.txt", "n": [1, None, {"k": 1.5}]},
        CallContext(workspace="/w", session_id="s1", extra_roots=("/r",), scratch_dir="/tmp/s"),
        {"wall_seconds": 3.0},
        {"/w/a.txt": {"mtime_ns": 1, "partial": False}},
    ),
    Progress("c1", {"lines": 3}),
    Progress("c1", "chunk of output\n"),
    Result("c1", CallStatus.OK, {"call_id": "c1"}, {"wall_seconds": 0.1}, {"/w/a.txt": None}),
    Result("c2", CallStatus.CANCELLED, {"call_id": "c2"}),
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
    Hello("r1", client="test"),
    Submit("r2", "s1", [{"id": "a", "name": "read", "arguments": {}}], open=True),
    Submit("r5", "s1", [], events=EventSelection.RESULTS),
    Accepted("r2", "t1", ["a"]),
    TurnEvent("t1", [{"type": "turn_end", "results": []}]),
    Steer("r3", "s1", SteerAction.INTERRUPT),
    Error("r4", FailureCode.UNKNOWN_SESSION, "no session 's9'"),
    Error(None, FailureCode.PROTOCOL, "unreadable"),
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
        # two fields wrong: the first one is named, whichever way it was read
        (msgpack.packb({"t": "spawned", "worker_id": 7, "pid": "1"}), "spawned.worker_id is"),
        (msgpack.packb({"t": "ready", "worker_id": "w", "extra": 1}), "bad ready message"),
        (msgpack.packb({1: 2}), "not a msgpack frame"),  # non-string keys refused
        (msgpack.packb({"t": "mcp_result", "call_id": "c", "content": "x"}), "is a str"),
        (msgpack.packb({"t": "mcp_progress", "call_id": "c", "progress": "1"}), "is a str"),
        (msgpack.packb({"t": "result", "call_id": "c", "status": "fine", "result": {}}), "not one"),
        (msgpack.packb({"t": "result", "call_id": "c", "status": 1, "result": {}}), "is a int"),
        (
            msgpack.packb(
                {"t": "result", "call_id": "c", "status": "ok", "result": {}, "stamps": {"p": 1}}
            ),
            r"result.stamps\['p'\] is a int, not dict",
        ),
        (
            msgpack.packb(
                {
                    "t": "execute",
                    "call_id": "c",
                    "tool": "t",
                    "arguments": {},
                    "limits": {},
                    "context": [],
                }
            ),
            "execute.context is a list, not CallContext",
        ),
        (
            msgpack.packb(
                {
                    "t": "execute",
                    "call_id": "c",
                    "tool": "t",
                    "arguments": {},
                    "limits": {},
                    "context": {"workspace": 1},
                }
            ),
            "execute.context.workspace is a int, not str",
        ),
        (
            msgpack.packb(
                {
                    "t": "execute",
                    "call_id": "c",
                    "tool": "t",
                    "arguments": {},
                    "limits": {},
                    "context": {"extra_roots": []},
                }
            ),
            "bad execute.context: .*workspace",
        ),
        (
            msgpack.packb(
                {
                    "t": "execute",
                    "call_id": "c",
                    "tool": "t",
                    "arguments": {},
                    "limits": {},
                    "context": {"workspace": "/w", "extra_roots": [3]},
                }
            ),
            r"execute.context.extra_roots\[0\] is a int, not str",
        ),
        (
            msgpack.packb({"t": "accepted", "request_id": "r", "turn_id": "t", "call_ids": [1]}),
            "is a int",
        ),
        (
            msgpack.packb(
                {"t": "submit", "request_id": "r", "session_id": "s", "calls": [], "events": "x"}
            ),
            r"submit\.events is 'x', not one of 'all', 'results'",
        ),
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


def test_the_table_is_the_message_union_and_covers_every_type() -> None:
    assert set(MESSAGE_CLASSES) == {kind.value for kind in MessageType}
    assert all(cls.type.value == name for name, cls in MESSAGE_CLASSES.items())


def test_states_travel_as_their_strings_and_come_back_as_members() -> None:
    # The bytes are the ones a plain string gives (wire compatible with v1 peers).
    plain = {"t": "steer", "request_id": "r", "session_id": "s", "action": "abort"}
    assert encode(Steer("r", "s", SteerAction.ABORT)) == msgpack.packb(plain)
    steer = decode(msgpack.packb(plain))
    assert isinstance(steer, Steer) and steer.action is SteerAction.ABORT
    result = decode(encode(Result("c", CallStatus.ERROR, {})))
    assert isinstance(result, Result) and result.status is CallStatus.ERROR


def test_the_call_context_is_a_map_on_the_wire() -> None:
    context = CallContext(workspace="/w", session_id="s", extra_roots=("/a", "/b"))
    frame = msgpack.unpackb(encode(Execute("c", "t", {}, context, {})))
    assert frame["context"] == {
        "workspace": "/w",
        "session_id": "s",
        "extra_roots": ["/a", "/b"],
        "allow_network": False,
        "persistent_shell": False,
        "root": "host",
        "layer_bytes": 0,
        "image": "",
        "workspace_overlay": False,
        "workspace_view": "",
        "scratch_dir": None,
        "tool_profile": "toolpool",
    }
    # A peer that leaves out the optional fields is read with their defaults.
    minimal = {"t": "execute", "call_id": "c", "tool": "t", "arguments": {}, "limits": {}}
    decoded = decode(msgpack.packb({**minimal, "context": {"workspace": "/w"}}))
    assert isinstance(decoded, Execute)
    assert decoded.context == CallContext(workspace="/w")


def test_a_context_read_again_is_checked_as_strictly_as_the_first_time() -> None:
    # A worker reads its session's context in every Execute; the last one read is
    # kept, and a frame equal to it in value but not in type is still refused.
    context = CallContext(workspace="/w", session_id="s", allow_network=True, layer_bytes=5)
    frame = msgpack.unpackb(encode(Execute("c", "t", {}, context, {})))
    first = decode(msgpack.packb(frame))
    again = decode(msgpack.packb(frame))
    assert isinstance(first, Execute) and isinstance(again, Execute)
    assert first.context == again.context == context
    for field, twin in (("allow_network", 1), ("layer_bytes", 5.0)):
        bad = {**frame, "context": {**frame["context"], field: twin}}
        with pytest.raises(ProtocolError, match=f"execute.context.{field}"):
            decode(msgpack.packb(bad))
    # and a context that changed is read anew
    changed = {**frame, "context": {**frame["context"], "session_id": "s2"}}
    later = decode(msgpack.packb(changed))
    assert isinstance(later, Execute) and later.context.session_id == "s2"


def test_an_unreadable_request_keeps_its_id_for_the_answer() -> None:
    bad = {"t": "steer", "request_id": "r7", "session_id": "s", "action": "dance"}
    with pytest.raises(ProtocolError, match=r"steer\.action is 'dance', not one of") as caught:
        decode(msgpack.packb(bad))
    assert caught.value.request_id == "r7"
    with pytest.raises(ProtocolError) as unnamed:
        decode(msgpack.packb({"t": "ready", "worker_id": 7, "pid": 1}))
    assert unnamed.value.request_id is None


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.type.value)
def test_the_fast_way_and_the_way_by_name_read_the_same(message: Message) -> None:
    # decode reads a frame with every field there by position; a frame that differs
    # (a field missing, unknown or wrong) is read by name, which names the fault.
    body = msgpack.unpackb(encode(message))
    reader = struct(MESSAGE_CLASSES[body.pop("t")])
    assert reader._build_by_name(dict(body)) == decode(encode(message))


def test_a_field_added_later_is_left_out_at_its_default() -> None:
    # Submit.events came after v2 peers: a Submit that leaves it at "all" is the very
    # frame it was before, which such a peer still reads.
    calls = [{"id": "a", "name": "read", "arguments": {}}]
    before = {
        "t": "submit",
        "request_id": "r",
        "session_id": "s",
        "calls": calls,
        "format": "toolpool",
        "open": False,
    }
    assert encode(Submit("r", "s", calls)) == msgpack.packb(before, use_bin_type=True)
    asked = msgpack.unpackb(encode(Submit("r", "s", calls, events=EventSelection.RESULTS)))
    assert asked == {**before, "events": "results"}
    assert decode(msgpack.packb(before)) == Submit("r", "s", calls)
