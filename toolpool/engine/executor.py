"""The executor interface: where a call's tool code runs — its ``validate`` (P6), its
``preview`` (P7) and its ``execute`` (P10).

The pipeline and scheduler only ever see this interface. ``InProcessExecutor`` runs
tools in this process, for tests and debugging; the worker pool runs them in
sandboxed worker processes (SPEC D1, D2), so that nothing whose cost grows with a
tool's input runs in the daemon (L10).

A call that no gate and no middleware stands between is one ``submit`` of stage
``FULL``: validate, preview (``on_preview``, before execution starts), execute, in
one dispatch. Otherwise a ``submit`` of stage ``PREPARE`` runs validate and preview,
the gate decides, and one of stage ``EXECUTE`` runs the tool alone.

The interface is callbacks, not coroutines: a call's life in the daemon is a small
state machine, without a task per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolpool.models import Stage, ToolCall, ToolResult
from toolpool.outcomes import cancelled_result, result_from_exception
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


Done = Callable[[ToolResult | None], None]


class Executor(Protocol):
    """Runs a call's tool code and always answers, exactly once, through ``done``.

    ``submit`` returns at once; ``done(result)`` is called later from the event
    loop's thread (or before ``submit`` returns, for an answer known at once). Stage
    ``FULL`` runs validate and preview first, ``EXECUTE`` the tool alone, and
    ``PREPARE`` validate and preview alone: ``done(None)`` when validate passed and
    the preview (if any) went to ``on_preview``, else the call's result (a refusal, a
    failed preview, a cancel, a lost worker). The other stages always give a result.

    Contract: never raise for a tool's failure (answer an error result); when the
    cancel token fires, stop the call and answer promptly with a cancelled result
    (``toolpool.outcomes.cancelled_result``) unless the tool finished anyway. A
    refusal by validate, or a preview that raised, is the call's result
    (``toolpool.preflight``): the tool does not execute.
    """

    def submit(self, request: ExecutionRequest, done: Done) -> None: ...


async def submitted(executor: Executor, request: ExecutionRequest) -> ToolResult | None:
    """``executor.submit`` awaited: where a coroutine needs the answer (a middleware's
    ``call_next``, a gate's slow path)."""
    future: asyncio.Future[ToolResult | None] = asyncio.get_running_loop().create_future()

    def done(result: ToolResult | None) -> None:
        if not future.done():
            future.set_result(result)

    executor.submit(request, done)
    return await future


def outcome_of(
    request: ExecutionRequest, finished: asyncio.Future[ToolResult | None]
) -> ToolResult | None:
    """What a finished task of a call answers: its result; the cancelled result when
    the task was cancelled; the exception it broke on, as an error result."""
    if finished.cancelled():
        token = request.context.cancel_token
        return cancelled_result(request.call, token.source, token.cause)
    exc = finished.exception()
    return result_from_exception(request.call, exc) if exc is not None else finished.result()
