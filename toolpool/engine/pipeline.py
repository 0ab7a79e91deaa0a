"""The ordered pipeline for one tool call (SPEC P1-P12).

    P1 cancelled? → P2 breaker open? → P3 tool_start → P4 find tool → P5 schema (with
    coercion) → P6 validate → P7 preview → P8 gate → P9/P10 execute with progress,
    through the middleware chain → the turn's output budget (L4: a result over its
    share is cut, before anyone sees it) → P11 tool_end, breaker accounting.

P6, P7 and P10 are the tool's own code: they run in the executor, where the tool
runs (a worker, SPEC L10), in one dispatch when no gate and no middleware stand
between them, else as ``prepare`` before the gate and ``execute`` after it.

Every step may end the call early, and an early end is a result, never an exception:
``run`` always returns a ToolResult and always emits exactly one ``tool_start`` and
one ``tool_end`` for the call (P12).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from toolpool.arguments import ArgumentCheck
from toolpool.cancel import CancelToken
from toolpool.engine import line_cut
from toolpool.engine.budget import OutputShare, cut_to_share, over_share, spill_limit, write_spill
from toolpool.engine.executor import ExecutionRequest, Executor, submitted
from toolpool.engine.gate import Gate, GateDecision, GateRequest
from toolpool.engine.middleware import Middleware, build_chain
from toolpool.engine.session import Session
from toolpool.models import (
    ErrorCode,
    Event,
    Stage,
    TextBlock,
    ToolCall,
    ToolResult,
    ToolUpdate,
    UpdateKind,
    new_tool_end,
    new_tool_start,
)
from toolpool.outcomes import cancelled_result, result_from_exception, skipped_because
from toolpool.profiles import not_offered
from toolpool.registry import ToolRegistry, ToolSpec

EventSink = Callable[[Event], None]
T = TypeVar("T")


class Flight:
    """A call past P3 — its tool_start is out, its tool_end is owed (P12) — until its
    end: one object per call, which its progress reports (P9: ``progress``, dropped
    after its tool_end), its preview (P7: ``preview``, emitted and kept for the gate)
    and the executor's answer (``executed``) reach."""

    __slots__ = (
        "began",
        "call",
        "check",
        "done",
        "emit",
        "gate",
        "open",
        "pipeline",
        "preview_truncated",
        "preview_value",
        "session",
        "share",
        "spec",
        "token",
    )

    def __init__(
        self,
        pipeline: Pipeline,
        call: ToolCall,
        spec: ToolSpec | None,
        session: Session,
        emit: EventSink,
        token: CancelToken,
        gate: Gate | None,
        share: OutputShare | None,  # of the turn's output budget (L4); None: no cut
        check: ArgumentCheck | None,  # P5, when the scheduler made it already
    ) -> None:
        self.pipeline = pipeline
        self.call = call
        self.spec = spec
        self.session = session
        self.emit = emit
        self.token = token
        self.gate = gate
        self.share = share
        self.check = check
        self.open = True  # until its tool_end: progress reports are events
        self.began = 0.0  # the clock of register stamps: which ones this call made
        self.done: Callable[[ToolResult], None] | None = None
        self.preview_value: Any = None
        self.preview_truncated = False

    def progress(self, data: Any) -> None:
        if self.open:
            call = self.call
            self.emit(ToolUpdate(call.id, call.name, UpdateKind.PROGRESS, data))

    def preview(self, value: Any, truncated: bool) -> None:
        self.preview_value, self.preview_truncated = value, truncated
        call = self.call
        self.emit(ToolUpdate(call.id, call.name, UpdateKind.PREVIEW, value))

    def executed(self, result: ToolResult | None) -> None:
        """The executor's answer to the call's one dispatch (stage "full")."""
        assert result is not None  # only stage "prepare" may answer None
        check = self.check
        self.pipeline.finish(self, result if check is None else _noted(result, check))


