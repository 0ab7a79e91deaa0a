"""toolpool's tools as OpenAI Agents SDK function tools (SPEC A3; ``toolpool[openai-agents]``).

    async with AsyncClient() as client, AsyncToolbox(client, ".", gate="ask") as toolbox:
        agent = Agent(name="coder", model=model, tools=await function_tools(toolbox))
        result = await Runner.run(agent, "Fix the typo in README.md")

Each tool is a ``FunctionTool`` whose invocation is a call in the toolbox's session
(read-before-write, the breaker, the gate and the profile hold across the agent's
calls and runs); its output is the result's text (a failure's text, which the model
reads; images as ``ToolOutputImage``). The gate is the SDK's approval: a tool whose
calls the session's gate would ask about ``needs_approval``, so the run stops with
an interruption; a call the SDK approved (``state.approve(item)``) is approved at
the gate, one it rejected never reaches toolpool. Cancelling the run cancels its
calls in the daemon. The SDK has no channel for a tool's progress: reports go to
the toolbox's ``on_progress``.
"""

from __future__ import annotations

import json
from typing import Any

from toolpool.integrations import require

require("agents", "openai-agents", "openai_agents")

from agents import FunctionTool, RunContextWrapper, ToolOutputImage, ToolOutputText  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

from toolpool.client.toolbox import AsyncToolbox, ToolDefinition, gate_asks  # noqa: E402
from toolpool.models import ImageBlock, TextBlock, ToolResult  # noqa: E402

__all__ = ["function_tool", "function_tools"]


async def function_tools(toolbox: AsyncToolbox) -> list[FunctionTool]:
    """Every tool of the toolbox's session, as the SDK's function tools."""
    return [function_tool(toolbox, d) for d in await toolbox.definitions()]


def function_tool(toolbox: AsyncToolbox, tool: ToolDefinition) -> FunctionTool:
    """One tool of the toolbox's session as a ``FunctionTool``."""
    asks = gate_asks(toolbox.options, tool)

    async def needs_approval(
        ctx: RunContextWrapper[Any], arguments: dict[str, Any], _: str
    ) -> bool:
        return asks

    async def invoke(ctx: ToolContext[Any], text: str) -> Any:
        try:
            arguments = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            return f"Invalid arguments for tool {tool.name!r}: not JSON ({exc})"
        # Invoked after the SDK's approval when one was needed: the gate's question is
        # that approval's (else the toolbox's on_approval answers it).
        approved = (lambda request: True) if asks else None
        result = await toolbox.call(tool.name, arguments, on_approval=approved)
        return output(result)

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=tool.schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,  # toolpool checks the arguments (P5)
        needs_approval=needs_approval,
    )


def output(result: ToolResult) -> Any:
    """What the model reads: the text, or text and image outputs."""
    if all(isinstance(block, TextBlock) for block in result.content):
        return result.text
    return [
        ToolOutputText(text=block.text)
        if isinstance(block, TextBlock)
        else ToolOutputImage(image_url=f"data:{block.media_type};base64,{block.data}")
        for block in result.content
        if isinstance(block, TextBlock | ImageBlock)
    ]
