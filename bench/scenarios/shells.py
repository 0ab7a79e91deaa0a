"""Scenario shells (SPEC L9): what background shells that flood cost the daemon.

One session starts 16 background ``yes`` (the most a session may run), with a small
``spill_bytes`` so that each is soon past it; once all are, the daemon's CPU time
(``utime + stime`` of every thread, from ``/proc/<pid>/stat``) is read over a few
seconds: CPU-seconds per second, beside the same figure idle. Another client's
session reads a small file, one call at a time, first alone and then beside the
flood: its p50 and p99. At the end, the daemon's count of sandbox starts it retried
(``sandbox_retries``, SPEC X12).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.common import daemon, summary
from bench.format import num, pcells
from toolpool import Client, ToolCall

NAME = "shells"
WORKERS = 2
SHELLS = 16  # a session's cap: the flood of one session
SPILL_BYTES = 1 << 20  # the flooding session's spill_bytes: each shell passes it in well under 1 s
READ_LINES = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY = 0.5  # seconds between two readings of the daemon's CPU time


def daemon_cpu_seconds(pid: int) -> float:
    """The daemon's CPU time so far (user + system, all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14, 15


def cpu_rate(pid: int, seconds: float) -> dict[str, Any]:
    """The daemon's CPU-seconds per second over ``seconds``: the whole window's, and
    the median of its SAMPLE_EVERY pieces."""
    began, used = time.perf_counter(), daemon_cpu_seconds(pid)
    start_t, start_cpu = began, used
    rates = []
    while time.perf_counter() - start_t < seconds:
        time.sleep(SAMPLE_EVERY)
        now, cpu = time.perf_counter(), daemon_cpu_seconds(pid)
        rates.append((cpu - used) / (now - began))
        began, used = now, cpu
    whole = (used - start_cpu) / (began - start_t)
    return {"cpu_per_second": whole, "pieces": summary(rates), "seconds": began - start_t}


def reads(session: Any, path: str, count: int) -> tuple[list[float], int]:
    """``count`` reads of ``path``, one at a time: their wall times (ms), the errors."""
    samples, errors = [], 0
    for i in range(count):
        began = time.perf_counter()
        (result,) = session.submit([ToolCall(f"r{i}", "read", {"path": path})]).results()
        samples.append((time.perf_counter() - began) * 1000)
        errors += result.is_error
    return samples, errors


def _past_spill(client: Client, session_id: str, count: int, timeout: float) -> float | None:
    """Seconds until ``count`` shells of the session hold more than spill_bytes in
    their files (the truncation note after the cut); None when not within ``timeout``."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        shells = client.status()["sessions"].get(session_id, {}).get("shells", [])
        if sum(s["output_bytes"] > SPILL_BYTES for s in shells) >= count:
            return time.perf_counter() - began
        time.sleep(0.1)
    return None


def start_floods(session: Any) -> list[str]:
    """SHELLS background ``yes`` in ``session``: the refusals (none expected)."""
    calls = [
        ToolCall(f"y{i}", "bash", {"command": "yes", "run_in_background": True})
        for i in range(SHELLS)
    ]
    return [r.text for r in session.submit(calls).results() if r.is_error]


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    seconds = 3.0 if quick else 10.0
    count = 100 if quick else 300
    target = workspace / "shells-bench" / "small.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(f"line {i}: a few words of text\n" for i in range(READ_LINES)))
    path = str(target.relative_to(workspace))
    with (
        daemon(WORKERS) as running,
        Client(runtime_dir=running.runtime, name="bench-shells-reader") as reader,
        reader.session(workspace) as reading,
    ):
        pid = int(reader.status()["pid"])
        reads(reading, path, 10)  # warm-up: each worker has read once
        alone, alone_errors = reads(reading, path, count)
        idle = cpu_rate(pid, seconds)
        limits = {"spill_bytes": SPILL_BYTES, "cpu_seconds": 3600.0}  # no end meanwhile
        with (
            Client(runtime_dir=running.runtime, name="bench-shells-flood") as flooder,
            flooder.session(workspace, limits=limits) as flood,
        ):
            refused = start_floods(flood)
            to_cap = _past_spill(reader, flood.id, SHELLS - len(refused), 60.0)
            flooding = cpu_rate(pid, seconds)
            during, during_errors = reads(reading, path, count)
            shells = reader.status()["sessions"].get(flood.id, {}).get("shells", [])
            states = sorted({s["state"] for s in shells})
        final = reader.status()
    return {
        "shells": SHELLS,
        "spill_bytes": SPILL_BYTES,
        "started": SHELLS - len(refused),
        "refused": refused[:3],
        "seconds_to_pass_spill_bytes": to_cap,
        "states_while_measured": states,  # all "running": the flood is slowed, not killed
        "daemon_cpu_idle": idle,
        "daemon_cpu_flood": flooding,
        "read_ms_alone": summary(alone),
        "read_ms_during_flood": summary(during),
        "read_errors": alone_errors + during_errors,
        "read_samples_ms": {"alone": alone, "during_flood": during},
        "sandbox_retries": final.get("sandbox_retries"),
    }


def report(sh: dict[str, Any]) -> list[str]:
    """The report's section: the daemon's CPU beside the floods, the other session's reads."""
    idle, flood = sh["daemon_cpu_idle"], sh["daemon_cpu_flood"]
    to_cap = sh["seconds_to_pass_spill_bytes"]
    passed = "never" if to_cap is None else f"{to_cap:.1f} s after the turn that started them"
    retries = sh.get("sandbox_retries")
    lines = [
        "",
        f"## Background shells: {sh['started']} `yes` in one session, past spill_bytes",
        "",
        f"spill_bytes {sh['spill_bytes']:,}: every shell was past it {passed}; their state "
        f"while measured: {', '.join(sh['states_while_measured']) or '–'}. The daemon's CPU "
        "from `/proc/<pid>/stat` (user + system, all threads), over "
        f"{flood['seconds']:.1f} s, and its median over {SAMPLE_EVERY} s pieces.",
        "",
        "| daemon | CPU-s/s | median of the pieces | max piece |",
        "|---|---:|---:|---:|",
        f"| idle | {num(idle['cpu_per_second'], 3)} | {num(idle['pieces']['p50'], 3)} | "
        f"{num(idle['pieces']['max'], 3)} |",
        f"| {sh['started']} shells flooding | {num(flood['cpu_per_second'], 3)} | "
        f"{num(flood['pieces']['p50'], 3)} | {num(flood['pieces']['max'], 3)} |",
        "",
        "| another session's read of a small file | n | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
        f"| alone | {sh['read_ms_alone']['n']} | {pcells(sh['read_ms_alone'], 2)} |",
        f"| beside the flood | {sh['read_ms_during_flood']['n']} | "
        f"{pcells(sh['read_ms_during_flood'], 2)} |",
        "",
        f"Sandbox starts retried (X12, the daemon's `sandbox_retries`): "
        f"{'not counted by this daemon' if retries is None else retries}.",
    ]
    if sh["refused"]:
        lines += ["", f"Refused starts: {'; '.join(sh['refused'])}"]
    return lines
