"""Scenario cpu: the CPU time a no-op call costs each process — the daemon (its main
thread apart from ZeroMQ's I/O threads and the rest), the client, the workers —
in one-call turns (with every event, and asking for results only) and in 32-call
turns from one blocking client; a py-spy profile
of the daemon under the one-call load; and the in-process pipeline's cost per
one-call turn, for a sync no-op (run in a thread) and an async one (a task)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import perfdso, pyspy
from bench.common import daemon, summary
from bench.cputime import StackMeter, median_of
from bench.tools import bench_anoop, bench_noop
from toolpool import Client, ToolCall
from toolpool.engine import Coordinator, InProcessExecutor

NAME = "cpu"
WORKERS = 2
BATCH = 32
# Workers are not recycled mid-measurement (the default recycles one every 1,000 calls).
SETTINGS = {"TOOLPOOL_MAX_CALLS_PER_WORKER": "100000000"}


def sizes(quick: bool) -> dict[str, int]:
    """Repetitions, turns per repetition, warm-up turns, profile seconds, in-process
    calls per repetition."""
    if quick:
        return {"repeats": 3, "one": 150, "batch": 5, "warmup": 30, "profile": 1, "inproc": 150}
    return {"repeats": 3, "one": 2000, "batch": 100, "warmup": 300, "profile": 10, "inproc": 3000}


def _turns(session: Any, turns: int, size: int, tag: str, events: str = "all") -> None:
    for i in range(turns):
        calls = [ToolCall(f"{tag}{i}.{j}", "bench_noop", {}) for j in range(size)]
        results = session.submit(calls, events=events).results()
        assert all(r.text == "ok" for r in results), [r.text for r in results]


def _measure(
    meter: StackMeter, session: Any, turns: int, size: int, tag: str, events: str = "all"
) -> dict[str, Any]:
    before = meter.snapshot()
    _turns(session, turns, size, tag, events)
    return meter.per_call(before, meter.snapshot(), turns * size)


def full_stack(quick: bool, workspace: Path) -> dict[str, Any]:
    n = sizes(quick)
    one: list[dict[str, Any]] = []
    results_only: list[dict[str, Any]] = []
    batch: list[dict[str, Any]] = []
    with (
        daemon(WORKERS, settings=SETTINGS) as running,
        Client(runtime_dir=running.runtime) as client,
        client.session(workspace) as session,
    ):
        _turns(session, n["warmup"], 1, "w")
        _turns(session, max(1, n["warmup"] // BATCH), BATCH, "wb")
        meter = StackMeter(running.pid)
        for r in range(n["repeats"]):  # interleaved, so that a slow moment hits both
            one.append(_measure(meter, session, n["one"], 1, f"o{r}."))
            results_only.append(_measure(meter, session, n["one"], 1, f"r{r}.", "results"))
            batch.append(_measure(meter, session, n["batch"], BATCH, f"b{r}."))
        counter = iter(range(10**9))
        profile = pyspy.record(
            running.pid, n["profile"], lambda: _turns(session, 1, 1, f"p{next(counter)}.")
        )
        # The same loads under perf: the daemon's CPU by library (is it the event loop?)
        libraries = {
            "one_call": perfdso.record(
                running.pid, n["profile"], lambda: _turns(session, 1, 1, f"l{next(counter)}.")
            ),
            "batch": perfdso.record(
                running.pid, n["profile"], lambda: _turns(session, 1, BATCH, f"L{next(counter)}.")
            ),
        }
    return {
        "workers": WORKERS,
        "repeats": n["repeats"],
        "one_call": {"turns": n["one"], "size": 1, "runs": one, "median": median_of(one)},
        # Submit.events = "results" (SPEC H1): tool_end and turn_end only, fewer frames.
        "one_call_results": {
            "turns": n["one"],
            "size": 1,
            "runs": results_only,
            "median": median_of(results_only),
        },
        "batch": {"turns": n["batch"], "size": BATCH, "runs": batch, "median": median_of(batch)},
        "profile": profile,
        "libraries": libraries,
    }


def in_process(quick: bool, workspace: Path, tool: str) -> dict[str, Any]:
    """One-call turns of ``tool`` through a Coordinator with the in-process executor:
    the pipeline alone, no process hop. p50 wall and this process's CPU per turn."""
    n = sizes(quick)
    warmup = n["warmup"]
    coordinator = Coordinator([bench_noop, bench_anoop], executor=InProcessExecutor())
    session = coordinator.open_session(workspace)
    meter = StackMeter(None)

    async def measure() -> tuple[list[float], list[dict[str, Any]]]:
        for i in range(warmup):
            await coordinator.run_turn(session, [ToolCall(f"w{i}", tool, {})])
        samples: list[float] = []
        runs = []
        for r in range(n["repeats"]):
            before = meter.snapshot()
            for i in range(n["inproc"]):
                started = time.perf_counter()
                (result,) = await coordinator.run_turn(session, [ToolCall(f"c{r}.{i}", tool, {})])
                samples.append((time.perf_counter() - started) * 1e6)
                assert result.text == "ok", result.text
            runs.append(meter.per_call(before, meter.snapshot(), n["inproc"]))
        return samples, runs

    # The loop the daemon runs on (uvloop, a dependency on Linux), so the figure is
    # the pipeline's, not asyncio's own loop turns.
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            samples, runs = runner.run(measure())
    finally:
        coordinator.close()
    cpu = median_of([r["client"] for r in runs])
    loop = "uvloop" if _loop_factory() else "asyncio"
    return {"calls": len(samples), "wall_us": summary(samples), "cpu_us": cpu, "loop": loop}


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    data = full_stack(quick, workspace)
    data["in_process"] = {
        "bench_noop": in_process(quick, workspace, "bench_noop"),
        "bench_anoop": in_process(quick, workspace, "bench_anoop"),
    }
    return data
