"""Where a process's CPU goes by library: ``perf`` samples it while the bench drives a
load, and the report counts the samples by the shared object they fell in (the
CPython interpreter, the kernel, libzmq, uvloop's loop, msgpack…) and by thread.

A profile of Python functions (``pyspy.py``) cannot say this: time in C code counts
for the Python function that called it. This does — how much of the daemon's CPU is
the event loop's own machinery (uvloop's ``loop`` module, asyncio's C tasks and
futures) against the interpreter running toolpool's Python, the system calls and
ZeroMQ.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.pyspy import drive

RATE = 999  # samples per second (an odd rate: not in step with a timer)
_ROW = re.compile(r"^\s*([\d.]+)%\s+(\S.*?)\s*$")
_SAMPLES = re.compile(r"^# Samples: (\d+)([KM]?) ")

# What each shared object is, for the report; others are named as perf names them.
ROLES = (
    ("libpython", "the CPython interpreter: toolpool's and the standard library's Python"),
    ("[kernel", "the kernel: system calls (sockets, epoll, eventfd), page faults"),
    ("libc", "libc: malloc, memcpy, the system call wrappers"),
    ("libzmq", "libzmq: the sockets' queues and the I/O thread's work"),
    ("_zmq.", "pyzmq's Cython layer"),
    ("loop.", "uvloop's event loop"),
    ("_asyncio", "asyncio's C tasks and futures"),
    ("_cmsgpack", "msgpack: the wire codec"),
)


def role(library: str) -> str:
    return next((what for prefix, what in ROLES if library.startswith(prefix)), "")


def record(pid: int, seconds: int, load: Callable[[], None]) -> dict[str, Any]:
    """Sample ``pid`` for ``seconds`` while calling ``load()`` over and over; shares by
    library and by thread, or ``{"error": why}`` when perf is missing or refused."""
    perf = shutil.which("perf")
    if perf is None:
        return {"error": "perf is not installed (Debian: apt install linux-perf)"}
    with tempfile.TemporaryDirectory(prefix="toolpool-perf-") as tmp:
        data, log = Path(tmp) / "perf.data", Path(tmp) / "perf.log"
        argv = [perf, "record", "-F", str(RATE), "-p", str(pid), "-o", str(data)]
        with log.open("wb") as said:
            process = subprocess.Popen(
                [*argv, "--", "sleep", str(seconds)], stdout=said, stderr=said
            )
        loads = drive(process, load, seconds)
        if process.returncode != 0 or not data.exists():
            lines = log.read_text(errors="replace").strip().splitlines()
            return {"error": f"perf exited with {process.returncode}: {lines[-1] if lines else ''}"}
        by_library, samples = _report(perf, data, "dso")
        by_thread, _ = _report(perf, data, "comm")
    if not by_library:
        return {"error": "perf recorded no samples"}
    return {
        "rate": RATE,
        "seconds": seconds,
        "samples": samples,
        "loads": loads,
        "by_library": [{"library": name, "percent": p} for name, p in by_library],
        "by_thread": [{"thread": name, "percent": p} for name, p in by_thread],
    }


def _report(perf: str, data: Path, key: str) -> tuple[list[tuple[str, float]], int]:
    argv = [perf, "report", "-i", str(data), "--stdio", "--sort", key, "-g", "none"]
    argv += ["--no-children", "--percent-limit", "0.1"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return parse(done.stdout)


def parse(text: str) -> tuple[list[tuple[str, float]], int]:
    """``perf report --stdio`` rows as (name, percent), and the sample count."""
    rows: list[tuple[str, float]] = []
    samples = 0
    for line in text.splitlines():
        counted = _SAMPLES.match(line)
        if counted:
            samples = int(counted.group(1)) * {"": 1, "K": 1000, "M": 1_000_000}[counted.group(2)]
        elif not line.startswith("#") and (row := _ROW.match(line)):
            rows.append((row.group(2), float(row.group(1))))
    return rows, samples
