"""toolpool as OpenAI Agents SDK function tools (SPEC A3), with a fake ``Model``
playing the model and the SDK's trace export disabled (nothing leaves the machine):
a read, an edit after it, a refusal the model reads, the gate as the SDK's approval,
a cancelled run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, Usage, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from toolpool import AsyncClient
from toolpool.client.toolbox import AsyncToolbox
from toolpool.integrations.openai_agents import function_tools

from .daemon_support import Daemon, shared_daemon

set_tracing_disabled(True)  # the SDK exports traces to OpenAI unless told not to


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("agents")) as running:
        yield running


class ScriptedModel(Model):
    """Makes ``calls`` one per response, then answers with the outputs it read."""

    def __init__(self, *calls: tuple[str, dict[str, Any]]) -> None:
        self.calls = calls

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> Any:
        items = input if isinstance(input, list) else []
        made = sum(1 for i in items if _field(i, "type") == "function_call")
        if made < len(self.calls):
            name, arguments = self.calls[made]
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"c{made}",
                name=name,
                arguments=json.dumps(arguments),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        outputs = [
            str(_field(i, "output")) for i in items if _field(i, "type") == "function_call_output"
        ]
        text = ResponseOutputText(type="output_text", text="\n---\n".join(outputs), annotations=[])
        message = ResponseOutputMessage(
            type="message", id="m", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


@pytest.mark.spec("A3", "F3", "F4")
async def test_A3_read_edit_after_read_and_a_refusal_the_model_reads(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("hello world\n")
    edit = {"path": "notes.txt", "old_string": "world", "new_string": "there"}
    model = ScriptedModel(("edit", edit), ("read", {"path": "notes.txt"}), ("edit", edit))
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        agent = Agent(name="coder", model=model, tools=await function_tools(toolbox))
        result = await Runner.run(agent, "fix the greeting")
    refused, read, edited = result.final_output.split("\n---\n")
    assert "read" in refused.lower() and "notes.txt" in refused
    assert "hello world" in read
    assert "notes.txt" in edited
    assert (workspace / "notes.txt").read_text() == "hello there\n"


@pytest.mark.spec("A3", "P8")
async def test_A3_the_gate_is_the_sdks_approval(daemon: Daemon, workspace: Path) -> None:
    """gate=ask: a tool that is not read-only needs the SDK's approval; the run stops
    with an interruption; approved, the call runs; a read-only tool is not asked."""
    model = ScriptedModel(("ls", {}), ("bash", {"command": "echo approved > done.txt"}))
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace, gate="ask") as toolbox:
        agent = Agent(name="coder", model=model, tools=await function_tools(toolbox))
        first = await Runner.run(agent, "write done.txt")
        (item,) = first.interruptions
        assert item.raw_item.name == "bash"
        assert not (workspace / "done.txt").exists()
        state = first.to_state()
        state.approve(item)
        second = await Runner.run(agent, state)
    assert (workspace / "done.txt").read_text() == "approved\n"
    assert "Exit code: 0" in second.final_output


@pytest.mark.spec("A3", "D4")
async def test_A3_a_cancelled_run_cancels_its_call_in_the_daemon(
    daemon: Daemon, workspace: Path
) -> None:
    model = ScriptedModel(("bash", {"command": "touch started; sleep 3600"}))
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        agent = Agent(name="coder", model=model, tools=await function_tools(toolbox))
        run = asyncio.ensure_future(Runner.run(agent, "sleep"))
        for _ in range(600):  # a hang guard: the command starts within a second or two
            if (workspace / "started").exists():
                break
            await asyncio.sleep(0.05)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        after = await toolbox.call("bash", {"command": "echo after"})  # S2: after the sleep
    assert after.text.startswith("after\n")