class Pipeline:
    """Runs single calls through P1-P12; a call's tool is looked up in its session's
    tools (``Session.tools``: ``registry``, the coordinator's, unless the session has
    tools of its own beside them)."""

    def __init__(
        self,
        registry: ToolRegistry,
        executor: Executor,
        *,
        gate: Gate | None = None,
        middlewares: Sequence[Middleware] = (),
    ) -> None:
        self.registry = registry
        self.gate = gate
        self._executor = executor
        self._middlewares = tuple(middlewares)
        self._execute = build_chain(middlewares, functools.partial(_executed, executor))

    async def run(
        self,
        call: ToolCall,
        session: Session,
        emit: EventSink,
        token: CancelToken,
        *,
        gate: Gate | None = None,
        share: OutputShare | None = None,
    ) -> ToolResult:
        """Take one call through the pipeline; ``gate`` overrides the pipeline's gate;
        a result over ``share`` is cut (L4; a turn gives each call its share)."""
        begun = self.begin(call, session, emit, token, gate=gate, share=share)
        return begun if isinstance(begun, ToolResult) else await self.complete(begun)

    def begin(
        self,
        call: ToolCall,
        session: Session,
        emit: EventSink,
        token: CancelToken,
        *,
        gate: Gate | None = None,
        share: OutputShare | None = None,
        check: ArgumentCheck | None = None,
        spec: ToolSpec | None = None,
    ) -> ToolResult | Flight:
        """P1-P3, synchronously: the call's result when a guard ended it, otherwise the
        call in flight, its ``tool_start`` emitted, for ``proceed``.

        The scheduler calls this at the moment it starts a call, so that tool_start
        events are in turn order whatever happens next (S2); ``check`` is the call's
        P5 check when it was made already (the turn made it to plan the call), and
        ``spec`` its tool, when looked up already.
        """
        if token.requested:  # P1
            result = cancelled_result(call, token.source, token.cause)
            return self.end_unstarted(call, session, emit, result, share=share)
        if session.breaker.is_open(call.name):  # P2
            failures = session.breaker.failures(call.name)
            message = (
                f'Tool "{call.name}" is disabled after {failures} consecutive errors. '
                "Try a different approach or another tool."
            )
            because = skipped_because("breaker", session.breaker.last_failure(call.name))
            result = ToolResult.error(call, ErrorCode.BREAKER_OPEN, message, because)
            return self.end_unstarted(call, session, emit, result, share=share)

        if spec is None:
            spec = session.tools.get(call.name)
        if spec is None:
            label, activity = call.name, None
        else:
            label, activity = spec.steady_start or (spec.label(), spec.activity(call.arguments))
        emit(new_tool_start(call.id, call.name, call.arguments, label, activity))  # P3
        return Flight(self, call, spec, session, emit, token, gate or self.gate, share, check)

    async def complete(self, flight: Flight) -> ToolResult:
        """P4-P11 for a call that ``begin`` let through, awaited (``proceed``'s)."""
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self.proceed(flight, future.set_result)
        return await future

    def proceed(self, flight: Flight, done: Callable[[ToolResult], None]) -> None:
        """P4-P11 for a call that ``begin`` let through; ``done(result)`` once its
        ``tool_end`` is out. No task: a call with neither gate nor middleware is
        callbacks from here to its end; one with them runs those steps as a task."""
        flight.began = time.time()
        flight.done = done
        call, spec, session = flight.call, flight.spec, flight.session
        # P4, in the session's profile (F12); P5, checked when the turn was planned.
        if spec is None or not session.offers(call.name):
            message = not_offered(session.tool_profile, call.name, session.tools.names())
            self.finish(flight, ToolResult.error(call, ErrorCode.TOOL_NOT_FOUND, message))
            return
        if call.arguments_error is not None:  # nothing to coerce or validate
            problem = ArgumentCheck({}, (call.arguments_error,))
            self.finish(flight, _invalid_arguments(call, problem))
            return
        check = flight.check or spec.checker.check(call.arguments)
        if not check.ok:
            self.finish(flight, _invalid_arguments(call, check))
            return
        if check.arguments is not call.arguments:  # coerced (no arguments_error here)
            call = ToolCall(call.id, call.name, check.arguments)
        # The check is kept only where it has coercions to note (``executed``).
        flight.check = check if check.coercions else None
        ctx = session.context(call, flight.token, flight.progress)
        request = ExecutionRequest(spec, call, ctx, session.limits, Stage.FULL, flight.preview)
        if flight.gate is None and not self._middlewares:
            # P6, P7 and P10 where the tool runs (L10), in one dispatch: no gate waits
            # for the preview, no middleware wraps the execution (a middleware that
            # short-circuits must still come after P6).
            try:
                self._executor.submit(request, flight.executed)
            except Exception as exc:  # an executor broke its contract
                self.finish(flight, result_from_exception(call, exc))
            return
        task = asyncio.ensure_future(self._staged(flight, request, check))
        task.add_done_callback(lambda finished: self.finish(flight, _task_result(call, finished)))

    def finish(self, flight: Flight, result: ToolResult) -> None:
        """The call's end: cut to its share (L4), its tool_end (P11), the breaker's
        count, and its ``done``."""
        flight.open = False
        share = flight.share
        if share is not None and over_share(result, share):
            result = self._cut(flight, result, share, flight.began)
        session = flight.session
        flight.emit(new_tool_end(result.call_id, result.tool_name, result))  # P11
        session.breaker.record(result)
        done = flight.done
        assert done is not None
        done(result)

    def end_unstarted(
        self,
        call: ToolCall,
        session: Session,
        emit: EventSink,
        result: ToolResult,
        *,
        share: OutputShare | None = None,
    ) -> ToolResult:
        """End a call that never entered the pipeline proper (P1, P2, S4, S5): a
        tool_start and a tool_end all the same (P12), nothing else."""
        spec = session.tools.get(call.name)
        emit(
            new_tool_start(
                call.id, call.name, call.arguments, spec.label() if spec else call.name, None
            )
        )
        if share is not None and over_share(result, share):  # a tiny share only
            spill = write_spill(
                session.scratch_dir, call.id, result.text, spill_limit(session.limits)
            )
            result = cut_to_share(result, share, spill)
        return self._end(session, emit, result)

    def _cut(
        self, flight: Flight, result: ToolResult, share: OutputShare, began: float
    ) -> ToolResult:
        """L4: ``result`` cut to ``share`` — a text read to its first whole lines
        (``line_cut``), any other around a note naming a spill file of the session's
        scratch with its full text — and what this call recorded of its files in the
        register narrowed to what the model saw, when it is a read-only tool's or a
        refusal's (a stale refusal that showed a whole file counts as its read, F9)."""
        session, call, spec = flight.session, flight.call, flight.spec
        lines = line_cut.plan(result, share, session.tool_profile)
        kept = None if lines is None else lines.kept
        partly: list[str] = []
        if spec is not None and call.arguments_error is None:
            args, _ = spec.checker.coerce(call.arguments)
            if spec.read_only(args) or result.is_error:
                ctx = session.context(call, flight.token)
                for path in spec.file_paths(args, ctx):
                    if session.files.narrow(path, call_id=call.id, since=began, kept=kept):
                        partly.append(_shown(path, session) if lines is None else lines.name)
        if lines is not None:
            return line_cut.cut(result, share, lines, partly)
        spill = write_spill(session.scratch_dir, call.id, result.text, spill_limit(session.limits))
        return cut_to_share(result, share, spill, partly_read=partly)

    @staticmethod
    def _end(session: Session, emit: EventSink, result: ToolResult) -> ToolResult:
        emit(new_tool_end(result.call_id, result.tool_name, result))  # P11
        session.breaker.record(result)
        return result

    async def _staged(
        self, flight: Flight, request: ExecutionRequest, check: ArgumentCheck
    ) -> ToolResult:
        """P6-P10 with a gate or a middleware between them: "prepare", the gate, then
        "execute" through the middleware chain."""
        call, spec, token = request.call, request.spec, flight.token
        if spec.has_validate or spec.has_preview:  # P6, P7
            try:
                staged = dataclasses.replace(request, stage=Stage.PREPARE)
                refused = await submitted(self._executor, staged)
            except Exception as exc:
                refused = result_from_exception(call, exc)
            if refused is not None:
                return _noted(refused, check)

        if flight.gate is not None:  # P8
            gate_request = GateRequest(
                spec,
                call,
                spec.label(),
                flight.preview_value,
                flight.session.id,
                flight.preview_truncated,
            )
            decided = await _unless_cancelled(_ask(flight.gate, gate_request), token)
            if decided is None:
                return cancelled_result(call, token.source, token.cause)
            if not decided.allowed:
                reason = decided.reason or f'The user did not allow "{call.name}".'
                return ToolResult.error(call, ErrorCode.DENIED, reason)

        if token.requested:
            return cancelled_result(call, token.source, token.cause)
        try:  # P9, P10
            result = await self._execute(dataclasses.replace(request, stage=Stage.EXECUTE))
        except Exception as exc:  # a middleware or executor broke its contract
            result = result_from_exception(call, exc)
        return _noted(result, check)


