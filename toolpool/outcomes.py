"""How the ends of a call become ToolResults: the texts the model reads.

Shared by the coordinator (early ends) and every executor (in-process, worker), so
a cancelled call reads the same wherever it ran.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from toolpool.cancel import Cancelled, CancelSource
from toolpool.errors import ToolError
from toolpool.models import ErrorCode, ToolCall, ToolResult, new_tool_result
from toolpool.tool import ToolOutput, to_content

log = logging.getLogger("toolpool.tools")

CANCELLED_MESSAGE = "Tool execution cancelled."
# The most of a failed tool's traceback its result's details carry.
TRACEBACK_CHARS = 16 * 1024
SKIPPED_MESSAGE = "Skipped due to queued user message."
INTERRUPTED_MESSAGE = "Tool execution interrupted by a queued user message."

# details["skipped_because"]["reason"] of a call that was skipped or cancelled.
_REASONS = {
    CancelSource.INTERRUPT: "interrupt",
    CancelSource.ABORT: "abort",
    CancelSource.SHUTDOWN: "abort",  # the daemon's drain ends in an abort
    CancelSource.SIBLING: "sibling_failed",
}


def skipped_because(reason: str, call_id: str | None = None) -> dict[str, Any]:
    """The machine-readable why of a skipped or cancelled call: ``reason`` is
    "sibling_failed", "interrupt", "abort" or "breaker"; ``call_id`` the call whose
    failure caused it (None for a stop the user asked for)."""
    return {"skipped_because": {"call_id": call_id, "reason": reason}}


def failed(result: ToolResult) -> bool:
    """The call failed of its own: an error that no stop, breaker or sibling made."""
    return result.is_error and "skipped_because" not in result.details


def _stopped(
    call: ToolCall, code: ErrorCode, text: str, source: CancelSource | None, cause: str | None
) -> ToolResult:
    reason = _REASONS[source or CancelSource.ABORT]
    return ToolResult.error(call, code, text, skipped_because(reason, cause))


def cancelled_result(
    call: ToolCall, source: CancelSource | None, cause: str | None = None
) -> ToolResult:
    """The result of a call stopped by ``source`` while it ran (S4, S5, S7)."""
    if source is CancelSource.INTERRUPT:
        return _stopped(call, ErrorCode.INTERRUPTED, INTERRUPTED_MESSAGE, source, cause)
    if source is CancelSource.SIBLING:
        text = f"Tool execution cancelled: call {cause} of the same turn failed."
        return _stopped(call, ErrorCode.CANCELLED, text, source, cause)
    return _stopped(call, ErrorCode.CANCELLED, CANCELLED_MESSAGE, source, cause)


def never_started_result(
    call: ToolCall, source: CancelSource | None, cause: str | None = None
) -> ToolResult:
    """The result of a call that was still queued when the turn stopped (S4, S5, S7, P1)."""
    if source is CancelSource.INTERRUPT:
        return _stopped(call, ErrorCode.SKIPPED, SKIPPED_MESSAGE, source, cause)
    if source is CancelSource.SIBLING:
        text = f"Skipped: call {cause} of the same turn failed."
        return _stopped(call, ErrorCode.SKIPPED, text, source, cause)
    return _stopped(call, ErrorCode.CANCELLED, CANCELLED_MESSAGE, source, cause)


def result_from_output(call: ToolCall, output: Any) -> ToolResult:
    """A successful execution's result (a ``ToolOutput``'s details its details)."""
    if isinstance(output, ToolOutput):
        content = to_content(output.content)
        return ToolResult(call.id, call.name, content, details=dict(output.details))
    return new_tool_result(call.id, call.name, to_content(output), False, None, {})


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
    # The whole traceback for whoever debugs the tool — in the details, not the
    # model's text — its end kept when it is long (the raising frames are there).
    details["traceback"] = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
    log.warning("call %s: the tool %r raised", call.id, call.name, exc_info=exc)
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ToolResult.error(call, ErrorCode.EXECUTION_FAILED, message, details)
