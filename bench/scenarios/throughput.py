"""Scenario 2, throughput against limits: calls per second and per-call latency for a
grid of max_tool_concurrency × workers × tool kind × turn size; and scenario 3,
mixed turns: what head-of-line exclusivity costs when an edit sits among reads."""

from __future__ import annotations

import shutil
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import daemon, summary
from toolpool import Client, ToolCall, ToolEnd, ToolStart

NAME = "throughput"

# The tree the read and grep calls work on: a real one nobody here wrote.
STDLIB_PACKAGES = ("json", "email", "asyncio", "http")


def tree(workspace: Path) -> list[str]:
    """Copy a part of the standard library into the workspace; the .py files in it."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in STDLIB_PACKAGES:
        target = workspace / "lib" / package
        if not target.exists():
            shutil.copytree(stdlib / package, target, ignore=shutil.ignore_patterns("__pycache__"))
    return sorted(str(p.relative_to(workspace)) for p in (workspace / "lib").rglob("*.py"))


def kinds(files: list[str]) -> dict[str, Callable[[int], ToolCall]]:
    """Tool kind → a function making call number i of that kind."""
    return {
        "no-op": lambda i: ToolCall(f"c{i}", "bench_noop", {}),
        "sleep 20 ms": lambda i: ToolCall(f"c{i}", "bench_sleep", {"ms": 20}),
        "cpu 20 ms": lambda i: ToolCall(f"c{i}", "bench_spin", {"ms": 20}),
        "read": lambda i: ToolCall(f"c{i}", "read", {"path": files[i % len(files)]}),
        "grep": lambda i: ToolCall(
            f"c{i}", "grep", {"pattern": "def \\w+_", "path": "lib", "output_mode": "count"}
        ),
    }


def run_turn(session: Any, calls: list[ToolCall]) -> tuple[float, list[float]]:
    """Wall time of the turn (s) and each call's start → end time (µs), as the client
    sees the events."""
    started = time.perf_counter()
    turn = session.submit(calls)
    begun: dict[str, float] = {}
    latencies: list[float] = []
    for event in turn:
        now = time.perf_counter()
        if isinstance(event, ToolStart):
            begun[event.call_id] = now
        elif isinstance(event, ToolEnd):
            latencies.append((now - begun[event.call_id]) * 1e6)
    wall = time.perf_counter() - started
    assert not any(r.is_error for r in turn.results()), [r.text for r in turn.results()]
    return wall, latencies


def knee(points: dict[int, float]) -> int | None:
    """The smallest concurrency whose throughput is within 10% of the best."""
    if not points:
        return None
    best = max(points.values())
    return min(c for c, value in points.items() if value >= 0.9 * best)


def grid(quick: bool) -> tuple[list[int], list[int], list[int]]:
    """max_tool_concurrency values, worker counts and turn sizes measured (every tool
    kind is measured at each point)."""
    if quick:
        return [1, 4], [1, 2], [8]
    return [1, 2, 4, 8, 16], [1, 2, 4], [8, 32]


def cell_count(quick: bool) -> int:
    concurrencies, worker_counts, sizes = grid(quick)
    return len(concurrencies) * len(worker_counts) * len(sizes) * len(kinds([]))


def run(quick: bool, workspace: Path, tick: Callable[[], None]) -> dict[str, Any]:
    concurrencies, worker_counts, sizes = grid(quick)
    repeats = 1 if quick else 3
    makers = kinds(tree(workspace))
    cells: list[dict[str, Any]] = []
    for workers in worker_counts:
        with daemon(workers) as running, Client(runtime_dir=running.runtime) as client:
            for concurrency in concurrencies:
                with client.session(workspace, max_tool_concurrency=concurrency) as session:
                    for kind, make in makers.items():
                        for size in sizes:
                            run_turn(session, [make(i) for i in range(size)])  # warm up
                            walls, latencies = [], []
                            for _ in range(repeats):
                                wall, lat = run_turn(session, [make(i) for i in range(size)])
                                walls.append(wall)
                                latencies.extend(lat)
                            wall = sorted(walls)[len(walls) // 2]
                            cells.append(
                                {
                                    "workers": workers,
                                    "concurrency": concurrency,
                                    "kind": kind,
                                    "size": size,
                                    "calls_per_second": size / wall,
                                    "turn_seconds": walls,
                                    "latency_us": summary(latencies),
                                    "latency_samples_us": latencies,
                                }
                            )
                            tick()
    knees: dict[str, int | None] = {}
    for kind in makers:
        for workers in worker_counts:
            size = max(sizes)
            points = {
                c["concurrency"]: c["calls_per_second"]
                for c in cells
                if c["kind"] == kind and c["workers"] == workers and c["size"] == size
            }
            knees[f"{kind} / {workers} workers"] = knee(points)
    return {"cells": cells, "knees": knees, "sizes": sizes}


def mixed(quick: bool, workspace: Path) -> dict[str, Any]:
    """16 safe calls (20 ms sleeps) with an edit at various places, at concurrency 8
    with 2 workers: how much one exclusive call costs the turn."""
    reps = 2 if quick else 5
    target = workspace / "edit_me.py"
    target.write_text("value = 0\n")
    layouts = {
        "16 safe calls": None,
        "edit first": 0,
        "edit in the middle": 8,
        "edit last": 16,
    }
    results: dict[str, Any] = {}
    flip = 0

    def calls(edit_at: int | None) -> list[ToolCall]:
        nonlocal flip
        safe = [ToolCall(f"s{i}", "bench_sleep", {"ms": 20}) for i in range(16)]
        read = ToolCall("r", "read", {"path": "edit_me.py"})
        if edit_at is None:
            return [read, *safe]
        edit = ToolCall(
            "e",
            "edit",
            {
                "path": "edit_me.py",
                "old_string": f"value = {flip}",
                "new_string": f"value = {1 - flip}",
            },
        )
        flip = 1 - flip
        return [read, *safe[:edit_at], edit, *safe[edit_at:]]

    with daemon(2) as running, Client(runtime_dir=running.runtime) as client:
        for concurrency in (8, 1):
            with client.session(workspace, max_tool_concurrency=concurrency) as session:
                for name, edit_at in layouts.items():
                    if concurrency == 1 and edit_at not in (None,):
                        continue
                    label = name if concurrency == 8 else "all serial (concurrency 1)"
                    walls = [run_turn(session, calls(edit_at))[0] * 1000 for _ in range(reps)]
                    results[label] = summary(walls)
    return results
