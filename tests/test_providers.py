"""Provider formats: calls read from model output, results and tool definitions written back.

The fixtures under fixtures/providers/ are hand-made in each provider's documented
shape (an OpenAI Chat completion, a Responses response, an Anthropic message, a
Gemini generateContent response); each round trip runs through the real pipeline.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from toolpool import ErrorCode, TextBlock, ToolCall, ToolContext, ToolResult, ToolSpec, tool
from toolpool.client.core import call_payload
from toolpool.engine import Coordinator, Session
from toolpool.providers import (
    CALL_FORMATS,
    PROVIDERS,
    calls_from_gemini,
    calls_from_openai_chat,
    definitions,
    detect_call_format,
    parse_tool_calls,
    results_to_anthropic,
    results_to_gemini,
    results_to_mcp,
    results_to_openai_chat,
    results_to_openai_responses,
    results_to_provider,
    tools_to_anthropic,
    tools_to_gemini,
    tools_to_mcp,
    tools_to_openai_chat,
    tools_to_openai_responses,
)
from toolpool.providers.payload import ARGUMENTS_PREVIEW_CHARS

from .support import PNG_1X1, Picture, Probe
from .worker_tools import lookup, write_note

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
PNG_B64 = base64.b64encode(PNG_1X1).decode()


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class Point(BaseModel):
    x: int
    y: int = 0


@tool
def plot(origin: Point, points: list[Point], label: str | None = None) -> str:
    """Plot points.

    Args:
        origin: Where the axes cross.
    """
    return "plotted"


@pytest.fixture
def coordinator() -> Coordinator:
    return Coordinator([lookup, write_note, Picture()])


@pytest.fixture
def session(coordinator: Coordinator, workspace: Path) -> Iterator[Session]:
    session = coordinator.open_session(workspace)
    yield session
    coordinator.close_session(session)


# --- round trips through the pipeline ----------------------------------------------


@pytest.mark.spec("M1")
async def test_openai_chat_round_trip_answers_a_cut_off_call_with_an_error_result(
    coordinator: Coordinator, session: Session, workspace: Path
) -> None:
    # Given a completion with two tool calls, the second one's JSON cut off
    calls = parse_tool_calls(fixture("openai_chat_completion.json"))
    assert [c.id for c in calls] == ["call_lookup_alpha", "call_note_cut_off"]
    assert calls[0] == ToolCall("call_lookup_alpha", "lookup", {"key": "alpha"})
    broken = calls[1]
    assert broken.arguments == {}
    assert broken.arguments_error is not None
    assert broken.arguments_error.startswith("arguments are not valid JSON (")
    assert '\'{"path": "todo.txt", "text": "buy mi\'' in broken.arguments_error

    # When the turn runs
    results = await coordinator.run_turn(session, calls)

    # Then the cut-off call is an error result of its own, the other call succeeded,
    # and each comes back as a tool message carrying its tool_call_id, in call order
    assert results[0].is_error is False
    assert results[1].error_code is ErrorCode.INVALID_ARGUMENTS
    assert not (workspace / "todo.txt").exists()
    assert results_to_openai_chat(results) == [
        {"role": "tool", "tool_call_id": "call_lookup_alpha", "content": "value of alpha"},
        {
            "role": "tool",
            "tool_call_id": "call_note_cut_off",
            "content": f'Invalid arguments for tool "write_note":\n- {broken.arguments_error}',
        },
    ]


@pytest.mark.spec("M1")
async def test_openai_responses_round_trip_skips_reasoning_and_pairs_by_call_id(
    coordinator: Coordinator, session: Session, workspace: Path
) -> None:
    output = fixture("openai_responses_response.json")["output"]

    calls = parse_tool_calls(output)
    results = await coordinator.run_turn(session, calls)

    assert calls == [
        ToolCall("call_lookup_alpha", "lookup", {"key": "alpha"}),
        ToolCall("call_write_note", "write_note", {"path": "todo.txt", "text": "buy milk"}),
    ]
    assert (workspace / "todo.txt").read_text() == "buy milk"
    assert results_to_openai_responses(results) == [
        {
            "type": "function_call_output",
            "call_id": "call_lookup_alpha",
            "output": "value of alpha",
        },
        {
            "type": "function_call_output",
            "call_id": "call_write_note",
            "output": "wrote 8 characters to todo.txt",
        },
    ]


@pytest.mark.spec("M1")
async def test_anthropic_round_trip_gives_one_user_message_with_is_error(
    coordinator: Coordinator, session: Session
) -> None:
    # Given an assistant message with text and two tool_use blocks, one with a bad input
    calls = parse_tool_calls(fixture("anthropic_message.json"))
    assert calls == [
        ToolCall("toolu_01Alpha", "lookup", {"key": "alpha"}),
        ToolCall("toolu_02Seven", "lookup", {"key": 7}),
    ]

    results = await coordinator.run_turn(session, calls)

    # Then ONE user message answers both, in order, the failed one flagged is_error
    assert results[1].error_code is ErrorCode.INVALID_ARGUMENTS
    assert results_to_anthropic(results) == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01Alpha",
                "content": [{"type": "text", "text": "value of alpha"}],
                "is_error": False,
            },
            {
                "type": "tool_result",
                "tool_use_id": "toolu_02Seven",
                "content": [{"type": "text", "text": results[1].text}],
                "is_error": True,
            },
        ],
    }


@pytest.mark.spec("M1")
async def test_gemini_round_trip_synthesises_ids_and_answers_by_name(
    coordinator: Coordinator, session: Session, workspace: Path
) -> None:
    calls = parse_tool_calls(fixture("gemini_response.json"))
    assert [(c.id, c.name) for c in calls] == [
        ("gemini-call-0", "lookup"),
        ("gemini-call-1", "write_note"),
    ]

    results = await coordinator.run_turn(session, calls)

    # The made-up ids are not sent back: Gemini did not issue them
    assert (workspace / "todo.txt").read_text() == "buy milk"
    assert results_to_gemini(results) == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "lookup", "response": {"output": "value of alpha"}}},
            {
                "functionResponse": {
                    "name": "write_note",
                    "response": {"output": "wrote 8 characters to todo.txt"},
                }
            },
        ],
    }


async def test_gemini_ids_the_model_gave_go_back_and_errors_use_the_error_key(
    coordinator: Coordinator, session: Session
) -> None:
    content = {"role": "model", "parts": [{"functionCall": {"id": "fc-7", "name": "lookup"}}]}

    calls = calls_from_gemini(content)
    results = await coordinator.run_turn(session, calls)

    assert calls == [ToolCall("fc-7", "lookup", {})]
    assert results_to_gemini(results) == {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "id": "fc-7",
                    "name": "lookup",
                    "response": {"error": results[0].text},
                }
            }
        ],
    }
    assert "key" in results[0].text


# --- rich results --------------------------------------------------------------------

IMAGE_RESULTS: list[tuple[str, Any]] = [
    (
        "openai",
        [
            {
                "role": "tool",
                "tool_call_id": "pic-1",
                "content": "a 1x1 png\n[image/png image not shown: "
                "Chat Completions tool messages carry text only]",
            }
        ],
    ),
    (
        "openai-responses",
        [
            {
                "type": "function_call_output",
                "call_id": "pic-1",
                "output": [
                    {"type": "input_text", "text": "a 1x1 png"},
                    {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"},
                ],
            }
        ],
    ),
    (
        "anthropic",
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "pic-1",
                    "content": [
                        {"type": "text", "text": "a 1x1 png"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": PNG_B64,
                            },
                        },
                    ],
                    "is_error": False,
                }
            ],
        },
    ),
    (
        "gemini",
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "pic-1",
                        "name": "picture",
                        "response": {"output": "a 1x1 png"},
                        "parts": [{"inlineData": {"mimeType": "image/png", "data": PNG_B64}}],
                    }
                }
            ],
        },
    ),
    (
        "mcp",
        [
            {
                "content": [
                    {"type": "text", "text": "a 1x1 png"},
                    {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
                ],
                "isError": False,
            }
        ],
    ),
]


@pytest.mark.spec("M1")
@pytest.mark.parametrize(("provider_name", "expected"), IMAGE_RESULTS, ids=lambda p: str(p)[:20])
async def test_an_image_result_in_each_providers_shape(
    coordinator: Coordinator, session: Session, provider_name: str, expected: Any
) -> None:
    results = await coordinator.run_turn(session, [ToolCall("pic-1", "picture", {})])

    assert results_to_provider(results, provider_name) == expected


def test_anthropic_leaves_out_blank_text_it_would_refuse() -> None:
    blank = ToolResult("toolu_1", "lookup", (TextBlock("  \n"),))
    empty = ToolResult("toolu_2", "lookup", ())

    message = results_to_anthropic([blank, empty])

    assert message["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": False},
    ]


def test_results_keep_the_order_they_are_given_in() -> None:
    results = [ToolResult(f"id-{n}", "lookup", (TextBlock(str(n)),)) for n in (3, 1, 2)]

    assert [m["tool_call_id"] for m in results_to_openai_chat(results)] == ["id-3", "id-1", "id-2"]
    assert [m["call_id"] for m in results_to_openai_responses(results)] == ["id-3", "id-1", "id-2"]
    blocks = results_to_anthropic(results)["content"]
    assert [b["tool_use_id"] for b in blocks] == ["id-3", "id-1", "id-2"]
    parts = results_to_gemini(results)["parts"]
    assert [p["functionResponse"]["id"] for p in parts] == ["id-3", "id-1", "id-2"]
    assert [r["content"][0]["text"] for r in results_to_mcp(results)] == ["3", "1", "2"]


# --- tool definitions ----------------------------------------------------------------


def test_definitions_for_openai_chat_responses_and_anthropic() -> None:
    spec = ToolSpec(lookup)
    schema = {
        "type": "object",
        "properties": {"key": {"type": "string", "description": "The key to look up."}},
        "required": ["key"],
        "additionalProperties": False,
    }

    assert tools_to_openai_chat([spec]) == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look up a key.", "parameters": schema},
        }
    ]
    assert tools_to_openai_responses([spec]) == [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look up a key.",
            "parameters": schema,
            "strict": False,
        }
    ]
    assert tools_to_anthropic([spec]) == [
        {"name": "lookup", "description": "Look up a key.", "input_schema": schema}
    ]


def test_exported_schemas_are_copies() -> None:
    spec = ToolSpec(lookup)

    tools_to_anthropic([spec])[0]["input_schema"]["properties"].clear()

    assert "key" in spec.schema["properties"]


def test_mcp_definitions_carry_the_read_only_and_destructive_hints() -> None:
    specs = [ToolSpec(lookup), ToolSpec(write_note), ToolSpec(Probe())]

    tools = {t["name"]: t for t in tools_to_mcp(specs)}

    assert tools["lookup"] == {
        "name": "lookup",
        "title": "Look Up",
        "description": "Look up a key.",
        "inputSchema": ToolSpec(lookup).schema,
        "annotations": {"readOnlyHint": True, "destructiveHint": False},
        "_meta": {"toolpool/concurrencySafe": True},
    }
    assert tools["write_note"]["title"] == "write_note"
    assert tools["write_note"]["annotations"] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "openWorldHint": False,
    }
    assert tools["write_note"]["_meta"] == {"toolpool/concurrencySafe": False}
    assert tools["probe"]["title"] == "Probe Tool"
    assert tools["probe"]["annotations"]["openWorldHint"] is True


def test_gemini_declarations_inline_defs_and_drop_what_gemini_refuses() -> None:
    declarations = tools_to_gemini([ToolSpec(plot), ToolSpec(Picture())])

    point = {
        "type": "OBJECT",
        "properties": {"x": {"type": "INTEGER"}, "y": {"type": "INTEGER"}},
        "required": ["x"],
    }
    assert declarations == [
        {
            "name": "plot",
            "description": "Plot points.",
            "parameters": {
                "type": "OBJECT",
                "properties": {
                    "origin": {**point, "description": "Where the axes cross."},
                    "points": {"type": "ARRAY", "items": point},
                    "label": {"type": "STRING", "nullable": True},
                },
                "required": ["origin", "points"],
            },
        },
        # no arguments: no parameters, as Gemini refuses an OBJECT without properties
        {"name": "picture", "description": "Returns a picture."},
    ]


class Shaped:
    """A hand-written tool whose schema uses what Gemini's subset lacks."""

    name = "shaped"
    description = "Exercises the schema conversion."
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "tree": {"$ref": "#/$defs/Node"},
            "url": {"type": ["string", "null"], "format": "uri", "maxLength": 200},
            "when": {"type": "string", "format": "date-time"},
            "level": {"type": "integer", "enum": [1, 2, 3], "description": "How loud."},
            "mode": {"const": "fast"},
            "either": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["tree", "missing"],
        "$defs": {
            "Node": {
                "type": "object",
                "description": "A tree node.",
                "properties": {
                    "value": {"type": "string", "title": "Value", "default": ""},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
            }
        },
    }

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return "ok"


