"""Tool calls as OpenTelemetry spans, where the agent observes its turns (SPEC R3).

With ``opentelemetry-api`` installed (the ``otel`` extra) and a tracer provider set by
the program, each turn is a span ``toolpool.turn`` under the caller's current context
at submit time, and each call a child span ``execute_tool {tool name}`` with the
GenAI semantic conventions' attributes (``gen_ai.operation.name = execute_tool``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type``; on failure
``error.type`` and an error status). The spans are made from the turn's events — by
the client library (both drivers share its connection) and by the embedded engine —
so they land in the agent's own trace with no collector in between. A call's span
runs from its ``tool_start`` to its ``tool_end``; a turn submitted for results only
(no ``tool_start``) has its call spans start at the end less the worker's wall time.

Without the API, or with no provider set (the API's default proxy), nothing is made
and a turn costs one check. toolpool never imports the API itself: a program that
set a provider has imported it already (so has OpenTelemetry's auto-instrumentation),
and one that did not — the daemon, a worker — pays neither its import nor its memory.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

from toolpool.models import Event, ToolEnd, ToolStart, TurnEnd

TURN_SPAN = "toolpool.turn"


def turn_tracer() -> TurnTracer | None:
    """A tracer for a turn being submitted now, under the current context; None when
    nothing would record it."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return TurnTracer(trace)


class TurnTracer:
    """The spans of one turn, fed its events in order; ``trace`` is the API's
    ``opentelemetry.trace`` module."""

    __slots__ = ("_calls", "_parent", "_submitted", "_trace", "_tracer", "_turn")

    def __init__(self, trace: ModuleType) -> None:
        from opentelemetry import context  # imported with the trace API already

        self._trace = trace
        self._tracer = trace.get_tracer("toolpool")
        self._parent = context.get_current()
        self._submitted = time.time_ns()
        self._turn: Any = None
        self._calls: dict[str, Any] = {}

    def begin(self, turn_id: str, calls: int) -> None:
        """The turn was accepted: its span starts at the submit."""
        self._turn = self._tracer.start_span(
            TURN_SPAN,
            context=self._parent,
            start_time=self._submitted,
            attributes={"toolpool.turn.id": turn_id, "toolpool.turn.calls": calls},
        )

    def on_events(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, ToolStart):
                self._start(event.call_id, event.tool_name, time.time_ns())
            elif isinstance(event, ToolEnd):
                self._end(event)
            elif isinstance(event, TurnEnd):
                self.finish()

    def _start(self, call_id: str, tool: str, at: int) -> Any:
        if self._turn is None:
            self.begin("", 0)
        span = self._tracer.start_span(
            f"execute_tool {tool}",
            context=self._trace.set_span_in_context(self._turn, self._parent),
            start_time=at,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
            },
        )
        self._calls[call_id] = span
        return span

    def _end(self, event: ToolEnd) -> None:
        trace = self._trace
        now = time.time_ns()
        result = event.result
        usage = result.details.get("usage") or {}
        span = self._calls.pop(event.call_id, None)
        if span is None:  # results only: the worker's wall time says when it began
            wall = usage.get("wall_seconds") or 0.0
            span = self._start(event.call_id, event.tool_name, now - int(wall * 1e9))
            self._calls.pop(event.call_id)
        if "wall_seconds" in usage:
            span.set_attribute("toolpool.worker.wall_seconds", usage["wall_seconds"])
        if "cpu_seconds" in usage:
            span.set_attribute("toolpool.worker.cpu_seconds", usage["cpu_seconds"])
        if result.is_error:
            code = result.error_code.value if result.error_code else "error"
            span.set_attribute("error.type", code)
            first_line = result.text.split("\n", 1)[0][:200]
            span.set_status(trace.Status(trace.StatusCode.ERROR, first_line))
        span.end(end_time=now)

    def finish(self) -> None:
        """The turn ended (or was given up): every open span ends now."""
        now = time.time_ns()
        for span in self._calls.values():
            span.end(end_time=now)
        self._calls.clear()
        if self._turn is not None:
            self._turn.end(end_time=now)
            self._turn = None
