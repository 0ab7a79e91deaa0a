"""SPEC M1-M2: results back to the model; the data model as plain dicts."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from toolpool import (
    ErrorCode,
    ImageBlock,
    MessageEnd,
    MessageStart,
    TextBlock,
    ToolCall,
    ToolEnd,
    ToolMessage,
    ToolResult,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    UpdateKind,
    event_from_dict,
)
from toolpool.engine import Coordinator

from .support import EventLog, Minimal, Picture

IMAGE = ImageBlock("aGVsbG8=", "image/png")


@pytest.mark.spec("M1")
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ((TextBlock("plain"),), "plain"),
        ((), ""),
        ((TextBlock("a"), TextBlock("b")), (TextBlock("a"), TextBlock("b"))),
        ((TextBlock("look"), IMAGE), (TextBlock("look"), IMAGE)),
        ((IMAGE,), (IMAGE,)),
    ],
)
def test_M1_text_results_are_text_rich_results_are_blocks(
    content: tuple[TextBlock | ImageBlock, ...], expected: object
) -> None:
    result = ToolResult("call-1", "t", content, is_error=True, error_code=ErrorCode.DENIED)
    message = ToolMessage.from_result(result)
    assert message.role == "tool"
    assert message.tool_call_id == "call-1"
    assert message.content == expected
    assert message.is_error


@pytest.mark.spec("M2")
async def test_M2_each_result_gets_a_message_pair_and_the_turn_one_end(workspace: Path) -> None:
    coordinator = Coordinator([Minimal(), Picture()])
    session = coordinator.open_session(workspace)
    calls = [
        ToolCall("a", "minimal", {"text": "hi"}),
        ToolCall("b", "picture", {}),
        ToolCall("c", "nope", {}),
    ]
    log = EventLog()
    results = await coordinator.run_turn(session, calls, on_event=log)
    # Then after the last tool_end come message_start/message_end per result, in call
    # order, and one turn_end carrying every result
    last_tool_end = max(i for i, e in enumerate(log.events) if isinstance(e, ToolEnd))
    tail = log.events[last_tool_end + 1 :]
    assert [e.type.value for e in tail] == ["message_start", "message_end"] * 3 + ["turn_end"]
    messages = [e.message for e in tail if isinstance(e, MessageEnd)]
    assert [m.tool_call_id for m in messages] == ["a", "b", "c"]
    assert messages[0].content == "hi"
    assert isinstance(messages[1].content, tuple)
    assert messages[2].is_error
    assert [e.message for e in tail if isinstance(e, MessageStart)] == messages
    turn_end = tail[-1]
    assert isinstance(turn_end, TurnEnd)
    assert turn_end.results == results


@pytest.mark.spec("M2", "L2")
async def test_M2_a_listener_that_makes_the_message_events_itself_is_not_sent_them(
    workspace: Path,
) -> None:
    # Given a turn submitted with message_events=False (the daemon's: L2).
    coordinator = Coordinator([Minimal()])
    session = coordinator.open_session(workspace)
    log = EventLog()
    calls = [ToolCall("a", "minimal", {"text": "hi"}), ToolCall("b", "nope", {})]
    turn = coordinator.submit(session, calls, on_event=log, message_events=False)
    results = await turn
    # Then every other event comes as before, no message event at all.
    kinds = [e.type.value for e in log.events]
    assert kinds.count("tool_start") == 2 and kinds.count("tool_end") == 2
    assert "message_start" not in kinds and "message_end" not in kinds
    assert kinds[-1] == "turn_end"
    turn_end = log.events[-1]
    assert isinstance(turn_end, TurnEnd) and turn_end.results == results


RESULT = ToolResult(
    "c1",
    "read",
    (TextBlock("x"), IMAGE),
    is_error=True,
    error_code=ErrorCode.EXECUTION_FAILED,
    details={"coerced": [{"path": "n", "to": "integer"}]},
)
EVENTS = [
    ToolStart("c1", "read", {"path": "a", "n": "1"}, "Read", "Reading a"),
    ToolUpdate("c1", "read", UpdateKind.PREVIEW, "--- a\n+++ b\n"),
    ToolUpdate("c1", "read", UpdateKind.PROGRESS, {"lines": 3}),
    ToolEnd("c1", "read", RESULT),
    MessageStart(ToolMessage.from_result(RESULT)),
    MessageEnd(ToolMessage("c2", "plain")),
    TurnEnd((RESULT, ToolResult("c2", "ls", (TextBlock("ok"),)))),
]


@pytest.mark.spec("M2")
@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type.value)
def test_events_are_plain_dicts_that_survive_msgpack(event: object) -> None:
    as_dict = event.to_dict()  # type: ignore[attr-defined]
    wire = msgpack.unpackb(msgpack.packb(as_dict), raw=False)
    assert wire == as_dict
    assert event_from_dict(wire) == event


def test_calls_round_trip_and_bad_events_are_refused() -> None:
    call = ToolCall("id", "edit", {"path": "a", "n": [1, {"k": None}]})
    assert ToolCall.from_dict(msgpack.unpackb(msgpack.packb(call.to_dict()))) == call
    broken = ToolCall("id", "edit", {}, arguments_error="not JSON")
    assert ToolCall.from_dict(msgpack.unpackb(msgpack.packb(broken.to_dict()))) == broken
    with pytest.raises(ValueError, match="unknown event type"):
        event_from_dict({"type": "nonsense"})
    with pytest.raises(ValueError, match="unknown content block"):
        ToolResult.from_dict({"call_id": "x", "tool_name": "y", "content": [{"type": "video"}]})