async def _executed(executor: Executor, request: ExecutionRequest) -> ToolResult:
    """The innermost layer of the middleware onion: the executor's answer."""
    result = await submitted(executor, request)
    assert result is not None  # only stage "prepare" may answer None
    return result


def _task_result(call: ToolCall, finished: asyncio.Future[ToolResult]) -> ToolResult:
    """A staged call's task ended: its result, or what it broke on as one (a bug, or
    the loop's shutdown cancelling it)."""
    if finished.cancelled():
        return cancelled_result(call, None)
    exc = finished.exception()
    return result_from_exception(call, exc) if exc is not None else finished.result()


def _shown(path: Path, session: Session) -> str:
    """A path as the model names it: relative to the workspace when inside it."""
    try:
        return str(path.relative_to(session.workspace))
    except ValueError:
        return str(path)


async def _ask(gate: Gate, request: GateRequest) -> GateDecision:
    """Ask the gate; no decision allows, an exception denies with its text."""
    try:
        decision = await gate(request)
    except Exception as exc:
        return GateDecision.deny(str(exc) or f"the approval gate failed ({type(exc).__name__})")
    return GateDecision.allow() if decision is None else decision


async def _unless_cancelled(work: Awaitable[T], token: CancelToken) -> T | None:
    """``work``'s value, or None when the token fires first (work is then cancelled)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(token.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def _invalid_arguments(call: ToolCall, check: ArgumentCheck) -> ToolResult:
    lines = "\n".join(f"- {p}" for p in check.problems)
    message = f'Invalid arguments for tool "{call.name}":\n{lines}'
    details: dict[str, Any] = {"problems": list(check.problems)}
    if check.coercions:
        details["coerced"] = [c.to_dict() for c in check.coercions]
    return ToolResult.error(call, ErrorCode.INVALID_ARGUMENTS, message, details)


def _noted(result: ToolResult, check: ArgumentCheck) -> ToolResult:
    """P5: when arguments were coerced, say so — in the details for programs and in a
    last text block for the model, so that it learns to send typed values."""
    if not check.coercions:
        return result
    fields = ", ".join(f"{c.path} → {c.to_type}" for c in check.coercions)
    note = (
        f"[toolpool] Some arguments were strings and were converted: {fields}. "
        "Send JSON numbers, booleans, arrays and objects, not strings."
    )
    content = result.content
    # Appended to the last text so a plain-text result stays plain text (M1).
    if content and isinstance(content[-1], TextBlock):
        content = (*content[:-1], TextBlock(f"{content[-1].text}\n\n{note}".lstrip()))
    else:
        content = (*content, TextBlock(note))
    details = {**result.details, "coerced": [c.to_dict() for c in check.coercions]}
    return dataclasses.replace(result, content=content, details=details)
