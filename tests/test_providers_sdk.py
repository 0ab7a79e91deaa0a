"""The provider SDKs' own objects go into ``submit`` as they are (SPEC E1).

Each provider's reply is built with its SDK's own types (no network): an Anthropic
``Message``, an OpenAI ``ChatCompletion``, a Responses ``Response``, a Gemini
``GenerateContentResponse``. The whole response, its message and the bare list of
blocks, items or parts are each submitted to a real daemon, and the turn's results
in that provider's shape are checked against the SDK's request types for the next
call: Anthropic's ``MessageParam``, OpenAI's ``ChatCompletionToolMessageParam``, the
Responses ``function_call_output`` input item, Gemini's ``Content``. Every turn reads
a file (a text result), a missing file (an error result) and a PNG (an image); the
OpenAI ones also hold a call whose arguments JSON is cut off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic.types as anthropic_types
import pytest
from google.genai import types as gemini_types
from openai.types import chat as chat_types
from openai.types import responses as responses_types
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from toolpool import AsyncClient, Client, RequestFailed, ToolResult
from toolpool.providers import results_to_anthropic

from .daemon_support import Daemon, shared_daemon
from .support import PNG_1X1

README = "# my project\n\nIt uses toolpool.\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("sdk")) as started:
        yield started


@pytest.fixture
def project(workspace: Path) -> Path:
    (workspace / "README.md").write_text(README)
    (workspace / "pixel.png").write_bytes(PNG_1X1)
    return workspace


# The calls of every turn: (path, what its result is).
READS = [("README.md", "text"), ("missing.txt", "error"), ("pixel.png", "image")]
CUT_OFF = '{"path": "READ'  # an OpenAI call whose arguments JSON ends early


# --- each provider's reply, in its SDK's own types ----------------------------------------


def anthropic_message() -> anthropic_types.Message:
    return anthropic_types.Message(
        id="msg_01",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=[
            anthropic_types.TextBlock(type="text", text="I'll read those files."),
            *(
                anthropic_types.ToolUseBlock(
                    type="tool_use", id=f"toolu_{i}", name="read", input={"path": path}
                )
                for i, (path, _) in enumerate(READS)
            ),
        ],
        stop_reason="tool_use",
        stop_sequence=None,
        usage=anthropic_types.Usage(input_tokens=120, output_tokens=80),
    )


def chat_completion() -> chat_types.ChatCompletion:
    calls = [
        chat_types.ChatCompletionMessageFunctionToolCall(
            id=f"call_{i}",
            type="function",
            function=Function(name="read", arguments=json.dumps({"path": path})),
        )
        for i, (path, _) in enumerate(READS)
    ]
    calls.append(
        chat_types.ChatCompletionMessageFunctionToolCall(
            id="call_cut", type="function", function=Function(name="read", arguments=CUT_OFF)
        )
    )
    message = chat_types.ChatCompletionMessage(role="assistant", content=None, tool_calls=calls)
    return chat_types.ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=1_764_000_000,
        model="gpt-5",
        choices=[Choice(index=0, finish_reason="tool_calls", message=message)],
    )


def responses_response() -> responses_types.Response:
    calls = [
        responses_types.ResponseFunctionToolCall(
            type="function_call",
            id=f"fc_{i}",
            call_id=f"call_{i}",
            name="read",
            arguments=json.dumps({"path": path}),
            status="completed",
        )
        for i, (path, _) in enumerate(READS)
    ]
    cut = responses_types.ResponseFunctionToolCall(
        type="function_call", id="fc_cut", call_id="call_cut", name="read", arguments=CUT_OFF
    )
    return responses_types.Response(
        id="resp_1",
        object="response",
        created_at=1_764_000_000,
        model="gpt-5",
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        output=[
            responses_types.ResponseReasoningItem(type="reasoning", id="rs_1", summary=[]),
            *calls,
            cut,
        ],
    )


def gemini_response() -> gemini_types.GenerateContentResponse:
    parts = [gemini_types.Part(text="Reading the files.")]
    parts += [
        gemini_types.Part(function_call=gemini_types.FunctionCall(name="read", args={"path": p}))
        for p, _ in READS
    ]
    content = gemini_types.Content(role="model", parts=parts)
    return gemini_types.GenerateContentResponse(
        candidates=[gemini_types.Candidate(content=content, finish_reason="STOP")],
        model_version="gemini-3-pro",
    )


def _content(message: anthropic_types.Message) -> Any:
    return message.content


def _message_param(message: anthropic_types.Message) -> Any:
    return {"role": "assistant", "content": message.content}  # as a conversation keeps it


def _dumped_blocks(message: anthropic_types.Message) -> Any:
    return [block.model_dump() for block in message.content]


def _chat_message(completion: chat_types.ChatCompletion) -> Any:
    return completion.choices[0].message


def _chat_tool_calls(completion: chat_types.ChatCompletion) -> Any:
    return completion.choices[0].message.tool_calls


def _output(response: responses_types.Response) -> Any:
    return response.output


def _dumped_output(response: responses_types.Response) -> Any:
    return [item.model_dump() for item in response.output]


def _gemini_content(response: gemini_types.GenerateContentResponse) -> Any:
    assert response.candidates
    return response.candidates[0].content


def _gemini_parts(response: gemini_types.GenerateContentResponse) -> Any:
    content = _gemini_content(response)
    return content.parts


def _snake_case_dump(response: gemini_types.GenerateContentResponse) -> Any:
    return response.model_dump()  # keys as the SDK names them: function_call, …


def _whole(reply: Any) -> Any:
    return reply


PROVIDERS: dict[str, Callable[[], Any]] = {
    "anthropic": anthropic_message,
    "openai": chat_completion,
    "openai-responses": responses_response,
    "gemini": gemini_response,
}
SHAPES: list[tuple[str, Callable[[Any], Any]]] = [
    ("anthropic", _whole),
    ("anthropic", _content),
    ("anthropic", _message_param),
    ("anthropic", _dumped_blocks),
    ("openai", _whole),
    ("openai", _chat_message),
    ("openai", _chat_tool_calls),
    ("openai-responses", _whole),
    ("openai-responses", _output),
    ("openai-responses", _dumped_output),
    ("gemini", _whole),
    ("gemini", _gemini_content),
    ("gemini", _gemini_parts),
    ("gemini", _snake_case_dump),
]


def expected_ids(provider: str) -> list[str]:
    prefix = {"anthropic": "toolu_", "gemini": "gemini-call-"}.get(provider, "call_")
    ids = [f"{prefix}{i}" for i in range(len(READS))]
    return ids if provider in ("anthropic", "gemini") else [*ids, "call_cut"]


# --- checking results against the SDKs' request types --------------------------------------


def _forced(value: Any) -> Any:
    """A validated TypedDict with its lazily checked iterables run through."""
    if isinstance(value, dict):
        return {key: _forced(item) for key, item in value.items()}
    if isinstance(value, list | tuple) or hasattr(value, "__next__"):
        return [_forced(item) for item in value]
    return value


def valid(param_type: Any, value: Any) -> Any:
    """``value`` checked against an SDK's TypedDict strictly: a wrong type raises, and
    a key the type does not have would be dropped, so the round trip must be equal."""
    adapter = TypeAdapter(param_type)  # alive while its iterators are run through
    assert _forced(adapter.validate_python(value, strict=True)) == value
    return value


def check_anthropic(results: Any) -> None:
    message = valid(anthropic_types.MessageParam, results)
    assert message["role"] == "user"
    blocks = message["content"]
    assert [b["tool_use_id"] for b in blocks] == expected_ids("anthropic")
    for block, (_, kind) in zip(blocks, READS, strict=True):
        assert block["type"] == "tool_result"
        assert block["is_error"] is (kind == "error")
        kinds = [part["type"] for part in block["content"]]
        assert kinds == (["text", "image"] if kind == "image" else ["text"])
    assert "my project" in blocks[0]["content"][0]["text"]
    image = blocks[2]["content"][1]["source"]
    assert image == {"type": "base64", "media_type": "image/png", "data": image["data"]}


def check_openai(results: Any) -> None:
    messages = [valid(chat_types.ChatCompletionToolMessageParam, m) for m in results]
    assert [m["tool_call_id"] for m in messages] == expected_ids("openai")
    text, missing, image, cut = (m["content"] for m in messages)
    assert "my project" in text
    assert "missing.txt" in missing
    assert "[image/png image not shown" in image
    assert "arguments are not valid JSON" in cut


def check_responses(results: Any) -> None:
    items = [valid(FunctionCallOutput, item) for item in results]
    assert [item["call_id"] for item in items] == expected_ids("openai-responses")
    text, missing, image, cut = (item["output"] for item in items)
    assert isinstance(text, str) and "my project" in text
    assert isinstance(missing, str) and "missing.txt" in missing
    assert [part["type"] for part in image] == ["input_text", "input_image"]
    assert image[1]["image_url"].startswith("data:image/png;base64,")
    assert "arguments are not valid JSON" in cut


def check_gemini(results: Any) -> None:
    # As the API would receive it: JSON, bytes in base64 (the SDK decodes them).
    content = gemini_types.Content.model_validate_json(json.dumps(results))
    assert content.model_dump(mode="json", by_alias=True, exclude_none=True) == results
    assert content.role == "user" and content.parts
    responses = [part.function_response for part in content.parts]
    assert all(r is not None and r.name == "read" and r.id is None for r in responses)
    text, missing, image = (r.response for r in responses if r is not None)
    assert text is not None and "my project" in text["output"]
    assert missing is not None and "missing.txt" in missing["error"]
    assert image is not None and "output" in image
    picture = responses[2]
    assert picture is not None and picture.parts
    blob = picture.parts[0].inline_data
    assert blob is not None and (blob.mime_type, blob.data) == ("image/png", PNG_1X1)


CHECKS: dict[str, Callable[[Any], None]] = {
    "anthropic": check_anthropic,
    "openai": check_openai,
    "openai-responses": check_responses,
    "gemini": check_gemini,
}


def check_results(provider: str, results: tuple[ToolResult, ...], as_provider: Any) -> None:
    assert [r.call_id for r in results] == expected_ids(provider)
    kinds = [kind for _, kind in READS] + (["error"] if len(results) > len(READS) else [])
    assert [r.is_error for r in results] == [kind == "error" for kind in kinds]
    CHECKS[provider](as_provider)


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.spec("E1")
def test_sdk_objects_go_into_submit_as_they_are(daemon: Daemon, project: Path) -> None:
    """Every shape of every provider's reply, one turn each, in one session."""
    with (
        Client(runtime_dir=daemon.runtime, timeout=20) as client,
        client.session(project) as session,
    ):
        for provider, shape in SHAPES:
            payload = shape(PROVIDERS[provider]())
            turn = session.submit(payload, events="results")
            results = turn.results(timeout=20)
            try:
                check_results(provider, results, turn.results_as(provider, timeout=20))
            except AssertionError as exc:
                raise AssertionError(f"{provider} {shape.__name__}: {exc}") from exc