def test_gemini_schema_conversion_of_refs_unions_enums_and_formats() -> None:
    (declaration,) = tools_to_gemini([ToolSpec(Shaped())])

    assert declaration["parameters"] == {
        "type": "OBJECT",
        "properties": {
            "tree": {
                "type": "OBJECT",
                "description": "A tree node.",
                "properties": {
                    "value": {"type": "STRING"},
                    # recursion is cut: the inner node keeps only its type
                    "children": {
                        "type": "ARRAY",
                        "items": {"type": "OBJECT", "description": "A tree node."},
                    },
                },
            },
            "url": {"type": "STRING", "nullable": True, "maxLength": 200},
            "when": {"type": "STRING", "format": "date-time"},
            "level": {"type": "INTEGER", "description": "How loud. (one of: 1, 2, 3)"},
            "mode": {"type": "STRING", "enum": ["fast"]},
            "either": {"anyOf": [{"type": "INTEGER", "minimum": 0}, {"type": "STRING"}]},
            "tags": {"type": "OBJECT"},
        },
        "required": ["tree"],
    }


def test_gemini_refuses_a_reference_it_cannot_inline() -> None:
    class Remote(Shaped):
        name = "remote"
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"x": {"$ref": "https://example.com/x.json"}},
        }

    with pytest.raises(ValueError, match=r"tool 'remote': schema\.properties\.x\.\$ref"):
        tools_to_gemini([ToolSpec(Remote())])


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_the_provider_table_picks_the_same_conversions_by_name(name: str) -> None:
    specs = [ToolSpec(lookup), ToolSpec(write_note)]
    direct = {
        "openai": tools_to_openai_chat,
        "openai-responses": tools_to_openai_responses,
        "anthropic": tools_to_anthropic,
        "gemini": tools_to_gemini,
        "langchain": tools_to_openai_chat,  # bind_tools takes OpenAI's function tools
        "mcp": tools_to_mcp,
    }[name]

    assert definitions(specs, name) == direct(specs)


