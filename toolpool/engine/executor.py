"""The executor interface: where P10's innermost step — running the tool — happens.

The pipeline and scheduler only ever see this interface. ``InProcessExecutor`` runs
tools in this process, for tests and debugging; the worker pool runs them in
sandboxed worker processes (SPEC D1, D2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolpool.models import ToolCall, ToolResult
from toolpool.registry import ToolSpec
from toolpool.tool import ToolContext


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """One call ready to run: validated, coerced arguments; approved by the gate.

    ``context.cancel_token`` fires when the call must stop; ``context.progress``
    turns reports into ``tool_update`` events. ``limits`` are the session's resource
    limit overrides (``toolpool.sandbox.Limits`` field names).
    """

    spec: ToolSpec
    call: ToolCall
    context: ToolContext
    limits: Mapping[str, Any] = field(default_factory=dict)  # the session's overrides


class Executor(Protocol):
    """Runs one call and always answers with a result.

    Contract: never raise for a tool's failure (return an error result); when the
    cancel token fires, stop the call and answer promptly with a cancelled result
    (``toolpool.outcomes.cancelled_result``) unless the tool finished anyway.
    """

    async def execute(self, request: ExecutionRequest) -> ToolResult: ...
