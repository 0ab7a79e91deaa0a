"""The executor that runs calls on the worker pool (SPEC D1, D2).

It replaces the in-process executor without any change to the pipeline or the
scheduler: it turns an ExecutionRequest into an ``Execute`` message (with the limits
of the call, the register stamps of the files it names and the stage: validate and
preview run in the worker too, SPEC L10), submits it to the pool, and turns the
pool's outcome into the call's ToolResult — no task and no future per call.

What is the same for every call of a session is made once: its ``CallContext``, a
tool's merged limits when the tool asks for none of its own for the call, and the
part of the ``Execute`` frame those two make (``ExecuteFrames``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.engine.executor import Done, ExecutionRequest
from toolpool.file_reads import FileReadRegister, apply_changes
from toolpool.models import ErrorCode, Stage, TextBlock, ToolCall, ToolResult
from toolpool.outcomes import cancelled_result
from toolpool.pool.pool import WorkerPool
from toolpool.pool.workers import OutcomeStatus, PoolOutcome
from toolpool.protocol import CallContext, ExecuteFrames
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.session_box import SandboxStartError
from toolpool.tool import ToolContext

log = logging.getLogger("toolpool.pool")

# How much of what was wrong with an unreadable answer its result and the log say.
UNREADABLE_CHARS = 200
# Entries past this many are dropped at once: the caches hold what sessions share,
# and a daemon opens and closes sessions for ever.
_CACHE_MAX = 1024


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
        # (tool, id of the session's overrides) → (those overrides, the limits and
        # their wire form). The overrides are kept, so their id names them alone
        # while the entry lives; a session's overrides never change.
        self._limits: dict[tuple[str, int], tuple[Mapping[str, Any], Limits, dict[str, Any]]] = {}
        # (session id, network) → what the context was made of, and the context.
        self._contexts: dict[tuple[str, bool], tuple[tuple[Any, ...], CallContext]] = {}
        self._mounting: set[asyncio.Task[None]] = set()  # workspace overlays being made
        # (id of a context, id of limits' wire form) → their Execute frames' shared part.
        self._encoded: dict[tuple[int, int], ExecuteFrames] = {}

    def _merged(self, request: ExecutionRequest) -> tuple[Limits, dict[str, Any]]:
        spec, overrides = request.spec, request.limits
        own = spec.call_limits(request.call.arguments) if spec.has_call_limits else None
        key = (spec.name, id(overrides))
        if not own:
            cached = self._limits.get(key)
            if cached is not None and cached[0] is overrides:
                return cached[1], cached[2]
        limits = self.pool.config.limits
        for layer in (own, self.tool_limits.get(spec.name), overrides):
            limits = limits.merged(layer)
        wire = limits.to_dict()
        if not own:
            if len(self._limits) >= _CACHE_MAX:
                self._limits.clear()
            self._limits[key] = (overrides, limits, wire)
        return limits, wire

    def _context(
        self, ctx: ToolContext, network: bool, view: str = "", egress: str = ""
    ) -> CallContext:
        """The session's context as it crosses the wire, made once per session (and
        once more when its workspace's view is mounted)."""
        key = (ctx.session_id, network)
        cached = self._contexts.get(key)
        if cached is not None:
            # The session hands every call the same objects: another session of the
            # same id (a new one, after the first closed) hands others.
            workspace, extra_roots, scratch_dir, made_view, made_egress = cached[0]
            if (
                workspace is ctx.workspace
                and extra_roots is ctx.extra_roots
                and scratch_dir is ctx.scratch_dir
                and made_view == view
                and made_egress == egress
            ):
                return cached[1]
        made_of = (ctx.workspace, ctx.extra_roots, ctx.scratch_dir, view, egress)
        context = CallContext(
            session_id=ctx.session_id,
            workspace=str(ctx.workspace),
            extra_roots=tuple(str(p) for p in ctx.extra_roots),
            allow_network=network,
            persistent_shell=ctx.persistent_shell,
            root=ctx.root,
            layer_bytes=ctx.layer_bytes,
            image=ctx.image,
            workspace_overlay=ctx.workspace_overlay,
            workspace_view=view,
            scratch_dir=None if ctx.scratch_dir is None else str(ctx.scratch_dir),
            tool_profile=ctx.tool_profile,
            egress=egress,
        )
        if len(self._contexts) >= _CACHE_MAX:
            self._contexts.clear()
        self._contexts[key] = (made_of, context)
        return context

    def _frames(self, context: CallContext, wire: dict[str, Any]) -> ExecuteFrames:
        """The Execute frames of calls with this context and these limits (both made
        once, and kept: their ids name them while the entry lives)."""
        key = (id(context), id(wire))
        frames = self._encoded.get(key)
        if frames is None or frames.context is not context or frames.limits is not wire:
            if len(self._encoded) >= _CACHE_MAX:
                self._encoded.clear()
            frames = self._encoded[key] = ExecuteFrames(context, wire)
        return frames

    def submit(self, request: ExecutionRequest, done: Done) -> None:
        spec, call, ctx = request.spec, request.call, request.context
        try:
            limits, wire = self._merged(request)
        except (ValueError, TypeError) as exc:
            done(ToolResult.error(call, ErrorCode.EXECUTION_FAILED, f"Invalid limits: {exc}"))
            return
        network = limits.network or ctx.allow_network
        egress = ""
        if ctx.network_policy is not None and not network:  # N3: through its proxy
            egress = self.pool.egress.register(ctx.session_id, ctx.network_policy)
        view = ""
        if ctx.workspace_overlay:
            mounted = self.pool.shells.sandboxes.mounted_view(ctx.session_id)
            if mounted is None:
                self._mount_view(request, done, self._context(ctx, network, "", egress))
                return
            view = str(mounted)
            ctx.workspace_view = mounted  # the paths named below are the view's
        stamps = {}
        if spec.has_file_paths:
            for path in spec.file_paths(call.arguments, ctx):
                key = FileReadRegister.key(path)
                stamp = ctx.files.at_key(key)
                if stamp is not None:
                    stamps[key] = stamp.to_dict()
        pool = self.pool
        frames = self._frames(self._context(ctx, network, view, egress), wire)
        ticket = pool.ticket()
        execute = frames.execute(call.id, call.name, call.arguments, stamps, ticket, request.stage)
        token = ctx.cancel_token

        def finished(outcome: PoolOutcome) -> None:
            try:
                if outcome.stamps:
                    apply_changes(ctx.files, outcome.stamps)
                if outcome.status is OutcomeStatus.PREPARED:
                    result = None  # validate passed: no result of its own yet
                elif egress:
                    refused = self.pool.egress.refused(ctx.session_id, call.id)
                    result = with_refusals(self._result(call, outcome, token), refused)
                else:
                    result = self._result(call, outcome, token)
            except Exception as exc:  # the call still ends: never a turn left waiting
                result = unreadable(call, outcome, exc)
            done(result)

        pool.submit(
            execute,
            network=network,
            token=token,
            on_progress=ctx.progress,
            limits=limits,
            done=finished,
            # Only validate and preview would run: no more read-only than they are.
            holdable=request.stage is not Stage.PREPARE and spec.read_only(call.arguments),
            on_preview=request.on_preview,
            binding=spec.binding,  # a session's shipped tool: its own workers (A6)
        )

    def _mount_view(self, request: ExecutionRequest, done: Done, context: CallContext) -> None:
        """The session's workspace overlay mounted (V14) off the event loop, then the
        call submitted; a mount that fails is the call's ``sandbox_failed``."""

        async def mount() -> None:
            try:
                await self.pool.shells.sandboxes.workspace_view(context)
            except SandboxStartError as exc:
                done(ToolResult.error(request.call, ErrorCode.SANDBOX_FAILED, exc.message))
                return
            self.submit(request, done)

        task = asyncio.get_running_loop().create_task(mount())
        self._mounting.add(task)
        task.add_done_callback(self._mounting.discard)

    @staticmethod
    def _result(call: ToolCall, outcome: PoolOutcome, token: CancelToken) -> ToolResult:
        """The call's ToolResult, made once."""
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
            case OutcomeStatus.PREPARED:  # validate passed: no result of its own yet
                return ToolResult(call.id, call.name, ())
            case OutcomeStatus.OK | OutcomeStatus.ERROR:
                assert outcome.result is not None
                return ToolResult.from_dict(outcome.result, details)
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
            case OutcomeStatus.FAILED:  # the pool cannot run calls: an error to the model
                return ToolResult.error(
                    call,
                    ErrorCode.EXECUTION_FAILED,
                    f"PoolError: {outcome.cause}",
                    {"exception": "PoolError"},
                )
        if details:
            return ToolResult(
                result.call_id,
                result.tool_name,
                result.content,
                result.is_error,
                result.error_code,
                {**result.details, **details},
            )
        return result


