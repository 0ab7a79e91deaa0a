"""Scenario 5, recovery: from a worker's crash to its replacement being ready (the
pool times it exactly: the zygote's exit report → the new worker's Ready), what
crashes do to a stream of calls running beside them, and from a SIGKILLed zygote to
a working pool again (SPEC L1: the zygote and its workers replaced)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import Daemon, daemon, summary
from toolpool import Client, ToolCall

NAME = "recovery"
WORKERS = 2


def _stream(session: Any, seconds: float, start: float) -> tuple[list[tuple[float, float]], int]:
    """No-op calls one after another: (seconds since start, latency ms) each, and how
    many of them ended in an error."""
    samples = []
    errors = 0
    i = 0
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        (result,) = session.submit([ToolCall(f"s{i}", "bench_noop", {})]).results()
        samples.append((began - start, (time.perf_counter() - began) * 1000))
        errors += result.is_error
        i += 1
    return samples, errors


def _zygote(running: Daemon) -> int:
    (pid,) = [
        child.pid
        for child in psutil.Process(running.pid).children()
        if "toolpool.worker.zygote" in " ".join(child.cmdline())
    ]
    return pid


def _zygote_kills(running: Daemon, workspace: Path, kills: int) -> dict[str, Any]:
    """SIGKILL the daemon's zygote ``kills`` times, from a steady pool each time; time
    each kill → the first call submitted after it that succeeds on a new zygote's
    worker (calls in between may end lost, or wait for the new workers)."""
    working_ms: list[float] = []
    lost = 0
    with (
        Client(runtime_dir=running.runtime, timeout=60) as client,
        client.session(workspace, max_tool_errors=0) as session,
    ):
        for i in range(kills):
            status = client.status()
            while status["workers"]["idle"] < WORKERS:  # all back: a steady pool
                time.sleep(0.05)
                status = client.status()
            replaced = status["zygotes_replaced"]
            killed = time.perf_counter()
            os.kill(_zygote(running), signal.SIGKILL)
            for n in range(1000):
                (result,) = session.submit([ToolCall(f"z{i}.{n}", "bench_noop", {})]).results()
                lost += result.is_error
                if not result.is_error and client.status()["zygotes_replaced"] > replaced:
                    break  # it ran on a new worker: the pool works again
            working_ms.append((time.perf_counter() - killed) * 1000)
        recovery_ms = list(client.status()["zygote_recovery_ms"])[-kills:]
    return {
        "working_ms": working_ms,
        "working_summary_ms": summary(working_ms),
        "recovery_ms": recovery_ms,  # the pool's own: death noticed → a new worker ready
        "recovery_summary_ms": summary(recovery_ms),
        "calls_lost": lost,
    }


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    crashes = 5 if quick else 30
    seconds = 1.5 if quick else 6.0
    with daemon(WORKERS) as running, Client(runtime_dir=running.runtime) as client:
        # max_tool_errors=0: the breaker would stop a tool that crashes three times.
        with client.session(workspace, max_tool_errors=0) as session:
            for i in range(crashes):
                (result,) = session.submit([ToolCall(f"x{i}", "bench_crash", {})]).results()
                assert result.error_code is not None and result.error_code.value == "worker_lost"
                time.sleep(0.05)
            time.sleep(0.3)
            replacement_ms = list(client.status()["replacement_ms"])[-crashes:]

        # A stream of calls, first alone, then with a crash every 300 ms beside it.
        with client.session(workspace) as session:
            baseline, _ = _stream(session, seconds / 2, time.perf_counter())
        crash_times: list[float] = []
        start = time.perf_counter()

        def crasher() -> None:
            with (
                Client(runtime_dir=running.runtime) as other,
                other.session(workspace, max_tool_errors=0) as s,
            ):
                i = 0
                while time.perf_counter() - start < seconds - 0.3:
                    time.sleep(0.3)
                    crash_times.append(time.perf_counter() - start)
                    s.submit([ToolCall(f"k{i}", "bench_crash", {})]).results()
                    i += 1

        thread = threading.Thread(target=crasher)
        thread.start()
        with client.session(workspace) as session:
            stream, errors = _stream(session, seconds, start)
        thread.join()
        zygote = _zygote_kills(running, workspace, 3 if quick else 10)
    return {
        "replacement_ms": replacement_ms,
        "replacement_summary_ms": summary(replacement_ms),
        "stream": {
            "baseline_ms": summary([ms for _, ms in baseline]),
            "with_crashes_ms": summary([ms for _, ms in stream]),
            "samples": stream,
            "crash_times": crash_times,
            "errors": errors,  # calls of the stream that failed: crashes beside it
        },
        "zygote": zygote,
    }
