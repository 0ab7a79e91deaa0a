"""toolpool's tools as LangChain tools and a LangGraph tool node (SPEC A3;
``toolpool[langchain]``).

    async with AsyncClient() as client, AsyncToolbox(client, ".", gate="ask") as toolbox:
        node = await tool_node(toolbox)        # ToolNode(await tools(toolbox))
        model = chat_model.bind_tools(await tools(toolbox))
        ...                                    # the graph: model ⇄ node

Each tool is a ``StructuredTool`` whose call is a call in the toolbox's session
(read-before-write, the breaker, the gate and the profile hold across the graph's
calls); with an ``AsyncToolbox`` it runs on the event loop (``ainvoke``), with a
``Toolbox`` from a thread (``invoke``). A failure is a ``ToolMessage`` of status
"error" whose text the model reads. The gate is LangGraph's human in the loop: a call
the session's gate would ask about first calls ``interrupt()`` with the tool's name
and arguments (the graph needs a checkpointer); resumed with
``Command(resume=True)`` (or ``{"approved": True}``) it runs, approved; resumed with
anything else it does not, and the model reads why. Progress reports go to the
graph's custom stream (``stream_mode="custom"``: ``{"toolpool_progress": …}``).
Cancelling the graph's task cancels its calls in the daemon.
"""

from __future__ import annotations

from typing import Any

from toolpool.integrations import require

require("langchain_core", "langchain", "langchain")

from langchain_core.tools import StructuredTool, ToolException  # noqa: E402

from toolpool.client.toolbox import (  # noqa: E402
    AsyncToolbox,
    Toolbox,
    ToolDefinition,
    gate_asks,
)
from toolpool.models import ToolResult  # noqa: E402
from toolpool.providers.langchain import message_content  # noqa: E402

__all__ = ["tool_node", "tools"]


async def tools(toolbox: AsyncToolbox) -> list[StructuredTool]:
    """Every tool of the toolbox's session, as LangChain tools run on the loop."""
    return [structured_tool(toolbox, d) for d in await toolbox.definitions()]


def blocking_tools(toolbox: Toolbox) -> list[StructuredTool]:
    """Every tool of a blocking toolbox's session, as LangChain tools run in threads."""
    return [structured_tool(toolbox, d) for d in toolbox.definitions()]


async def tool_node(toolbox: AsyncToolbox) -> Any:
    """A LangGraph ``ToolNode`` of the session's tools (needs ``langgraph``)."""
    prebuilt = require("langgraph.prebuilt", "langchain", "langchain")
    return prebuilt.ToolNode(await tools(toolbox))


def structured_tool(toolbox: AsyncToolbox | Toolbox, tool: ToolDefinition) -> StructuredTool:
    """One tool of the toolbox's session as a ``StructuredTool``."""
    asks = gate_asks(toolbox.options, tool)

    def approved(arguments: dict[str, Any]) -> str | None:
        """None when the call may go on; else why not (LangGraph's interrupt)."""
        if not asks:
            return None
        from langgraph.types import interrupt

        answer = interrupt({"tool": tool.name, "arguments": arguments, "toolpool": "approval"})
        if answer is True or (isinstance(answer, dict) and answer.get("approved") is True):
            return None
        reason = answer.get("reason") if isinstance(answer, dict) else None
        return str(reason or f'The user did not allow "{tool.name}".')

    def on_approval(request: Any) -> bool:
        return True  # asked before the call, by interrupt(): this is that answer

    gate = on_approval if asks else None

    async def acall(**arguments: Any) -> Any:
        refused = approved(arguments)
        if refused is not None:
            raise ToolException(refused)
        assert isinstance(toolbox, AsyncToolbox)
        return output(
            await toolbox.call(tool.name, arguments, on_progress=_progress, on_approval=gate)
        )

    def call(**arguments: Any) -> Any:
        refused = approved(arguments)
        if refused is not None:
            raise ToolException(refused)
        assert isinstance(toolbox, Toolbox)
        return output(toolbox.call(tool.name, arguments, on_progress=_progress, on_approval=gate))

    blocking = isinstance(toolbox, Toolbox)
    return StructuredTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.schema,
        func=call if blocking else None,
        coroutine=None if blocking else acall,
        handle_tool_error=True,  # a ToolException is the model's to read
    )


def _progress(data: Any) -> None:
    try:
        from langgraph.config import get_stream_writer

        get_stream_writer()({"toolpool_progress": data})
    except (ImportError, RuntimeError):
        pass  # not in a graph: nobody to tell


def output(result: ToolResult) -> Any:
    """What the model reads: the text, or content blocks with images; a failure is
    raised as a ToolException (a ToolMessage of status "error")."""
    if result.is_error:
        raise ToolException(result.text)
    return message_content(result)
