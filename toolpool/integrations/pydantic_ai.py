"""toolpool's tools as a pydantic-ai toolset (SPEC A3; ``toolpool[pydantic-ai]``).

    async with AsyncClient() as client, AsyncToolbox(client, ".", gate="ask") as toolbox:
        agent = Agent(model, toolsets=[ToolpoolToolset(toolbox)],
                      output_type=[str, DeferredToolRequests])
        result = await agent.run("Fix the typo in README.md")

Every call the model makes goes through the toolbox's session, so read-before-write,
the breaker, the gate and the profile hold across the agent's calls and runs. A
result is the tool's text (images as ``BinaryContent``; a failure's text, which the
model reads). Progress reports are emitted into the run's event stream as
``ToolpoolProgress`` events. The gate is pydantic-ai's human-in-the-loop approval:
a call the gate asks about raises ``ApprovalRequired`` (the run ends with
``DeferredToolRequests``, the label and the preview in its metadata); the run
resumed with that call approved (``DeferredToolResults``) runs it, approved.
Cancelling the run cancels its calls in the daemon.
"""

from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass
from typing import Any

from toolpool.integrations import require

require("pydantic_ai", "pydantic-ai", "pydantic_ai")

from pydantic_ai import ApprovalRequired, BinaryContent, CustomEvent, RunContext  # noqa: E402
from pydantic_ai.exceptions import UserError  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset  # noqa: E402
from pydantic_ai.toolsets.abstract import ToolsetTool  # noqa: E402
from pydantic_ai.toolsets.external import TOOL_SCHEMA_VALIDATOR  # noqa: E402

from toolpool.client.core import ApprovalRequested  # noqa: E402
from toolpool.client.toolbox import AsyncToolbox  # noqa: E402
from toolpool.models import ImageBlock, TextBlock, ToolResult  # noqa: E402

__all__ = ["ToolpoolProgress", "ToolpoolToolset"]


@dataclass(kw_only=True)
class ToolpoolProgress(CustomEvent):
    """A progress report of a running call (a command's output as it comes)."""

    report: Any = None


class ToolpoolToolset(AbstractToolset[Any]):
    """The session's tools (the toolbox's), for ``Agent(toolsets=[...])``. Arguments
    are checked by toolpool (P5), not here: a bad one is a result the model reads."""

    def __init__(self, toolbox: AsyncToolbox, *, id: str | None = "toolpool") -> None:
        self.toolbox = toolbox
        self._id = id

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            d.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=d.name, parameters_json_schema=d.schema, description=d.description
                ),
                max_retries=0,
                args_validator=TOOL_SCHEMA_VALIDATOR,
            )
            for d in await self.toolbox.definitions()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        asked: list[ApprovalRequested] = []

        def approval(request: ApprovalRequested) -> tuple[bool, str] | bool:
            if ctx.tool_call_approved:
                return True  # the run was resumed with this call approved
            asked.append(request)
            return False, "awaiting approval"

        async def progress(data: Any) -> None:
            with contextlib.suppress(UserError):  # a run without an event stream
                await ctx.emit(ToolpoolProgress(report=data))

        result = await self.toolbox.call(
            name, tool_args, on_progress=progress, on_approval=approval
        )
        if asked:
            request = asked[0]
            raise ApprovalRequired({"label": request.label, "preview": request.preview})
        return content(result)


def content(result: ToolResult) -> Any:
    """What the model reads: the text, or the text and images as ``BinaryContent``."""
    if all(isinstance(block, TextBlock) for block in result.content):
        return result.text
    return [
        block.text
        if isinstance(block, TextBlock)
        else BinaryContent(base64.b64decode(block.data), media_type=block.media_type)
        for block in result.content
        if isinstance(block, TextBlock | ImageBlock)
    ]
