"""An executor that runs tools in the coordinator's own process.

For tests and debugging only: it breaks SPEC D1 (the coordinator never runs a tool)
on purpose, and it cannot stop a plain function that ignores ``ctx.cancelled`` —
such a thread is abandoned after the grace period. The worker pool has neither
limit.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

from toolpool.engine.executor import Done, ExecutionRequest, outcome_of
from toolpool.models import ErrorCode, Stage, ToolResult
from toolpool.outcomes import cancelled_result, result_from_exception, result_from_output
from toolpool.preflight import capped, failed_as, not_a_verdict, refusal
from toolpool.sandbox.limits import Limits
from toolpool.tool import ToolContext, ValidationResult


class _ThreadSafeProgress:
    """A progress sink that must run on the loop, callable from a tool's thread."""

    __slots__ = ("_loop", "_owner", "_sink")

    def __init__(self, sink: Callable[[Any], None], loop: asyncio.AbstractEventLoop) -> None:
        self._sink = sink
        self._loop = loop
        self._owner = threading.get_ident()

    def __call__(self, data: Any) -> None:
        if threading.get_ident() == self._owner:
            self._sink(data)
        else:
            self._loop.call_soon_threadsafe(self._sink, data)


_DEFAULT_LIMITS = Limits()
_merged: dict[tuple[tuple[str, Any], ...], Limits | None] = {}


def _limits(overrides: Any) -> Limits | None:
    """The session's limits over the defaults (tools read some: spill_bytes…); a
    session's calls mostly carry the same overrides, so each set is merged once."""
    try:
        key = tuple(sorted(overrides.items())) if overrides else ()
        hash(key)
    except (AttributeError, TypeError):
        key = None
    if key is not None and key in _merged:
        return _merged[key]
    try:
        merged: Limits | None = _DEFAULT_LIMITS.merged(overrides)
    except (TypeError, ValueError):
        merged = None
    if key is not None and len(_merged) < 1024:
        _merged[key] = merged
    return merged


class InProcessExecutor:
    """Async tools run as tasks; plain functions in threads (so they run side by side).

    On cancel, an async tool's task is cancelled; a thread sees ``ctx.cancelled``
    and has ``cancel_grace`` seconds to return before it is abandoned. Validate and
    preview run on the event loop, as the tool's code before its execution: at once
    when they are plain functions (every built-in's), in a task when one is async.
    """

    def __init__(self, cancel_grace: float = 2.0) -> None:
        self.cancel_grace = cancel_grace

    def submit(self, request: ExecutionRequest, done: Done) -> None:
        if request.context.network_policy is not None:
            done(_no_policy_here(request))  # N3: it fails closed
            return
        ctx = self._context(request)
        if request.stage is not Stage.EXECUTE:
            try:
                refused = _preflight_now(request, ctx)
            except _Awaits:
                task = asyncio.ensure_future(self._run(request, ctx))
                task.add_done_callback(lambda finished: done(outcome_of(request, finished)))
                return
            if refused is not None or request.stage is Stage.PREPARE:
                done(refused)
                return
        self._execute(request, ctx, done)

    async def _run(self, request: ExecutionRequest, ctx: ToolContext) -> ToolResult | None:
        """The slow path, for a tool whose validate or preview is async."""
        refused = await _preflight(request, ctx)
        if refused is not None or request.stage is Stage.PREPARE:
            return refused
        future: asyncio.Future[ToolResult | None] = asyncio.get_running_loop().create_future()
        self._execute(request, ctx, future.set_result)
        return await future

    @staticmethod
    def _context(request: ExecutionRequest) -> ToolContext:
        """The call's context with its limits (tools read some: spill_bytes…)."""
        ctx = request.context
        if ctx.limits is None:
            ctx = dataclasses.replace(ctx, limits=_limits(request.limits))
        return ctx

    def _execute(self, request: ExecutionRequest, ctx: ToolContext, done: Done) -> None:
        """P10: the tool's task (async) or thread (plain), answered through ``done``
        once it ends — or, cancelled, once it stopped or ``cancel_grace`` passed."""
        spec, call = request.spec, request.call
        token = ctx.cancel_token
        loop = asyncio.get_running_loop()
        work: asyncio.Future[Any]
        if spec.is_async:
            work = asyncio.ensure_future(spec.execute_fn(call.arguments, ctx))
        else:  # as asyncio.to_thread does: in the default executor, in a copy of our context
            progress = _ThreadSafeProgress(ctx.progress, loop)
            ctx = dataclasses.replace(ctx, progress=progress)
            run = functools.partial(
                contextvars.copy_context().run, spec.execute_fn, call.arguments, ctx
            )
            work = loop.run_in_executor(None, run)
        answered = False
        grace: asyncio.TimerHandle | None = None

        def answer(result: ToolResult) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            untrack()
            if grace is not None:
                grace.cancel()
            done(result)

        def finished(_: object) -> None:
            if work.cancelled():
                answer(cancelled_result(call, token.source, token.cause))
            elif (exc := work.exception()) is not None:
                answer(result_from_exception(call, exc))
            else:
                answer(result_from_output(call, work.result()))

        def cancelled(_: object) -> None:
            nonlocal grace
            if work.done():
                return
            if spec.is_async:
                work.cancel()
            # A thread cannot be cancelled: it is asked through ctx.cancelled, and given
            # up on after the grace (a task that ignores its cancel, likewise).
            stopped = cancelled_result(call, token.source, token.cause)
            grace = loop.call_later(self.cancel_grace, answer, stopped)

        untrack = token.on_cancel(cancelled)
        work.add_done_callback(finished)


