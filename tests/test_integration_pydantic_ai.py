"""toolpool as a pydantic-ai toolset (SPEC A3), with pydantic-ai's offline
``FunctionModel`` playing the model: a read, an edit after it, a refusal the model
reads, the gate as pydantic-ai's approval, a cancelled run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from toolpool import AsyncClient
from toolpool.client.toolbox import AsyncToolbox
from toolpool.integrations.pydantic_ai import ToolpoolToolset

from .daemon_support import Daemon, shared_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("pydantic-ai")) as running:
        yield running


def scripted(*calls: tuple[str, dict[str, Any]]) -> FunctionModel:
    """A model that makes ``calls`` one per response, then says what it read."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made = sum(isinstance(m, ModelResponse) for m in messages)
        if made < len(calls):
            name, arguments = calls[made]
            return ModelResponse(parts=[ToolCallPart(name, arguments, tool_call_id=f"t{made}")])
        returns = [
            part.content
            for m in messages
            for part in getattr(m, "parts", ())
            if isinstance(part, ToolReturnPart)
        ]
        return ModelResponse(parts=[TextPart("\n---\n".join(str(r) for r in returns))])

    return FunctionModel(respond)


@pytest.mark.spec("A3", "F3", "F4")
async def test_A3_read_edit_after_read_and_a_refusal_the_model_reads(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("hello world\n")
    edit = {"path": "notes.txt", "old_string": "world", "new_string": "there"}
    model = scripted(("edit", edit), ("read", {"path": "notes.txt"}), ("edit", edit))
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        agent = Agent(model, toolsets=[ToolpoolToolset(toolbox)])
        result = await agent.run("fix the greeting")
    refused, read, edited = result.output.split("\n---\n")
    assert "read" in refused.lower() and "notes.txt" in refused  # F3, as a result (F4)
    assert "hello world" in read
    assert "notes.txt" in edited
    assert (workspace / "notes.txt").read_text() == "hello there\n"


@pytest.mark.spec("A3", "P8")
async def test_A3_the_gate_is_pydantic_ais_approval(daemon: Daemon, workspace: Path) -> None:
    """gate=ask: the call the gate asks about defers the run (DeferredToolRequests,
    with the label and preview); resumed with it approved, the call runs."""
    model = scripted(("bash", {"command": "echo approved > done.txt"}))
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace, gate="ask") as toolbox:
        agent = Agent(
            model, toolsets=[ToolpoolToolset(toolbox)], output_type=[str, DeferredToolRequests]
        )
        first = await agent.run("write done.txt")
        assert isinstance(first.output, DeferredToolRequests)
        (asked,) = first.output.approvals
        assert not (workspace / "done.txt").exists()
        assert first.output.metadata[asked.tool_call_id]["label"]
        second = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={asked.tool_call_id: True}),
        )
    assert (workspace / "done.txt").read_text() == "approved\n"
    assert "Exit code: 0" in str(second.output)


@pytest.mark.spec("A3", "D4")
async def test_A3_a_cancelled_run_cancels_its_call_in_the_daemon(
    daemon: Daemon, workspace: Path
) -> None:
    model = scripted(("bash", {"command": "touch started; sleep 3600"}))
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        agent = Agent(model, toolsets=[ToolpoolToolset(toolbox)])
        run = asyncio.ensure_future(agent.run("sleep"))
        for _ in range(600):  # a hang guard: the command starts within a second or two
            if (workspace / "started").exists():
                break
            await asyncio.sleep(0.05)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        # bash runs alone (S2): this call starts only once the sleep has stopped.
        after = await toolbox.call("bash", {"command": "echo after"})
    assert after.text.startswith("after\n")