@pytest.mark.spec("E1")
def test_sdk_objects_with_their_format_named(daemon: Daemon, project: Path) -> None:
    with (
        Client(runtime_dir=daemon.runtime, timeout=20) as client,
        client.session(project) as session,
    ):
        for provider, shape in [("anthropic", _content), ("gemini", _snake_case_dump)]:
            turn = session.submit(shape(PROVIDERS[provider]()), format=provider)
            check_results(provider, turn.results(timeout=20), turn.results_as(provider))


@pytest.mark.spec("E1")
async def test_the_async_client_takes_sdk_objects_in_submit_and_add(
    daemon: Daemon, project: Path
) -> None:
    async with (
        AsyncClient(runtime_dir=daemon.runtime, timeout=20) as client,
        client.session(project) as session,
    ):
        turn = await session.submit(anthropic_message(), open=True)
        extra = anthropic_types.ToolUseBlock(
            type="tool_use", id="toolu_extra", name="read", input={"path": "README.md"}
        )
        await turn.add([extra])  # a list of the SDK's blocks, into an open turn
        await turn.close()
        results = await turn.results(timeout=20)
        assert [r.call_id for r in results] == [*expected_ids("anthropic"), "toolu_extra"]
        check_anthropic(results_to_anthropic(results[: len(READS)]))
        assert "my project" in results[-1].text

        turn = await session.submit(gemini_response())
        check_results("gemini", await turn.results(timeout=20), await turn.results_as("gemini"))


@pytest.mark.spec("E1")
def test_a_call_dict_with_a_key_toolpool_does_not_know_is_refused(
    daemon: Daemon, project: Path
) -> None:
    """``input`` where ``arguments`` belongs: refused, never run with no arguments."""
    call = {"id": "1", "name": "read", "input": {"path": "README.md"}}
    with (
        Client(runtime_dir=daemon.runtime, timeout=20) as client,
        client.session(project) as session,
    ):
        for format in (None, "toolpool"):
            with pytest.raises(RequestFailed) as refused:
                session.submit([call], format=format)
            message = refused.value.message
            assert "key 'input' not understood" in message
            assert "toolpool, openai, openai-responses, anthropic, gemini" in message
        # The session is still good.
        turn = session.submit([{"id": "2", "name": "read", "arguments": {"path": "README.md"}}])
        assert "my project" in turn.results(timeout=20)[0].text
