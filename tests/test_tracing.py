"""SPEC R3: tool calls as OpenTelemetry spans in the agent's own trace — made by the
client library (sync and asyncio) and the embedded engine, read here with the SDK's
in-memory exporter in the client's process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

from toolpool import AsyncClient, Client, ToolCall
from toolpool.engine import Coordinator
from toolpool.tools import BUILTIN_TOOLS
from toolpool.tracing import TURN_SPAN, turn_tracer

from .daemon_support import Daemon, shared_daemon


def _reset_globals() -> None:
    # What OpenTelemetry's own test utilities do: the global provider can be set once
    # per process, and this module must leave the rest of the suite without one.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_globals()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("daemon")) as started:
        yield started


def calls() -> list[ToolCall]:
    return [
        ToolCall("ok", "read", {"path": "a.txt"}),
        ToolCall("missing", "read", {"path": "nope.txt"}),
    ]


def check_turn(finished: tuple[ReadableSpan, ...], parent: ReadableSpan) -> None:
    """The turn's span is the agent's span's child; the calls', the turn's."""
    (turn,) = [s for s in finished if s.name == TURN_SPAN]
    tools = [s for s in finished if s.name.startswith("execute_tool ")]
    by_call = {s.attributes["gen_ai.tool.call.id"]: s for s in tools}
    assert set(by_call) == {"ok", "missing"}
    assert turn.parent is not None and turn.parent.span_id == parent.context.span_id
    assert turn.context.trace_id == parent.context.trace_id
    for call_id, span in by_call.items():
        assert span.name == "execute_tool read"
        assert span.parent is not None and span.parent.span_id == turn.context.span_id
        assert (
            dict(span.attributes or {}).items()
            >= {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "read",
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
            }.items()
        )
        assert turn.start_time <= span.start_time <= span.end_time <= turn.end_time
    assert by_call["ok"].status.status_code is StatusCode.UNSET
    assert "error.type" not in (by_call["ok"].attributes or {})
    assert by_call["missing"].status.status_code is StatusCode.ERROR
    assert by_call["missing"].attributes["error.type"] == "execution_failed"


@pytest.mark.spec("R3")
@pytest.mark.parametrize("events", ["all", "results"])
def test_R3_sync_client_turns_are_spans_under_the_callers_span(
    daemon: Daemon, workspace: Path, spans: InMemorySpanExporter, events: str
) -> None:
    (workspace / "a.txt").write_text("a\n")
    tracer = trace.get_tracer("agent")
    with Client(runtime_dir=daemon.runtime) as client, client.session(workspace) as session:
        with tracer.start_as_current_span("agent step"):
            turn = session.submit(calls(), events=events)
        turn.results()  # read outside the agent's span: the parent was taken at submit
    finished = spans.get_finished_spans()
    (parent,) = [s for s in finished if s.name == "agent step"]
    check_turn(finished, parent)
    assert len(finished) == 4


@pytest.mark.spec("R3")
async def test_R3_async_client_turns_are_spans_under_the_callers_span(
    daemon: Daemon, workspace: Path, spans: InMemorySpanExporter
) -> None:
    (workspace / "a.txt").write_text("a\n")
    tracer = trace.get_tracer("agent")
    async with (
        AsyncClient(runtime_dir=daemon.runtime) as client,
        client.session(workspace) as session,
    ):
        with tracer.start_as_current_span("agent step"):
            turn = await session.submit(calls())
            await turn.results()
    finished = spans.get_finished_spans()
    (parent,) = [s for s in finished if s.name == "agent step"]
    check_turn(finished, parent)


@pytest.mark.spec("R3")
async def test_R3_the_embedded_engine_makes_the_same_spans(
    workspace: Path, spans: InMemorySpanExporter
) -> None:
    (workspace / "a.txt").write_text("a\n")
    coordinator = Coordinator(BUILTIN_TOOLS)
    try:
        session = coordinator.open_session(workspace)
        with trace.get_tracer("agent").start_as_current_span("agent step"):
            await coordinator.run_turn(session, calls())
    finally:
        coordinator.close()
    finished = spans.get_finished_spans()
    (parent,) = [s for s in finished if s.name == "agent step"]
    check_turn(finished, parent)


@pytest.mark.spec("R3")
def test_R3_without_a_tracer_provider_nothing_is_made() -> None:
    _reset_globals()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert turn_tracer() is None
