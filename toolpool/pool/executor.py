"""The executor that runs calls on the worker pool (SPEC D1, D2).

It replaces the in-process executor without any change to the pipeline or the
scheduler: it turns an ExecutionRequest into an ``Execute`` message (with the limits
of the call, the register stamps of the files it names and the stage: validate and
preview run in the worker too, SPEC L10), and the pool's outcome back into a
ToolResult.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.engine.executor import Done, ExecutionRequest, outcome_of
from toolpool.file_reads import FileReadRegister, apply_changes
from toolpool.models import ErrorCode, Stage, ToolCall, ToolResult
from toolpool.outcomes import cancelled_result
from toolpool.pool.pool import WorkerPool
from toolpool.pool.workers import OutcomeStatus, PoolOutcome
from toolpool.protocol import CallContext, Execute
from toolpool.sandbox.limits import Limits


class PoolExecutor:
    """Runs calls on ``pool``.

    A call's limits are the pool's defaults, then what the tool asks for this call
    (``call_limits``), then the operator's ``tool_limits[name]``, then the session's
    overrides — later layers win.
    """

    def __init__(
        self, pool: WorkerPool, *, tool_limits: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        self.pool = pool
        self.tool_limits = {name: dict(v) for name, v in (tool_limits or {}).items()}

    def limits_for(self, request: ExecutionRequest) -> Limits:
        limits = self.pool.config.limits
        for layer in (
            request.spec.call_limits(request.call.arguments),
            self.tool_limits.get(request.spec.name),
            request.limits,
        ):
            limits = limits.merged(layer)
        return limits

    def submit(self, request: ExecutionRequest, done: Done) -> None:
        task = asyncio.ensure_future(self._answer(request))
        task.add_done_callback(lambda finished: done(outcome_of(request, finished)))

    async def _answer(self, request: ExecutionRequest) -> ToolResult | None:
        """The call's result; None for a "prepare" whose validate passed."""
        result, outcome = await self._run(request)
        return None if outcome is not None and outcome.status is OutcomeStatus.PREPARED else result

    async def _run(self, request: ExecutionRequest) -> tuple[ToolResult, PoolOutcome | None]:
        spec, call, ctx = request.spec, request.call, request.context
        try:
            limits = self.limits_for(request)
        except (ValueError, TypeError) as exc:
            error = ToolResult.error(call, ErrorCode.EXECUTION_FAILED, f"Invalid limits: {exc}")
            return error, None
        network = limits.network or ctx.allow_network
        stamps = {}
        for path in spec.file_paths(call.arguments, ctx):
            stamp = ctx.files.get(path)
            if stamp is not None:
                stamps[FileReadRegister.key(path)] = stamp.to_dict()
        context = CallContext(
            session_id=ctx.session_id,
            workspace=str(ctx.workspace),
            extra_roots=tuple(str(p) for p in ctx.extra_roots),
            allow_network=network,
            scratch_dir=None if ctx.scratch_dir is None else str(ctx.scratch_dir),
        )
        message = Execute(
            call.id,
            call.name,
            call.arguments,
            context,
            limits.to_dict(),
            stamps,
            self.pool.ticket(),
            request.stage,
        )
        # Only validate and preview would run: no more read-only than they are.
        holdable = request.stage is not Stage.PREPARE and spec.read_only(call.arguments)
        outcome = await self.pool.run(
            message,
            network=network,
            token=ctx.cancel_token,
            on_progress=ctx.progress,
            limits=limits,
            holdable=holdable,
            on_preview=request.on_preview,
        )
        apply_changes(ctx.files, outcome.stamps)
        return self._result(call, outcome, ctx.cancel_token), outcome

    @staticmethod
    def _result(call: ToolCall, outcome: PoolOutcome, token: CancelToken) -> ToolResult:
        details: dict[str, Any] = {}
        if outcome.usage:
            details["usage"] = outcome.usage
        if outcome.worker_id:
            details["worker"] = outcome.worker_id
        if outcome.worker_pid:
            details["worker_pid"] = outcome.worker_pid
        if outcome.escalation:
            details["escalation"] = outcome.escalation.value
        match outcome.status:
            case OutcomeStatus.UNSTARTED | OutcomeStatus.CANCELLED:
                result = cancelled_result(call, token.source, token.cause)
            case OutcomeStatus.LOST:
                details["cause"] = outcome.cause
                result = ToolResult.error(
                    call,
                    ErrorCode.WORKER_LOST,
                    f"The worker process running this tool was lost: {outcome.cause}. "
                    "Nothing else was affected; the tool may be retried.",
                )
            case OutcomeStatus.LIMIT:
                details["cause"] = outcome.cause
                result = ToolResult.error(
                    call,
                    ErrorCode.LIMIT_EXCEEDED,
                    f"The tool ran past its {outcome.cause} and was stopped.",
                )
            case OutcomeStatus.PREPARED:  # validate passed: no result of its own yet
                return ToolResult(call.id, call.name, ())
            case _:
                assert outcome.result is not None
                result = ToolResult.from_dict(outcome.result)
        if details:
            result = ToolResult(
                result.call_id,
                result.tool_name,
                result.content,
                result.is_error,
                result.error_code,
                {**result.details, **details},
            )
        return result
