"""SPEC P1-P12: the ordered pipeline for one call, and the breaker's accounting."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from toolpool import (
    CancelSource,
    ErrorCode,
    ImageBlock,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolEnd,
    ToolResult,
    ToolStart,
    UpdateKind,
    tool,
)
from toolpool.cancel import CancelToken
from toolpool.engine import (
    Coordinator,
    ExecutionRequest,
    GateDecision,
    GateRequest,
    Next,
    Session,
)
from toolpool.engine.breaker import BreakerEffect

from .support import EventLog, Minimal, Picture, Probe, RecordingGate, run_one


def make(workspace: Path, *tools: Any, **options: Any) -> tuple[Coordinator, Session, Probe]:
    probe = Probe()
    coordinator = Coordinator([probe, Minimal(), *tools], **options)
    return coordinator, coordinator.open_session(workspace), probe


def probe_call(call_id: str = "1", **args: Any) -> ToolCall:
    return ToolCall(call_id, "probe", {"path": "a.txt", **args})


async def run_cancelled(
    coordinator: Coordinator, session: Session, call: ToolCall, log: EventLog
) -> ToolResult:
    token = CancelToken()
    token.cancel(CancelSource.ABORT)
    return await coordinator.pipeline.run(call, session, log, token)


# --- P1, P2: the two guards before the start ------------------------------------------


@pytest.mark.spec("P1")
async def test_P1_cancelled_run_ends_before_starting(workspace: Path) -> None:
    coordinator, session, probe = make(workspace)
    session.breaker._failures["probe"] = 2
    log = EventLog()
    result = await run_cancelled(coordinator, session, probe_call(), log)
    assert result.is_error and result.text == "Tool execution cancelled."
    assert result.error_code is ErrorCode.CANCELLED
    assert log.types == ["tool_start", "tool_end"]
    assert probe.log == []  # not run, not validated
    assert session.breaker.failures("probe") == 2  # not counted


@pytest.mark.spec("P2")
async def test_P2_breaker_opens_after_consecutive_failures(workspace: Path) -> None:
    coordinator, session, probe = make(workspace)
    # Given three failures in a row
    for i in range(3):
        failed = await run_one(coordinator, session, probe_call(str(i), fail="execute"))
        assert failed.error_code is ErrorCode.EXECUTION_FAILED
    # When the tool is called again
    log = EventLog()
    result = await run_one(coordinator, session, probe_call("4"), log)
    # Then it is not run and the result says why; the failure is not counted
    assert result.error_code is ErrorCode.BREAKER_OPEN
    assert result.text.startswith('Tool "probe" is disabled after 3 consecutive errors.')
    assert [e.type.value for e in log.of_call("4")] == ["tool_start", "tool_end"]
    assert [step for step, _ in probe.log].count("execute") == 3
    assert session.breaker.failures("probe") == 3
    # And other tools of the session are unaffected
    other = await run_one(coordinator, session, ToolCall("5", "minimal", {"text": "ok"}))
    assert not other.is_error


@pytest.mark.spec("P2")
async def test_P2_breaker_counts_per_session_and_zero_disables_it(workspace: Path) -> None:
    coordinator, session, _ = make(workspace, max_tool_errors=0)
    for i in range(5):
        result = await run_one(coordinator, session, probe_call(str(i), fail="execute"))
        assert result.error_code is ErrorCode.EXECUTION_FAILED
    assert not session.breaker.is_open("probe")

    coordinator, first, _ = make(workspace, max_tool_errors=2)
    second = coordinator.open_session(workspace)
    for i in range(2):
        await run_one(coordinator, first, probe_call(str(i), fail="execute"))
    assert first.breaker.is_open("probe") and not second.breaker.is_open("probe")
    assert not (await run_one(coordinator, second, probe_call("x"))).is_error


# --- P3-P12: the pipeline proper -------------------------------------------------------


@pytest.mark.spec("P3")
async def test_P3_tool_start_carries_id_name_and_original_arguments(workspace: Path) -> None:
    coordinator, session, _ = make(workspace)
    log = EventLog()
    await run_one(coordinator, session, probe_call(count="3"), log)
    start = log.events[0]
    assert isinstance(start, ToolStart)
    assert (start.call_id, start.tool_name) == ("1", "probe")
    assert start.arguments == {"path": "a.txt", "count": "3"}  # as the model sent them
    assert (start.label, start.activity) == ("Probe Tool", "Probing a.txt")


@pytest.mark.spec("P4")
async def test_P4_unknown_tool_is_an_error_result_and_counted(workspace: Path) -> None:
    coordinator, session, _ = make(workspace)
    log = EventLog()
    result = await run_one(coordinator, session, ToolCall("1", "halucinated", {}), log)
    assert result.error_code is ErrorCode.TOOL_NOT_FOUND
    assert result.text.startswith('tool "halucinated" not found')
    assert "minimal, probe" in result.text  # what the model can call instead
    assert log.types[:2] == ["tool_start", "tool_end"]
    assert session.breaker.failures("halucinated") == 1


@pytest.mark.spec("P5")
async def test_P5_invalid_arguments_report_every_problem_and_count(workspace: Path) -> None:
    coordinator, session, probe = make(workspace)
    call = ToolCall("1", "probe", {"count": "many", "bogus": True})
    result = await run_one(coordinator, session, call)
    assert result.error_code is ErrorCode.INVALID_ARGUMENTS
    assert result.text.splitlines() == [
        'Invalid arguments for tool "probe":',
        "- 'path' is a required property",
        "- Additional properties are not allowed ('bogus' was unexpected)",
        "- count: 'many' is not of type 'integer'",
    ]
    assert probe.log == []
    assert session.breaker.failures("probe") == 1


@pytest.mark.spec("P5")
async def test_P5_unparseable_arguments_are_an_invalid_arguments_result(workspace: Path) -> None:
    coordinator, session, probe = make(workspace)
    call = ToolCall("1", "probe", {}, arguments_error="arguments are not valid JSON: '{\"pa'")
    result = await run_one(coordinator, session, call)
    assert result.error_code is ErrorCode.INVALID_ARGUMENTS
    assert result.text == (
        'Invalid arguments for tool "probe":\n- arguments are not valid JSON: \'{"pa\''
    )
    assert probe.log == []
    assert session.breaker.failures("probe") == 1


@pytest.mark.spec("P5")
async def test_P5_coerced_arguments_replace_the_call_for_every_later_step(
    workspace: Path,
) -> None:
    gate = RecordingGate()
    coordinator, session, probe = make(workspace, gate=gate)
    log = EventLog()
    result = await run_one(coordinator, session, probe_call(count="3"), log)
    # Then validate, preview, the gate and execute all saw the integer
    assert [args["count"] for _, args in probe.log] == [3, 3, 3]
    assert gate.requests[0].call.arguments["count"] == 3
    # the start event kept the string, and the result says what was coerced
    assert log.starts()[0].arguments["count"] == "3"
    assert result.details["coerced"] == [{"path": "count", "to": "integer"}]
    assert result.text.startswith("probed a.txt x3\n\n[toolpool] Some arguments were strings")
    assert "count → integer" in result.text
    assert len(result.content) == 1  # still a plain-text result (M1)


@pytest.mark.spec("P5")
async def test_P5_validators_are_compiled_once_per_tool(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator, session, _ = make(workspace)

    def compile_again(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a schema was compiled per call")

    monkeypatch.setattr("toolpool.arguments.ArgumentChecker", compile_again)
    monkeypatch.setattr("jsonschema.Draft202012Validator.check_schema", compile_again)
    results = await coordinator.run_turn(
        session, [probe_call(str(i), count=str(i)) for i in range(5)]
    )
    assert not any(r.is_error for r in results)


@pytest.mark.spec("P6")
async def test_P6_failed_validation_is_counted_and_stops_the_call(workspace: Path) -> None:
    gate = RecordingGate()
    coordinator, session, probe = make(workspace, gate=gate)
    log = EventLog()
    result = await run_one(coordinator, session, probe_call(fail="validate"), log)
    assert result.error_code is ErrorCode.VALIDATION_FAILED
    assert result.text == "probe says no"
    assert result.details == {"validation_code": 7}
    assert [s for s, _ in probe.log] == ["validate"]  # no preview, no execute
    assert gate.requests == [] and log.updates(UpdateKind.PREVIEW) == []
    assert session.breaker.failures("probe") == 1


@pytest.mark.spec("P6")
async def test_P6_a_validate_that_raises_is_a_failed_validation(workspace: Path) -> None:
    class Raising(Minimal):
        def validate(self, args: dict[str, Any], ctx: ToolContext) -> Any:
            raise OSError("disk on fire")

    coordinator = Coordinator([Raising()])
    session = coordinator.open_session(workspace)
    result = await run_one(coordinator, session, ToolCall("1", "minimal", {}))
    assert result.error_code is ErrorCode.VALIDATION_FAILED
    assert result.text == "OSError: disk on fire"
    assert session.breaker.failures("minimal") == 1


@pytest.mark.spec("P7")
async def test_P7_preview_is_emitted_after_validation_before_the_gate(workspace: Path) -> None:
    order: list[str] = []
    log = EventLog()

    def listen(event: Any) -> None:
        log(event)
        order.append(f"event:{event.type.value}")

    async def gate(request: GateRequest) -> GateDecision:
        order.append("gate")
        assert request.preview == "would probe a.txt x2"  # the gate gets the preview
        return GateDecision.allow()

    coordinator, session, probe = make(workspace, gate=gate)
    await coordinator.run_turn(session, [probe_call(count="2")], on_event=listen)
    (preview,) = log.updates(UpdateKind.PREVIEW)
    assert preview.data == "would probe a.txt x2"  # from the coerced arguments
    assert [s for s, _ in probe.log] == ["validate", "preview", "execute"]
    assert order[:4] == ["event:tool_start", "event:tool_update", "gate", "event:tool_update"]


@pytest.mark.spec("P7")
async def test_P7_no_preview_no_event_and_a_failing_preview_is_an_error(workspace: Path) -> None:
    coordinator, session, _ = make(workspace)
    log = EventLog()
    await run_one(coordinator, session, ToolCall("1", "minimal", {}), log)
    assert log.updates(UpdateKind.PREVIEW) == []

    result = await run_one(coordinator, session, probe_call("2", fail="preview"))
    assert result.error_code is ErrorCode.PREVIEW_FAILED
    assert result.text == "ValueError: cannot preview"


@pytest.mark.spec("P8")
@pytest.mark.parametrize(
    ("decision", "expected"),
    [
        (GateDecision.deny("not on my watch"), "not on my watch"),
        (GateDecision(False), 'The user did not allow "probe".'),
        (PermissionError("policy engine offline"), "policy engine offline"),
    ],
)
async def test_P8_denied_or_failing_gate_is_an_uncounted_error(
    workspace: Path, decision: Any, expected: str
) -> None:
    gate = RecordingGate(decision)
    coordinator, session, probe = make(workspace, gate=gate)
    result = await run_one(coordinator, session, probe_call())
    assert result.error_code is ErrorCode.DENIED
    assert result.text == expected
    assert "execute" not in [s for s, _ in probe.log]
    assert session.breaker.failures("probe") == 0
    (request,) = gate.requests
    assert (request.label, request.call.id, request.session_id) == ("Probe Tool", "1", session.id)
    assert request.read_only is True


@pytest.mark.spec("P8")
@pytest.mark.parametrize("gate", [None, RecordingGate(None), RecordingGate(GateDecision.allow())])
async def test_P8_no_gate_or_no_decision_allows(workspace: Path, gate: Any) -> None:
    coordinator, session, _ = make(workspace, gate=gate)
    result = await run_one(coordinator, session, probe_call())
    assert not result.is_error
    if gate is not None:
        assert len(gate.requests) == 1  # once per call


@pytest.mark.spec("P8")
async def test_P8_gate_is_called_once_per_call(workspace: Path) -> None:
    gate = RecordingGate()
    coordinator, session, _ = make(workspace, gate=gate)
    await coordinator.run_turn(session, [probe_call(str(i)) for i in range(4)])
    assert sorted(r.call.id for r in gate.requests) == ["0", "1", "2", "3"]


@pytest.mark.spec("P9")
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_P9_progress_reports_become_updates_of_the_call(workspace: Path, kind: str) -> None:
    if kind == "sync":

        @tool
        def stream(n: int, ctx: ToolContext) -> str:
            """Stream lines."""
            for i in range(n):
                ctx.report_progress(f"line {i}")
            return "done"

    else:

        @tool
        async def stream(n: int, ctx: ToolContext) -> str:
            """Stream lines."""
            for i in range(n):
                ctx.report_progress(f"line {i}")
                await asyncio.sleep(0)
            return "done"

    coordinator = Coordinator([stream])
    session = coordinator.open_session(workspace)
    log = EventLog()
    await run_one(coordinator, session, ToolCall("s", "stream", {"n": 3}), log)
    assert [e.type.value for e in log.of_call("s")] == [
        "tool_start",
        "tool_update",
        "tool_update",
        "tool_update",
        "tool_end",
    ]
    assert [u.data for u in log.updates(UpdateKind.PROGRESS)] == ["line 0", "line 1", "line 2"]


@pytest.mark.spec("P9")
async def test_P9_progress_after_the_end_is_dropped(workspace: Path) -> None:
    kept: list[ToolContext] = []

    @tool
    def leaky(ctx: ToolContext) -> str:
        """Keeps its context."""
        kept.append(ctx)
        return "ok"

    coordinator = Coordinator([leaky])
    session = coordinator.open_session(workspace)
    log = EventLog()
    await run_one(coordinator, session, ToolCall("1", "leaky", {}), log)
    count = len(log.events)
    thread = threading.Thread(target=kept[0].report_progress, args=("too late",))
    thread.start()
    thread.join()
    await asyncio.sleep(0.01)
    assert len(log.events) == count
    assert log.updates(UpdateKind.PROGRESS) == []


@pytest.mark.spec("P10")
async def test_P10_middleware_is_an_onion_outermost_first(workspace: Path) -> None:
    trace: list[str] = []

    def layer(name: str) -> Any:
        async def middleware(request: ExecutionRequest, call_next: Next) -> ToolResult:
            trace.append(f"{name}>")
            result = await call_next(request)
            trace.append(f"<{name}")
            return result

        return middleware

    class Traced(Minimal):
        def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
            trace.append("tool")
            return "ok"

    coordinator = Coordinator([Traced()], middlewares=[layer("outer"), layer("inner")])
    session = coordinator.open_session(workspace)
    result = await run_one(coordinator, session, ToolCall("1", "minimal", {}))
    assert result.text == "ok"
    assert trace == ["outer>", "inner>", "tool", "<inner", "<outer"]


@pytest.mark.spec("P10")
async def test_P10_middleware_can_short_circuit_and_rewrite(workspace: Path) -> None:
    async def cached(request: ExecutionRequest, call_next: Next) -> ToolResult:
        if request.call.arguments.get("path") == "cached.txt":
            return ToolResult(request.call.id, request.call.name, (TextBlock("from cache"),))
        result = await call_next(request)
        return ToolResult(result.call_id, result.tool_name, (TextBlock(result.text.upper()),))

    coordinator, session, probe = make(workspace, middlewares=[cached])
    hit = await run_one(coordinator, session, probe_call("1", path="cached.txt"))
    miss = await run_one(coordinator, session, probe_call("2"))
    assert hit.text == "from cache"
    assert miss.text == "PROBED A.TXT X1"
    assert [s for s, a in probe.log if s == "execute"] == ["execute"]  # only the miss ran


@pytest.mark.spec("P10")
async def test_P10_execute_content_results_keep_their_blocks(workspace: Path) -> None:
    coordinator = Coordinator([Picture()])
    session = coordinator.open_session(workspace)
    result = await run_one(coordinator, session, ToolCall("1", "picture", {}))
    assert not result.is_error
    assert isinstance(result.content[0], TextBlock)
    assert isinstance(result.content[1], ImageBlock)
    assert result.content[1].media_type == "image/png"


@pytest.mark.spec("P10", "D2")
async def test_P10_execute_errors_become_results(workspace: Path) -> None:
    coordinator, session, _ = make(workspace)
    clean = await run_one(coordinator, session, probe_call("1", fail="execute"))
    crash = await run_one(coordinator, session, probe_call("2", fail="raise"))
    assert (clean.text, clean.details) == ("probe failed on purpose", {"why": "asked to"})
    assert crash.text == "RuntimeError: boom"
    assert crash.details["exception"] == "RuntimeError"
    # the whole traceback is for whoever debugs the tool: in the details (D2), its
    # raising frame last; the model's text names the error alone
    trace = crash.details["traceback"]
    assert trace.startswith("Traceback (most recent call last)") and "boom" in trace
    assert "Traceback" not in crash.text
    assert all(r.error_code is ErrorCode.EXECUTION_FAILED for r in (clean, crash))


@pytest.mark.spec("P10")
async def test_P10_a_broken_middleware_is_an_error_result(workspace: Path) -> None:
    async def broken(request: ExecutionRequest, call_next: Next) -> ToolResult:
        raise LookupError("middleware bug")

    coordinator, session, _ = make(workspace, middlewares=[broken])
    log = EventLog()
    result = await run_one(coordinator, session, probe_call(), log)
    assert result.error_code is ErrorCode.EXECUTION_FAILED
    assert result.text == "LookupError: middleware bug"
    assert log.types[-4:] == ["tool_end", "message_start", "message_end", "turn_end"]


@pytest.mark.spec("P11")
async def test_P11_tool_end_carries_the_result_and_the_outcome_is_counted(
    workspace: Path,
) -> None:
    coordinator, session, _ = make(workspace)
    log = EventLog()
    await run_one(coordinator, session, probe_call("1", fail="execute"), log)
    await run_one(coordinator, session, probe_call("2", fail="execute"), log)
    assert session.breaker.failures("probe") == 2
    ok = await run_one(coordinator, session, probe_call("3"), log)
    assert session.breaker.failures("probe") == 0  # a success resets
    end = log.ends()[-1]
    assert isinstance(end, ToolEnd)
    assert end.result == ok and end.result.tool_name == "probe"


# --- P12 and the breaker table -----------------------------------------------------------

# Each outcome of the breaker table, produced for real: (label, arguments or setup).
OUTCOMES: list[tuple[str, ErrorCode | None, BreakerEffect]] = [
    ("cancelled before start", ErrorCode.CANCELLED, BreakerEffect.NONE),
    ("breaker open", ErrorCode.BREAKER_OPEN, BreakerEffect.NONE),
    ("gate denied", ErrorCode.DENIED, BreakerEffect.NONE),
    ("tool not found", ErrorCode.TOOL_NOT_FOUND, BreakerEffect.FAILURE),
    ("schema invalid", ErrorCode.INVALID_ARGUMENTS, BreakerEffect.FAILURE),
    ("validate failed", ErrorCode.VALIDATION_FAILED, BreakerEffect.FAILURE),
    ("execute error", ErrorCode.EXECUTION_FAILED, BreakerEffect.FAILURE),
    ("execute success", None, BreakerEffect.RESET),
]


async def produce(outcome: str, workspace: Path) -> tuple[ToolResult, Session, EventLog]:
    """Run one call that ends with ``outcome``, after one earlier failure of its tool."""
    deny = outcome == "gate denied"
    gate = RecordingGate(GateDecision.deny("no") if deny else None)
    coordinator, session, _ = make(workspace, gate=gate, max_tool_errors=3)
    name = "ghost" if outcome == "tool not found" else "probe"
    session.breaker._failures[name] = 3 if outcome == "breaker open" else 1
    args: dict[str, Any] = {
        "schema invalid": {"count": "x"},
        "validate failed": {"path": "a", "fail": "validate"},
        "execute error": {"path": "a", "fail": "execute"},
    }.get(outcome, {"path": "a"})
    call = ToolCall("c", name, args)
    log = EventLog()
    if outcome == "cancelled before start":
        result = await run_cancelled(coordinator, session, call, log)
    else:
        result = await run_one(coordinator, session, call, log)
    return result, session, log


@pytest.mark.spec("P2", "P11")
@pytest.mark.parametrize(("outcome", "code", "effect"), OUTCOMES, ids=[o[0] for o in OUTCOMES])
async def test_breaker_accounting_table(
    workspace: Path, outcome: str, code: ErrorCode | None, effect: BreakerEffect
) -> None:
    # Given the tool failed before (once; three times for the open breaker)
    result, session, _ = await produce(outcome, workspace)
    # Then the outcome is the expected one and moved the count as SPEC's table says
    assert result.error_code is code
    before = 3 if outcome == "breaker open" else 1
    after = {BreakerEffect.NONE: before, BreakerEffect.FAILURE: before + 1, BreakerEffect.RESET: 0}
    assert session.breaker.failures(result.tool_name) == after[effect]


@pytest.mark.spec("P12")
@pytest.mark.parametrize("outcome", [o[0] for o in OUTCOMES] + ["preview failed"])
async def test_P12_exactly_one_start_and_one_end_per_call(workspace: Path, outcome: str) -> None:
    if outcome == "preview failed":
        coordinator, session, _ = make(workspace)
        log = EventLog()
        await run_one(coordinator, session, probe_call("c", fail="preview"), log)
    else:
        _, _, log = await produce(outcome, workspace)
    events = log.of_call("c")
    assert [e.type.value for e in events if e.type.value != "tool_update"] == [
        "tool_start",
        "tool_end",
    ]
    assert events[0].type.value == "tool_start" and events[-1].type.value == "tool_end"