def unreadable(call: ToolCall, outcome: PoolOutcome, exc: Exception) -> ToolResult:
    """The result of a call whose worker answered what cannot be read (a tool wrote
    to its worker's socket): an error, as for a worker that crashed (SPEC D2)."""
    worker = outcome.worker_id
    # What was wrong, cut short: the exception may quote what the tool sent (a
    # content block's type of any length, up to a frame's size).
    what = f"{type(exc).__name__}: {str(exc)[:UNREADABLE_CHARS]}"
    log.error("call %s: the answer of worker %s could not be read (%s)", call.id, worker, what)
    return ToolResult.error(
        call,
        ErrorCode.EXECUTION_FAILED,
        f"The worker's answer for this call could not be read ({what}).",
        {"worker": worker} if worker else {},
    )


def with_refusals(result: ToolResult, refused: list[dict[str, Any]]) -> ToolResult:
    """A policy session's call result, saying which connections its proxy refused
    (N7): in ``details.network_refused`` and in a line the model reads."""
    if not refused:
        return result
    named = "; ".join(f"{r['host']}:{r['port']} ({r['by']})" for r in refused)
    note = TextBlock(f"[network] The session's network policy refused: {named}.")
    return ToolResult(
        result.call_id,
        result.tool_name,
        (*result.content, note),
        result.is_error,
        result.error_code,
        {**result.details, "network_refused": refused},
    )
