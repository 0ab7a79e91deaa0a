"""toolpool as LangChain tools in a LangGraph graph (SPEC A3), with a fake chat
model that binds tools playing the model: a read, an edit after it, a refusal the
model reads (a ToolMessage of status "error"), the gate as LangGraph's interrupt, a
cancelled graph, and the blocking tools from threads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from toolpool import AsyncClient, Client
from toolpool.client.toolbox import AsyncToolbox, Toolbox
from toolpool.integrations.langchain import blocking_tools, tool_node, tools

from .daemon_support import Daemon, shared_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("langchain")) as running:
        yield running


class ScriptedChatModel(BaseChatModel):
    """Makes ``calls`` one per answer (after binding tools), then says what it read."""

    calls: list[tuple[str, dict[str, Any]]]
    bound: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        self.bound = [t.name for t in tools]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        made = sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)
        if made < len(self.calls):
            name, arguments = self.calls[made]
            answer = AIMessage("", tool_calls=[{"id": f"c{made}", "name": name, "args": arguments}])
        else:
            read = [f"{m.status}: {m.content}" for m in messages if isinstance(m, ToolMessage)]
            answer = AIMessage("\n---\n".join(read))
        return ChatResult(generations=[ChatGeneration(message=answer)])


async def graph_of(toolbox: AsyncToolbox, model: ScriptedChatModel) -> Any:
    bound = model.bind_tools(await tools(toolbox))

    async def think(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", think)
    graph.add_node("tools", await tool_node(toolbox))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.spec("A3", "F3", "F4")
async def test_A3_read_edit_after_read_and_a_refusal_the_model_reads(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("hello world\n")
    edit = {"path": "notes.txt", "old_string": "world", "new_string": "there"}
    model = ScriptedChatModel(
        calls=[("edit", edit), ("read", {"path": "notes.txt"}), ("edit", edit)]
    )
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        graph = await graph_of(toolbox, model)
        state = await graph.ainvoke(
            {"messages": [("user", "fix it")]}, {"configurable": {"thread_id": "1"}}
        )
    refused, read, edited = state["messages"][-1].content.split("\n---\n")
    assert refused.startswith("error: ") and "notes.txt" in refused
    assert read.startswith("success: ") and "hello world" in read
    assert edited.startswith("success: ")
    assert (workspace / "notes.txt").read_text() == "hello there\n"
    assert {"read", "edit", "bash"} <= set(model.bound)


@pytest.mark.spec("A3", "P8")
async def test_A3_the_gate_is_langgraphs_interrupt(daemon: Daemon, workspace: Path) -> None:
    model = ScriptedChatModel(
        calls=[("bash", {"command": "echo one > one.txt"}), ("bash", {"command": "echo two"})]
    )
    config = {"configurable": {"thread_id": "approve"}}
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace, gate="ask") as toolbox:
        graph = await graph_of(toolbox, model)
        first = await graph.ainvoke({"messages": [("user", "go")]}, config)
        (question,) = first["__interrupt__"]
        assert (
            question.value["tool"] == "bash" and "one.txt" in question.value["arguments"]["command"]
        )
        assert not (workspace / "one.txt").exists()
        second = await graph.ainvoke(Command(resume=True), config)  # approved: it runs
        (again,) = second["__interrupt__"]  # the second call asks in its turn
        assert again.value["arguments"] == {"command": "echo two"}
        last = await graph.ainvoke(Command(resume={"approved": False, "reason": "no"}), config)
    assert (workspace / "one.txt").read_text() == "one\n"
    ran, refused = last["messages"][-1].content.split("\n---\n")
    assert ran.startswith("success: ") and "Exit code: 0" in ran
    assert refused == "error: no"


@pytest.mark.spec("A3", "D4")
async def test_A3_a_cancelled_graph_cancels_its_call_in_the_daemon(
    daemon: Daemon, workspace: Path
) -> None:
    model = ScriptedChatModel(calls=[("bash", {"command": "touch started; sleep 3600"})])
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        graph = await graph_of(toolbox, model)
        run = asyncio.ensure_future(
            graph.ainvoke({"messages": [("user", "sleep")]}, {"configurable": {"thread_id": "c"}})
        )
        for _ in range(600):  # a hang guard: the command starts within a second or two
            if (workspace / "started").exists():
                break
            await asyncio.sleep(0.05)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        after = await toolbox.call("bash", {"command": "echo after"})  # S2: after the sleep
    assert after.text.startswith("after\n")


@pytest.mark.spec("A3", "A1")
def test_A3_blocking_tools_from_threads(daemon: Daemon, workspace: Path) -> None:
    (workspace / "b.txt").write_text("one\n")
    with Client(runtime_dir=daemon.runtime) as client, Toolbox(client, workspace) as toolbox:
        by_name = {t.name: t for t in blocking_tools(toolbox)}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            reads = list(pool.map(lambda _: by_name["read"].invoke({"path": "b.txt"}), range(4)))
        edited = by_name["edit"].invoke({"path": "b.txt", "old_string": "one", "new_string": "two"})
    assert all("one" in r for r in reads)
    assert "b.txt" in edited
    assert (workspace / "b.txt").read_text() == "two\n"
