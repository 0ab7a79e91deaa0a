"""The coordinator: tools, sessions, pipeline and scheduler put together (SPEC D1).

    coordinator = Coordinator([read, edit], executor=InProcessExecutor())
    session = coordinator.open_session("/path/to/workspace")
    turn = coordinator.submit(session, calls, on_event=print)
    results = await turn

The daemon wraps one of these; tests and embedders use it directly.

Sessions' scratch directories live under ``scratch_root`` (the daemon passes its
private ``<runtime dir>/scratch-<pid>``); without one, the coordinator makes a
private temporary directory at its first session and removes it in ``close()`` (or
when it is garbage-collected, or at interpreter exit).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from toolpool.engine.budget import DEFAULT_TURN_OUTPUT_CHARS, check_turn_output_chars
from toolpool.engine.executor import Executor
from toolpool.engine.gate import Gate
from toolpool.engine.hold import Hold
from toolpool.engine.inprocess import InProcessExecutor
from toolpool.engine.middleware import Middleware
from toolpool.engine.pipeline import EventSink, Pipeline
from toolpool.engine.session import Session
from toolpool.engine.turn import Turn, discard
from toolpool.models import Event, ToolCall, ToolResult
from toolpool.registry import ToolRegistry
from toolpool.session_options import (
    DAEMON_OPTIONS,
    SessionOptionError,
    SessionOptions,
    shown,
)
from toolpool.tracing import TurnTracer, turn_tracer

# Claude Code's default: enough to fan out a model's usual burst of reads and greps.
DEFAULT_MAX_TOOL_CONCURRENCY = 10
DEFAULT_MAX_TOOL_ERRORS = 3


def _traced(emit: EventSink, tracer: TurnTracer) -> EventSink:
    def traced(event: Event) -> None:
        tracer.on_events([event])
        emit(event)

    return traced


class Coordinator:
    """Owns the tool registry, the sessions and how their turns are run."""

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        executor: Executor | None = None,
        gate: Gate | None = None,
        middlewares: Sequence[Middleware] = (),
        max_tool_concurrency: int = DEFAULT_MAX_TOOL_CONCURRENCY,
        max_tool_errors: int = DEFAULT_MAX_TOOL_ERRORS,
        scratch_root: Path | None = None,
        turn_output_chars: int = DEFAULT_TURN_OUTPUT_CHARS,
        trace: bool = True,
    ) -> None:
        """``turn_output_chars``: the default output budget of a session's turns (SPEC
        L4), in characters of text; 0 means no budget. ``trace``: turns and calls are
        OpenTelemetry spans under the caller's context when a tracer provider is set
        (R3); the daemon says False (its clients make the spans)."""
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.executor = executor or InProcessExecutor()
        self.pipeline = Pipeline(self.registry, self.executor, gate=gate, middlewares=middlewares)
        self.max_tool_concurrency = max_tool_concurrency
        self.max_tool_errors = max_tool_errors
        self.turn_output_chars = check_turn_output_chars(turn_output_chars)  # the default
        self.sessions: dict[str, Session] = {}
        self.trace = trace
        self._scratch_root = scratch_root
        self._own_scratch: weakref.finalize[Any, Any] | None = None

    @property
    def scratch_root(self) -> Path:
        """Where the sessions' scratch directories go (made on first use when the
        coordinator owns it: 0700, by ``tempfile.mkdtemp``)."""
        if self._scratch_root is None:
            self._scratch_root = Path(tempfile.mkdtemp(prefix="toolpool-scratch-"))
            self._own_scratch = weakref.finalize(
                self, shutil.rmtree, self._scratch_root, ignore_errors=True
            )
        return self._scratch_root

    def close(self) -> None:
        """Close every session; remove the scratch root if the coordinator made it."""
        for session_id in list(self.sessions):
            self.close_session(session_id)
        if self._own_scratch is not None:
            self._own_scratch()
            self._own_scratch = None
            self._scratch_root = None

    def open_session(
        self,
        workspace: str | Path,
        *,
        session_id: str | None = None,
        options: SessionOptions | None = None,
        tools: Sequence[Any] = (),
        **given: Any,
    ) -> Session:
        """Open a session on ``workspace`` with ``options``, or with the options
        ``given`` as keywords — the session options, listed once in
        ``toolpool.session_options.SessionOptions`` (docs/sessions.md) —, checked
        here: a bad one is a SessionOptionError (a ValueError) naming it. Unset ones
        take the coordinator's settings. ``tools`` are the session's own, beside the
        coordinator's (the daemon's client-shipped tools, SPEC A5): they run where the
        executor runs tools; a name the coordinator has is a ToolDefinitionError.
        The options a daemon carries out (``DAEMON_OPTIONS``: the gate's) are
        refused: this coordinator's gate is a function (``Coordinator(gate=…)``,
        ``submit(gate=…)``)."""
        if options is not None and given:
            raise TypeError("open_session takes options or keywords, not both")
        if options is None:
            options = SessionOptions.parse(given)
        gated = {n: v for n, v in options.to_wire().items() if n in DAEMON_OPTIONS}
        if gated:
            name, value = next(iter(gated.items()))
            raise SessionOptionError(
                f"session option {name} = {shown(value)}: a daemon's option; an in-process "
                "Coordinator takes a gate function (Coordinator(gate=...))"
            )
        if session_id is not None and session_id in self.sessions:
            raise ValueError(f"session {session_id} is already open")
        registry = self.registry.extended(tools) if tools else self.registry
        session = Session(
            workspace,
            options=options,
            session_id=session_id,
            scratch_root=self.scratch_root,
            max_tool_errors=self.max_tool_errors,
            turn_output_chars=self.turn_output_chars,
            tools=registry,
        )
        if session.id in self.sessions:  # a random id met an open one
            raise ValueError(f"session {session.id} is already open")
        self.sessions[session.id] = session
        return session

    def close_session(self, session: Session | str) -> None:
        closed = self.sessions.pop(session if isinstance(session, str) else session.id, None)
        if closed is not None:
            closed.close()

    def submit(
        self,
        session: Session,
        calls: Sequence[ToolCall],
        *,
        on_event: EventSink | None = None,
        gate: Gate | None = None,
        max_tool_concurrency: int | None = None,
        turn_id: str | None = None,
        open: bool = False,
        hold: Hold | None = None,
        message_events: bool = True,
    ) -> Turn:
        """Start a turn (it waits for the session's previous turn) and return it;
        ``open`` turns take more calls until closed (``Turn.add``, ``Turn.close``);
        while ``hold`` is on, the turn starts no new calls; ``message_events=False``
        leaves out the turn's message events (for a listener that makes them, L2)."""
        emit = on_event or discard
        tracer = turn_tracer() if self.trace else None
        if tracer is not None:
            emit = _traced(emit, tracer)
        if max_tool_concurrency is None:
            max_tool_concurrency = session.options.max_tool_concurrency
        turn = Turn(
            calls,
            session=session,
            pipeline=self.pipeline,
            max_tool_concurrency=(
                self.max_tool_concurrency if max_tool_concurrency is None else max_tool_concurrency
            ),
            emit=emit,
            gate=gate,
            turn_id=turn_id,
            open=open,
            hold=hold,
            message_events=message_events,
        )
        if tracer is not None:
            tracer.begin(turn.id, len(turn.calls))
        return turn.start()

    async def run_turn(
        self, session: Session, calls: Sequence[ToolCall], *, on_event: EventSink | None = None
    ) -> tuple[ToolResult, ...]:
        return await self.submit(session, calls, on_event=on_event)

    def __repr__(self) -> str:
        return (
            f"<Coordinator {len(self.registry)} tools, {len(self.sessions)} sessions, "
            f"max_tool_concurrency={self.max_tool_concurrency}>"
        )
