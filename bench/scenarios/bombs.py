"""The soak's bombs (SPEC L10, L11): calls whose cost grows with what a few bytes of
arguments ask for — the 220-byte multi_edit that makes a 100 kB file 200 MB, an edit
of every character into 500, a notebook_edit of a notebook of 200,000 cells — run in
one session while another session reads a small file over and over.

What it measures: the daemon's RSS before the bombs and its high while they go off
(the goal: within 50 MB of where it was), and the other session's read latency,
p50 and p99, alone and beside the bombs (the goal: p99 within 2× of its p99 alone);
and how each bomb ended (refused, limit_exceeded, or done in its worker).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import ProcessSampler
from toolpool import Client, ToolCall

READS_ALONE = 300  # a quick run: 100


def _notebook(path: Path, cells: int) -> None:
    """An nbformat 4.5 notebook of ``cells`` markdown cells (ids m0, m1, …)."""
    nb = {
        "cells": [
            {"cell_type": "markdown", "id": f"m{n}", "metadata": {}, "source": f"cell {n}"}
            for n in range(cells)
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


def _bombs(quick: bool) -> list[tuple[str, str, list[ToolCall]]]:
    """(name, file to read first, the bomb's calls)."""
    edits = [
        {"old_string": "a", "new_string": "b" * 100, "replace_all": True},
        {"old_string": "b", "new_string": "cc" * 10, "replace_all": True},
    ]
    return [
        ("multi_edit ×100 then ×20 (220 bytes)", "a.txt", [
            ToolCall("m", "multi_edit", {"path": "a.txt", "edits": edits}),
        ]),
        ("edit a → b × 500, replace_all", "b.txt", [
            ToolCall("e", "edit", {
                "path": "b.txt", "old_string": "a", "new_string": "b" * 500, "replace_all": True,
            }),
        ]),
        (f"notebook_edit of {20_000 if quick else 200_000:,} cells", "big.ipynb", [
            ToolCall("n", "notebook_edit", {
                "path": "big.ipynb", "cell_id": "m0", "new_source": "changed",
            }),
        ]),
    ]  # fmt: skip


def _prepare(workspace: Path, quick: bool) -> None:
    size = 10_000 if quick else 100_000
    (workspace / "a.txt").write_text("a" * size)
    (workspace / "b.txt").write_text("a" * size)
    (workspace / "small.txt").write_text("hello\n" * 20)
    _notebook(workspace / "big.ipynb", 20_000 if quick else 200_000)


def _latencies(session: Any, stop: threading.Event | None, count: int) -> list[float]:
    """ms of one read each, until ``stop`` (or ``count`` reads when there is none)."""
    out: list[float] = []
    n = 0
    while (stop is None and n < count) or (stop is not None and not stop.is_set()):
        n += 1
        began = time.perf_counter()
        session.submit([ToolCall(f"r{n}", "read", {"path": "small.txt"})]).results()
        out.append((time.perf_counter() - began) * 1000)
    return out


def _summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0, "p50": float("nan"), "p99": float("nan")}
    ordered = sorted(ms)
    return {
        "n": len(ms),
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


def run(runtime: Path, workspace: Path, pid: int, quick: bool) -> dict[str, Any]:
    """The bombs against the daemon at ``runtime`` (pid ``pid``), in ``workspace``."""
    bombs_dir = workspace / "bombs"
    bombs_dir.mkdir(exist_ok=True)
    _prepare(bombs_dir, quick)
    sampler = ProcessSampler(pid, 0.05)
    outcomes: list[dict[str, Any]] = []
    # Two clients: the other session is another agent's, on a connection of its own.
    with (
        Client(runtime_dir=runtime, name="bench-bombs", timeout=600) as bombing,
        Client(runtime_dir=runtime, name="bench-bombs-reader", timeout=600) as reading,
        bombing.session(bombs_dir, turn_output_chars=0) as bomber,
        reading.session(bombs_dir) as reader,
    ):
        for _, path, _ in _bombs(quick):  # the reads F3 asks for, before anything is measured
            bomber.submit([ToolCall("r", "read", {"path": path})]).results()
        alone = _latencies(reader, None, READS_ALONE // 3 if quick else READS_ALONE)
        time.sleep(1.0)  # the reads' buffers given back before "where it was"
        before = sampler.sample()
        stop = threading.Event()
        beside: list[float] = []
        watcher = threading.Thread(
            target=lambda: beside.extend(_latencies(reader, stop, 0)), name="bombs-reader"
        )
        with sampler:
            watcher.start()
            try:
                for name, _, calls in _bombs(quick):
                    began = time.perf_counter()
                    (result,) = bomber.submit(calls).results()
                    outcomes.append(
                        {
                            "bomb": name,
                            "outcome": result.error_code.value if result.error_code else "ok",
                            "seconds": round(time.perf_counter() - began, 3),
                            "text": result.text[:160],
                        }
                    )
            finally:
                stop.set()
                watcher.join()
    rss = [v for _, v in sampler.series("rss")]
    before_mib = (before["rss"] if before else float("nan")) / 2**20
    high_mib = max(rss, default=float("nan")) / 2**20
    alone_s, beside_s = _summary(alone), _summary(beside)
    return {
        "bombs": outcomes,
        "daemon_rss_before_mib": before_mib,
        "daemon_rss_high_mib": high_mib,
        "daemon_rss_growth_mib": high_mib - before_mib,
        "read_alone_ms": alone_s,
        "read_beside_bombs_ms": beside_s,
        "p99_ratio": beside_s["p99"] / alone_s["p99"] if alone_s["p99"] else float("nan"),
    }