class _Awaits(Exception):
    """A tool's validate or preview answered with an awaitable: the slow path."""


def _preflight_now(request: ExecutionRequest, ctx: ToolContext) -> ToolResult | None:
    """P6 and P7 now (toolpool.preflight): a refusal, a failed preview, or None;
    ``_Awaits`` before anything was run when either is an async function."""
    spec, call = request.spec, request.call
    if spec.validate_is_async or spec.preview_is_async:
        raise _Awaits
    try:
        verdict = spec.validate_now(call.arguments, ctx)
        if not isinstance(verdict, ValidationResult):
            raise not_a_verdict(verdict)
    except Exception as exc:
        return failed_as(call, exc, ErrorCode.VALIDATION_FAILED)
    refused = refusal(call, verdict)
    if refused is not None:
        return refused
    try:
        preview = spec.preview_now(call.arguments, ctx)
    except Exception as exc:
        return failed_as(call, exc, ErrorCode.PREVIEW_FAILED)
    if preview is not None:
        request.on_preview(*capped(preview))
    return None


async def _preflight(request: ExecutionRequest, ctx: ToolContext) -> ToolResult | None:
    """P6 and P7 for a tool with an async validate or preview."""
    spec, call = request.spec, request.call
    try:
        verdict = await spec.validate(call.arguments, ctx)
    except Exception as exc:
        return failed_as(call, exc, ErrorCode.VALIDATION_FAILED)
    refused = refusal(call, verdict)
    if refused is not None:
        return refused
    try:
        preview = await spec.preview(call.arguments, ctx)
    except Exception as exc:
        return failed_as(call, exc, ErrorCode.PREVIEW_FAILED)
    if preview is not None:
        request.on_preview(*capped(preview))
    return None


def _no_policy_here(request: ExecutionRequest) -> ToolResult:
    """A policy session's call in this process, which has no namespace and no proxy
    to carry the policy out (SPEC N3): refused, never run with the process's network."""
    return ToolResult.error(
        request.call,
        ErrorCode.SANDBOX_FAILED,
        "This session's network is a policy, which only the daemon's worker pool carries "
        "out (a network namespace and a proxy of the session's own): in-process, its "
        "tools do not run.",
    )
