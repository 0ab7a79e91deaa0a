"""Scenario 4, interrupts: from ``interrupt()`` to the call's ``tool_end``, for a
cooperative cancel-behaviour call and for one that ignores SIGTERM (killed after
the grace period); and how long a block call keeps the turn alive after it."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import daemon, summary
from toolpool import Client, ToolCall, ToolEnd, ToolStart, TurnEnd

NAME = "interrupts"
GRACE = 0.5  # seconds: the daemon's cancel_grace for this scenario


def _after_interrupt(session: Any, call: ToolCall, settle: float) -> tuple[float, float]:
    """Interrupt once the call runs; (ms to its tool_end, ms to turn_end)."""
    turn = session.submit([call])
    interrupted_at = 0.0
    to_end = to_turn_end = 0.0
    for event in turn:
        if isinstance(event, ToolStart):
            time.sleep(settle)  # let the worker get into the tool
            interrupted_at = time.perf_counter()
            session.interrupt()
        elif isinstance(event, ToolEnd):
            to_end = (time.perf_counter() - interrupted_at) * 1000
        elif isinstance(event, TurnEnd):
            to_turn_end = (time.perf_counter() - interrupted_at) * 1000
    return to_end, to_turn_end


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    rounds = 10 if quick else 60
    stubborn_rounds = 3 if quick else 15
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as config:
        config.write(f"cancel_grace = {GRACE}\n")
    try:
        with (
            daemon(2, "--config", config.name) as running,
            Client(runtime_dir=running.runtime) as client,
            client.session(workspace) as s,
        ):
            cooperative = [
                _after_interrupt(s, ToolCall(f"n{i}", "bench_nap", {"seconds": 30}), 0.05)[0]
                for i in range(rounds)
            ]
            stubborn = [
                _after_interrupt(s, ToolCall(f"t{i}", "bench_stubborn", {"seconds": 30}), 0.05)[0]
                for i in range(stubborn_rounds)
            ]
            # A block call with 500 ms left when interrupted: the turn lives on.
            block = [
                _after_interrupt(s, ToolCall(f"b{i}", "bench_block", {"seconds": 0.6}), 0.1)[1]
                for i in range(max(3, rounds // 5))
            ]
    finally:
        Path(config.name).unlink()
    return {
        "grace_seconds": GRACE,
        "samples_ms": {
            "cancel, cooperative": cooperative,
            "cancel, ignores SIGTERM": stubborn,
            "block, ~500 ms left": block,
        },
        "summary_ms": {
            "cancel, cooperative": summary(cooperative),
            "cancel, ignores SIGTERM": summary(stubborn),
            "block, ~500 ms left": summary(block),
        },
    }
