"""Test kit: tools that behave on purpose, an event log, a gate that records."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from toolpool import (
    Event,
    ImageBlock,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolEnd,
    ToolError,
    ToolResult,
    ToolStart,
    ToolUpdate,
    UpdateKind,
    ValidationResult,
)
from toolpool.engine import Coordinator, GateDecision, GateRequest, Session
from toolpool.pool import PoolConfig, WorkerPool

PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


class EventLog:
    """Every event of a turn, in order, with views tests ask for."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    @property
    def types(self) -> list[str]:
        return [e.type.value for e in self.events]

    def of_call(self, call_id: str) -> list[Event]:
        return [e for e in self.events if getattr(e, "call_id", None) == call_id]

    def starts(self) -> list[ToolStart]:
        return [e for e in self.events if isinstance(e, ToolStart)]

    def ends(self) -> list[ToolEnd]:
        return [e for e in self.events if isinstance(e, ToolEnd)]

    def updates(self, kind: UpdateKind) -> list[ToolUpdate]:
        return [e for e in self.events if isinstance(e, ToolUpdate) and e.kind is kind]


class RecordingGate:
    """A gate that records its requests and answers from a script."""

    def __init__(self, decision: GateDecision | Exception | None = None) -> None:
        self.decision = decision
        self.requests: list[GateRequest] = []

    async def __call__(self, request: GateRequest) -> GateDecision | None:
        self.requests.append(request)
        if isinstance(self.decision, Exception):
            raise self.decision
        return self.decision


class Probe:
    """A hand-written tool with every optional capability (T2) and permission
    metadata (T3); it records which of its parts were called, in order, and with
    which arguments."""

    name = "probe"
    description = "A tool that records how the pipeline uses it."
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "count": {"type": "integer"},
            "fail": {"type": "string", "enum": ["validate", "preview", "execute", "raise"]},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self.log: list[tuple[str, dict[str, Any]]] = []

    def label(self) -> str:
        return "Probe Tool"

    def validate(self, args: dict[str, Any], ctx: ToolContext) -> ValidationResult:
        self.log.append(("validate", dict(args)))
        if args.get("fail") == "validate":
            return ValidationResult.failed("probe says no", code=7)
        return ValidationResult.passed()

    def preview(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.log.append(("preview", dict(args)))
        if args.get("fail") == "preview":
            raise ValueError("cannot preview")
        return f"would probe {args['path']} x{args.get('count', 1)}"

    def read_only(self, args: dict[str, Any]) -> bool:
        return True

    def concurrency_safe(self, args: dict[str, Any]) -> bool:
        return True

    def activity(self, args: dict[str, Any]) -> str:
        return f"Probing {args.get('path')}"

    def interrupt_behavior(self, args: dict[str, Any]) -> str:
        return "cancel"

    def permissions(self) -> list[str]:
        return ["read", "network"]

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.log.append(("execute", dict(args)))
        if args.get("fail") == "execute":
            raise ToolError("probe failed on purpose", details={"why": "asked to"})
        if args.get("fail") == "raise":
            raise RuntimeError("boom")
        ctx.report_progress({"step": 1})
        ctx.report_progress("halfway")
        return f"probed {args['path']} x{args.get('count', 1)}"


class Minimal:
    """Only the four required parts (T1)."""

    name = "minimal"
    description = "Echoes its text."
    schema: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}}}

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return str(args.get("text", ""))


class Picture:
    """A content tool (T2 execute_content): a text block and an image."""

    name = "picture"
    description = "Returns a picture."
    schema: dict[str, Any] = {"type": "object", "properties": {}}

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raise AssertionError("execute_content must be preferred")

    def execute_content(self, args: dict[str, Any], ctx: ToolContext) -> list[Any]:
        import base64

        return [TextBlock("a 1x1 png"), ImageBlock(base64.b64encode(PNG_1X1).decode(), "image/png")]


class Work:
    """An async tool whose behaviour is set per call by its arguments: how many
    event-loop ticks it takes (a fake clock: no wall time passes), whether it is
    safe, and its interrupt behaviour. ``running`` tracks calls inside execute."""

    name = "work"
    description = "Does some work."
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "ticks": {"type": "integer", "minimum": 0},
            "safe": {"type": "boolean"},
            "behavior": {"type": "string", "enum": ["cancel", "block"]},
            "fail": {"type": "boolean"},
        },
        "required": ["ticks"],
    }

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.started: list[str] = []

    def concurrency_safe(self, args: dict[str, Any]) -> bool:
        return bool(args.get("safe", False))

    def interrupt_behavior(self, args: dict[str, Any]) -> str:
        return str(args.get("behavior", "block"))

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.started.append(ctx.call_id)
        self.running.add(ctx.call_id)
        try:
            for _ in range(args["ticks"]):
                await asyncio.sleep(0)
            if args.get("fail"):
                raise ToolError("work failed")
            return f"done {ctx.call_id}"
        finally:
            self.running.discard(ctx.call_id)


def work_call(
    call_id: str, ticks: int = 0, *, safe: bool = True, behavior: str = "block", fail: bool = False
) -> ToolCall:
    args: dict[str, Any] = {"ticks": ticks, "safe": safe, "behavior": behavior}
    if fail:
        args["fail"] = True
    return ToolCall(call_id, "work", args)


async def ticks(n: int) -> None:
    """Let the event loop run ``n`` rounds (the fake clock advancing)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def run_one(
    coordinator: Coordinator, session: Session, call: ToolCall, log: EventLog | None = None
) -> ToolResult:
    (result,) = await coordinator.run_turn(session, [call], on_event=log)
    return result


def ids(results: Sequence[ToolResult]) -> list[str]:
    return [r.call_id for r in results]


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait (polling) until ``condition()`` holds; fail the test after ``timeout``, a
    hang guard far past anything waited for here (a loaded machine is slow, not stuck)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


PoolFactory = Callable[..., Awaitable[WorkerPool]]


@contextlib.asynccontextmanager
async def pool_factory(**defaults: Any) -> AsyncIterator[PoolFactory]:
    """Started ``WorkerPool``s of ``defaults`` and a test's overrides; every one is
    closed at the end (nothing left running)."""
    pools: list[WorkerPool] = []

    async def make(**overrides: Any) -> WorkerPool:
        pool = WorkerPool(PoolConfig(**{**defaults, **overrides}))
        pools.append(pool)
        await pool.start()
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            await pool.close()
