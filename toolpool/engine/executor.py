"""The executor interface: where a call's tool code runs — its ``validate`` (P6), its
``preview`` (P7) and its ``execute`` (P10).

The pipeline and scheduler only ever see this interface. ``InProcessExecutor`` runs
tools in this process, for tests and debugging; the worker pool runs them in
sandboxed worker processes (SPEC D1, D2), so that nothing whose cost grows with a
tool's input runs in the daemon (L10).

A call that no gate and no middleware stands between is one ``execute`` of stage
``FULL``: validate, preview (``on_preview``, before execution starts), execute, in
one dispatch. Otherwise ``prepare`` runs validate and preview, the gate decides, and
``execute`` of stage ``EXECUTE`` runs the tool alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolpool.models import Stage, ToolCall, ToolResult
from toolpool.registry import ToolSpec
from toolpool.tool import ToolContext

# P7's preview as it reaches the pipeline: its text (or JSON-able value), and whether
# it was cut at its cap.
PreviewSink = Callable[[Any, bool], None]


def _no_preview(_: Any, __: bool) -> None:
    pass


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """One call ready for its tool: validated, coerced arguments (P5).

    ``context.cancel_token`` fires when the call must stop; ``context.progress``
    turns reports into ``tool_update`` events. ``limits`` are the session's resource
    limit overrides (``toolpool.sandbox.Limits`` field names). ``stage`` says which
    of validate, preview and execute to run; ``on_preview`` takes the preview, when
    the tool makes one, before the tool executes.
    """

    spec: ToolSpec
    call: ToolCall
    context: ToolContext
    limits: Mapping[str, Any] = field(default_factory=dict)  # the session's overrides
    stage: Stage = Stage.EXECUTE
    on_preview: PreviewSink = _no_preview


class Executor(Protocol):
    """Runs a call's tool code and always answers with a result.

    Contract: never raise for a tool's failure (return an error result); when the
    cancel token fires, stop the call and answer promptly with a cancelled result
    (``toolpool.outcomes.cancelled_result``) unless the tool finished anyway. A
    refusal by validate, or a preview that raised, is the call's result
    (``toolpool.preflight``): the tool does not execute.
    """

    async def execute(self, request: ExecutionRequest) -> ToolResult:
        """The call's result; stage ``FULL`` runs validate and preview first."""
        ...

    async def prepare(self, request: ExecutionRequest) -> ToolResult | None:
        """P6 and P7 alone: None when validate passed and the preview (if any) went
        to ``on_preview``; otherwise the call's result (a refusal, a failed preview,
        a cancel, a lost worker)."""
        ...
