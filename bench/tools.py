"""The tools the bench runs: the same functions for toolpool and for its peers.

The plain functions (``noop``, ``sleep_ms``, ``spin_ms``) are what peers such as
ProcessPoolExecutor call; ``TOOLS`` wraps them for toolpool, plus an async no-op
(``bench_anoop``: what the pipeline costs without a thread) and tools that misbehave
for the interrupt and recovery scenarios.
"""

from __future__ import annotations

import os
import signal
import time

from toolpool import tool


def noop() -> str:
    """Do nothing."""
    return "ok"


async def anoop() -> str:
    """Do nothing, as a coroutine (an async tool runs as a task, not in a thread)."""
    return "ok"


def sleep_ms(ms: float) -> str:
    """I/O-bound: the process waits, the CPU is free."""
    time.sleep(ms / 1000)
    return "slept"


def spin_ms(ms: float) -> int:
    """CPU-bound: spin for ``ms`` milliseconds of this thread's CPU time.

    The thread's clock, not the process's: where a process has a CPU time limit
    (RLIMIT_CPU, which a toolpool worker sets for every call) the kernel reads the
    process clock from the limit's group timer, which lags the threads' real run
    time by up to a tick — a spin on it runs about 10 % longer in real CPU (measured:
    21.7 ms of thread time for "20 ms"), and the same work would not be compared.
    """
    deadline = time.thread_time() + ms / 1000
    n = 0
    while time.thread_time() < deadline:
        n += 1
    return n


bench_noop = tool(read_only=True, name="bench_noop")(noop)
bench_anoop = tool(read_only=True, name="bench_anoop")(anoop)
bench_sleep = tool(read_only=True, name="bench_sleep")(sleep_ms)
bench_spin = tool(read_only=True, name="bench_spin")(spin_ms)


@tool(read_only=True, interrupt_behavior="cancel")
def bench_nap(seconds: float) -> str:
    """Sleep; stops when cancelled (SIGTERM raises in the worker)."""
    time.sleep(seconds)
    return "done"


@tool(read_only=True, interrupt_behavior="cancel")
def bench_stubborn(seconds: float) -> str:
    """Ignore SIGTERM, then sleep: only the kill after the grace period stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return "done"


@tool(read_only=True, interrupt_behavior="block")
def bench_block(seconds: float) -> str:
    """Sleep; an interrupt lets it finish."""
    time.sleep(seconds)
    return "done"


@tool(read_only=True)
def bench_crash() -> str:
    """End the worker process outright."""
    os._exit(3)


TOOLS = [
    bench_noop,
    bench_anoop,
    bench_sleep,
    bench_spin,
    bench_nap,
    bench_stubborn,
    bench_block,
    bench_crash,
]
