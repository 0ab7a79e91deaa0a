"""LangChain's tool calls as a format (SPEC E7): ``AIMessage.tool_calls`` (bare, or in
the message, or the SDK's own ``AIMessage``) detected and answered in ``ToolMessage``'s
shape; a list whose items match no format refused, never run as nothing."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from toolpool import ToolResult
from toolpool.models import ErrorCode, ImageBlock, TextBlock, ToolCall
from toolpool.providers import detect_call_format, parse_tool_calls, results_to_provider

CALLS = [
    {"id": "1", "name": "read", "args": {"path": "a.txt"}, "type": "tool_call"},
    {"id": "2", "name": "ls", "args": {}},
]


@pytest.mark.spec("E7", "E1")
@pytest.mark.parametrize(
    "payload",
    [
        CALLS,  # AIMessage.tool_calls, as it is
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        AIMessage("let me look", tool_calls=CALLS),  # the SDK's object (model_dump)
    ],
    ids=["bare list", "message dict", "AIMessage"],
)
def test_E7_langchain_calls_are_detected_and_read(payload: Any) -> None:
    assert detect_call_format(payload) == "langchain"
    assert parse_tool_calls(payload) == [
        ToolCall("1", "read", {"path": "a.txt"}),
        ToolCall("2", "ls", {}),
    ]


@pytest.mark.spec("E7")
def test_E7_an_invalid_tool_call_is_an_error_of_its_own() -> None:
    message = AIMessage(
        "",
        tool_calls=CALLS[:1],
        invalid_tool_calls=[
            {
                "id": "3",
                "name": "grep",
                "args": '{"pattern": ',
                "error": "cut off",
                "type": "invalid_tool_call",
            }
        ],
    )
    read, broken = parse_tool_calls(message)
    assert read.arguments_error is None
    assert broken.id == "3" and broken.name == "grep"
    assert broken.arguments_error is not None and "cut off" in broken.arguments_error


@pytest.mark.spec("E7", "M1")
def test_E7_results_in_toolmessage_shape_rebuild_as_toolmessages() -> None:
    results = [
        ToolResult("1", "read", (TextBlock("hello"),)),
        ToolResult("2", "read", (TextBlock("a picture"), ImageBlock("aGk=", "image/png"))),
        ToolResult.error(ToolCall("3", "edit", {}), ErrorCode.VALIDATION_FAILED, "read it first"),
    ]
    messages = [ToolMessage(**m) for m in results_to_provider(results, "langchain")]
    assert [m.tool_call_id for m in messages] == ["1", "2", "3"]
    assert messages[0].content == "hello" and messages[0].status == "success"
    assert messages[1].content[1] == {"type": "image", "base64": "aGk=", "mime_type": "image/png"}
    assert messages[2].status == "error" and messages[2].content == "read it first"


@pytest.mark.spec("E7", "E1")
@pytest.mark.parametrize(
    ("payload", "message"),
    [
        # OpenAI Chat's custom (free-form) tool calls, bare: refused as in a message.
        (
            [{"id": "c1", "type": "custom", "custom": {"name": "x", "input": "hi"}}],
            r"is a 'custom' tool call; toolpool runs function tools only",
        ),
        # LangChain's call without its id (a ToolMessage could not answer it).
        ([{"name": "lookup", "args": {"key": "a"}}], r"tool_calls\[0\] has no 'id'"),
        # A type no format has: refused, not read as a list without calls.
        ([{"type": "action", "id": "1", "tool": "read"}], r"item 0 has type 'action'"),
        (
            [{"type": "text", "text": "hi"}, {"type": "function_invocation", "name": "x"}],
            r"item 1 has type 'function_invocation', which matches no call format",
        ),
    ],
)
def test_E7_a_list_whose_items_match_no_format_is_refused(payload: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tool_calls(payload)


@pytest.mark.spec("E7")
def test_E7_lists_of_text_and_hosted_items_still_hold_no_call() -> None:
    assert (
        parse_tool_calls([{"type": "text", "text": "hi"}, {"type": "reasoning", "id": "r"}]) == []
    )
