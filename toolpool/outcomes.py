"""How the ends of a call become ToolResults: the texts the model reads.

Shared by the coordinator (early ends) and every executor (in-process, worker), so
a cancelled call reads the same wherever it ran.
"""

from __future__ import annotations

import traceback
from typing import Any

from toolpool.cancel import Cancelled, CancelSource
from toolpool.errors import ToolError
from toolpool.models import ErrorCode, ToolCall, ToolResult
from toolpool.tool import to_content

CANCELLED_MESSAGE = "Tool execution cancelled."
SKIPPED_MESSAGE = "Skipped due to queued user message."
INTERRUPTED_MESSAGE = "Tool execution interrupted by a queued user message."


def cancelled_result(call: ToolCall, source: CancelSource | None) -> ToolResult:
    """The result of a call stopped by ``source`` while it ran (S4, S5)."""
    if source is CancelSource.INTERRUPT:
        return ToolResult.error(call, ErrorCode.INTERRUPTED, INTERRUPTED_MESSAGE)
    return ToolResult.error(call, ErrorCode.CANCELLED, CANCELLED_MESSAGE)


def never_started_result(call: ToolCall, source: CancelSource | None) -> ToolResult:
    """The result of a call that was still queued when the turn stopped (S4, S5, P1)."""
    if source is CancelSource.INTERRUPT:
        return ToolResult.error(call, ErrorCode.SKIPPED, SKIPPED_MESSAGE)
    return ToolResult.error(call, ErrorCode.CANCELLED, CANCELLED_MESSAGE)


def result_from_output(call: ToolCall, output: Any) -> ToolResult:
    """A successful execution's result."""
    return ToolResult(call_id=call.id, tool_name=call.name, content=to_content(output))


def result_from_exception(call: ToolCall, exc: BaseException) -> ToolResult:
    """A failed execution's result.

    A ToolError carries its own clean message; any other exception reads as
    "Type: message", with the raising frame kept in the details for humans.
    """
    if isinstance(exc, Cancelled):
        return cancelled_result(call, exc.source)
    if isinstance(exc, ToolError):
        code = ErrorCode(exc.code) if exc.code else ErrorCode.EXECUTION_FAILED
        return ToolResult.error(call, code, exc.message, dict(exc.details))
    details: dict[str, Any] = {"exception": type(exc).__name__}
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        details["location"] = f"{frames[-1].filename}:{frames[-1].lineno}"
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ToolResult.error(call, ErrorCode.EXECUTION_FAILED, message, details)