def test_an_unknown_provider_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown provider 'claude'; known: openai, "):
        definitions([ToolSpec(lookup)], "claude")
    with pytest.raises(ValueError, match="unknown provider"):
        results_to_provider([], "claude")


# --- reading calls: detection and malformed input ------------------------------------

ANTHROPIC = fixture("anthropic_message.json")
CHAT = fixture("openai_chat_completion.json")
GEMINI = fixture("gemini_response.json")
RESPONSES = fixture("openai_responses_response.json")


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (CHAT, "openai"),
        (CHAT["choices"][0]["message"], "openai"),
        (CHAT["choices"][0]["message"]["tool_calls"], "openai"),
        (RESPONSES, "openai-responses"),
        (RESPONSES["output"], "openai-responses"),
        (ANTHROPIC, "anthropic"),
        (ANTHROPIC["content"], "anthropic"),
        (GEMINI, "gemini"),
        (GEMINI["candidates"][0]["content"], "gemini"),
        (GEMINI["candidates"][0]["content"]["parts"], "gemini"),
        (ToolCall("1", "lookup"), "toolpool"),
        ([ToolCall("1", "lookup")], "toolpool"),
        ([ToolCall("1", "lookup", {"key": "a"}).to_dict()], "toolpool"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_the_format_is_detected(payload: Any, expected: str) -> None:
    assert detect_call_format(payload) == expected
    assert parse_tool_calls(payload) == parse_tool_calls(payload, expected)
    assert parse_tool_calls(payload) != []


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "assistant", "content": "Nothing to run."},
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        [{"type": "reasoning", "id": "rs_1", "summary": []}],
        [],
    ],
)
def test_a_message_without_calls_has_none(payload: Any) -> None:
    assert parse_tool_calls(payload) == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"tool_calls": [], "parts": []}, r"ambiguous payload: .* gemini and openai"),
        (
            [ANTHROPIC["content"][1], RESPONSES["output"][1]],
            r"mixes call formats \(item 0 is anthropic, item 1 is openai-responses\)",
        ),
        ({"role": "assistant", "text": "hi"}, r"cannot tell the format .* \['role', 'text'\]"),
        ("call lookup", "not a string"),
        (
            [{"type": "tool_use", "id": "t", "name": "x", "input": {}}, 3],
            "item 1 must be an object",
        ),
    ],
)
def test_detection_refuses_what_it_cannot_tell(payload: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tool_calls(payload)


def test_a_named_format_must_match_the_payload() -> None:
    with pytest.raises(ValueError, match="needs 'candidates'"):
        parse_tool_calls(ANTHROPIC, "gemini")
    with pytest.raises(ValueError, match=r"no call format 'mcp'; known: toolpool, openai"):
        parse_tool_calls(ANTHROPIC, "mcp")
    assert set(CALL_FORMATS) == {
        "toolpool", "openai", "openai-responses", "anthropic", "gemini", "langchain"
    }  # fmt: skip


def _tool_use(**block: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", **block}]}


def _chat(*tool_calls: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(tool_calls)}


@pytest.mark.parametrize(
    ("payload", "provider_name", "message"),
    [
        (_tool_use(id="t1", input={}), "anthropic", r"message\.content\[0\] has no 'name'"),
        (_tool_use(id="t1", name="x", input=[1]), "anthropic", r"\[0\]\.input must be an object"),
        (_chat({"id": "c1", "function": "lookup"}), "openai", r"tool_calls\[0\]\.function must be"),
        (
            _chat({"id": "c1", "function": {"name": "lookup", "arguments": 5}}),
            "openai",
            r"tool_calls\[0\]\.function\.arguments must be a JSON string, got number",
        ),
        (
            _chat({"id": "c1", "type": "custom", "custom": {"name": "x", "input": "y"}}),
            "openai",
            "is a 'custom' tool call",
        ),
        (_chat({"function": {"name": "lookup", "arguments": ""}}), "openai", "has no 'id'"),
        ({"choices": [{}, {}]}, "openai", "the completion has 2 choices"),
        (
            [{"type": "function_call", "name": "lookup", "arguments": "{}"}],
            "openai-responses",
            r"output\[0\] has no 'call_id'",
        ),
        (
            {"parts": [{"functionCall": {"name": "lookup", "args": ["a"]}}]},
            "gemini",
            r"content\.parts\[0\]\.functionCall\.args must be an object, got list",
        ),
        ({"candidates": [{}, {}]}, "gemini", "the response has 2 candidates"),
        ([{"id": "1", "arguments": {}}], "toolpool", r"calls\[0\]\.name must be a non-empty"),
    ],
)
def test_malformed_input_says_what_is_wrong_where(
    payload: Any, provider_name: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tool_calls(payload, provider_name)


def _arguments(raw: Any) -> ToolCall:
    (call,) = calls_from_openai_chat(
        [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": raw}}]
    )
    return call


@pytest.mark.parametrize(
    ("raw", "arguments", "error"),
    [
        ("", {}, None),
        ("  \n", {}, None),
        ('{"key": "a"}', {"key": "a"}, None),
        ({"key": "a"}, {"key": "a"}, None),  # OpenAI-compatible servers that send an object
        ("[1, 2]", {}, "arguments must be a JSON object, got list: '[1, 2]'"),
        ("null", {}, "arguments must be a JSON object, got null: 'null'"),
    ],
)
def test_openai_json_arguments(raw: Any, arguments: dict[str, Any], error: str | None) -> None:
    call = _arguments(raw)

    assert (call.arguments, call.arguments_error) == (arguments, error)


def test_unparseable_arguments_are_quoted_only_in_part() -> None:
    raw = '{"text": "' + "x" * 10_000

    error = _arguments(raw).arguments_error

    assert error is not None
    assert error.startswith("arguments are not valid JSON (Unterminated string")
    assert error.endswith("… (10010 characters in all)")
    assert len(error) < ARGUMENTS_PREVIEW_CHARS + 120


# --- model output as the SDKs give it (E1) ------------------------------------------------


class Dumped:
    """An SDK object as far as toolpool can tell: something with ``model_dump``, which
    gives ``data`` when called as E1 says (JSON mode, by alias, without None)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def model_dump(self, *, mode: str, by_alias: bool, exclude_none: bool) -> Any:
        assert (mode, by_alias, exclude_none) == ("json", True, True)
        return self.data


def _snake_case(value: Any) -> Any:
    """A Gemini payload as google-genai's ``model_dump()`` gives it: snake_case keys,
    every unset field there as None."""
    names = {"functionCall": "function_call", "finishReason": "finish_reason"}
    if isinstance(value, dict):
        out = {names.get(k, k): _snake_case(v) for k, v in value.items()}
        if "parts" in out:
            out["parts"] = [{"text": None, "function_response": None, **p} for p in out["parts"]]
            for part in out["parts"]:
                part.setdefault("function_call", None)
                if part["function_call"] is not None:
                    part["function_call"] = {
                        "id": None,
                        "will_continue": None,
                        **part["function_call"],
                    }
        return out
    if isinstance(value, list):
        return [_snake_case(v) for v in value]
    return value


GEMINI_SNAKE = _snake_case(GEMINI)


@pytest.mark.spec("E1")
@pytest.mark.parametrize(
    "payload",
    [
        GEMINI_SNAKE,
        GEMINI_SNAKE["candidates"][0]["content"],
        GEMINI_SNAKE["candidates"][0]["content"]["parts"],
    ],
    ids=["response", "content", "parts"],
)
def test_gemini_dumps_in_snake_case_are_read_like_camel_case(payload: Any) -> None:
    assert "function_call" in json.dumps(payload) and "functionCall" not in json.dumps(payload)
    expected = parse_tool_calls(GEMINI)

    assert detect_call_format(payload) == "gemini"
    assert parse_tool_calls(payload) == expected
    assert parse_tool_calls(payload, "gemini") == expected
    assert calls_from_gemini(payload) == expected


@pytest.mark.spec("E1")
@pytest.mark.parametrize(
    ("whole", "payload", "expected"),
    [
        (ANTHROPIC, ANTHROPIC["content"], "anthropic"),
        (RESPONSES, RESPONSES["output"], "openai-responses"),
        (CHAT, CHAT["choices"][0]["message"]["tool_calls"], "openai"),
        (GEMINI, GEMINI["candidates"][0]["content"]["parts"], "gemini"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bare_lists_of_each_kind_keep_their_arguments(
    whole: Any, payload: Any, expected: str
) -> None:
    """A bare ``content`` / ``output`` / ``tool_calls`` / ``parts`` list, as plain dicts and
    as SDK objects, is read as its provider's, with its arguments; and it goes on the wire
    as that (the client does not take its ``id``/``name`` items for toolpool's calls)."""
    calls = parse_tool_calls(whole)
    assert calls and any(call.arguments for call in calls)

    assert detect_call_format(payload) == expected
    assert parse_tool_calls(payload) == calls
    assert parse_tool_calls(payload, expected) == calls
    assert parse_tool_calls([Dumped(item) for item in payload]) == calls
    assert call_payload(payload, None) == (payload, None)
    assert call_payload([Dumped(item) for item in payload], None) == (payload, None)


@pytest.mark.spec("E1")
@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (ANTHROPIC, "anthropic"),
        (CHAT, "openai"),
        (RESPONSES, "openai-responses"),
        (GEMINI, "gemini"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_objects_with_model_dump_are_read_through_their_dump(payload: Any, expected: str) -> None:
    calls = parse_tool_calls(payload)
    provider_of = PROVIDERS[expected].parse_calls
    assert provider_of is not None

    assert detect_call_format(Dumped(payload)) == expected
    assert parse_tool_calls(Dumped(payload)) == calls
    assert parse_tool_calls(Dumped(payload), expected) == calls
    assert provider_of(Dumped(payload)) == calls
    # Objects inside plain dicts too: a conversation keeps {"role", "content": blocks}.
    nested = {
        key: [Dumped(item) for item in value] if isinstance(value, list) else value
        for key, value in payload.items()
    }
    assert parse_tool_calls(nested) == calls
    # What the client sends: plain data, the same as the dump.
    assert call_payload(Dumped(payload), None) == (payload, None)
    assert call_payload(nested, expected) == (payload, expected)


@pytest.mark.spec("E1")
def test_an_openai_message_dumped_without_its_nulls_has_no_calls() -> None:
    assert parse_tool_calls(Dumped({"role": "assistant"})) == []
    assert parse_tool_calls({"role": "assistant", "refusal": "I can't help with that."}) == []


@pytest.mark.spec("E1")
@pytest.mark.parametrize(
    ("payload", "provider_name", "where", "keys"),
    [
        ([{"id": "1", "name": "lookup", "input": {"key": "a"}}], None, "item 0", "key 'input'"),
        ([{"id": "1", "name": "lookup", "input": {}}], "toolpool", r"calls\[0\]", "key 'input'"),
        (
            [{"id": "1", "name": "lookup", "arguments": {}, "args": {}, "kwargs": {}}],
            None,
            "item 0",
            "keys 'args', 'kwargs'",
        ),
        ({"role": "assistant", "text": "hi"}, None, "cannot tell the format", "key 'text'"),
        (
            {"id": "1", "name": "lookup", "input": {}},
            None,
            "cannot tell the format",
            "keys 'id', 'input', 'name'",
        ),
    ],
)
def test_a_dict_that_matches_no_format_is_refused_naming_the_formats_and_the_key(
    payload: Any, provider_name: str | None, where: str, keys: str
) -> None:
    with pytest.raises(ValueError, match="not understood") as refused:
        parse_tool_calls(payload, provider_name)
    message = str(refused.value)

    assert re.match(where, message)
    assert f"{keys} not understood" in message
    assert "toolpool, openai, openai-responses, anthropic, gemini" in message
    # The client does not send it as toolpool's calls either: the daemon refuses it so.
    assert call_payload(payload, None) == (payload, None)


@pytest.mark.spec("M1", "F12")
def test_openai_responses_custom_tool_calls_come_in_as_input_and_go_back_as_custom_outputs() -> (
    None
):
    from openai.types.responses import ResponseCustomToolCall, ResponseFunctionToolCall

    from toolpool.providers.openai_responses import custom_call_ids

    # Given a response whose output holds a custom tool call (Codex's free-form
    # apply_patch) beside a function call, as the openai SDK gives them
    patch = "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch\n"
    output = [
        ResponseCustomToolCall(
            type="custom_tool_call", call_id="c1", name="apply_patch", input=patch
        ),
        ResponseFunctionToolCall(
            type="function_call", call_id="c2", name="read", arguments='{"path": "a.txt"}'
        ),
    ]
    response = {"id": "resp_1", "object": "response", "output": [o.model_dump() for o in output]}
    # When it is parsed, and results go back
    calls = parse_tool_calls(response)
    results = [ToolResult(c.id, c.name, (TextBlock("done"),)) for c in calls]
    answers = results_to_openai_responses(results, custom_call_ids(response))
    # Then the custom call's raw text is its one argument, input
    assert calls == [
        ToolCall("c1", "apply_patch", {"input": patch}),
        ToolCall("c2", "read", {"path": "a.txt"}),
    ]
    # and each call is answered by the item of its own kind
    assert answers == [
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
        {"type": "function_call_output", "call_id": "c2", "output": "done"},
    ]
    assert custom_call_ids(output) == {"c1"} and custom_call_ids("no") == frozenset()
    assert results_to_openai_responses(results)[0]["type"] == "function_call_output"
    # A bare output list of custom calls only is detected too, not read as no calls
    assert parse_tool_calls([output[0].model_dump()]) == [calls[0]]


@pytest.mark.spec("E1")
def test_a_custom_tool_call_without_its_input_is_refused_naming_the_key() -> None:
    item = {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch"}
    with pytest.raises(ValueError, match="input"):
        parse_tool_calls({"output": [item]})
