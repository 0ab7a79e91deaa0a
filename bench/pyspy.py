"""A profile of a running process by py-spy, summarised: where its Python spends the
time, by function, while the bench drives a load.

py-spy samples the process from outside (``--nonblocking``: without pausing it) and
keeps only samples in which a thread holds the GIL (``--gil``), so the shares are of
the time the daemon's Python runs, not of the time it waits.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RATE = 400  # samples per second
TOP = 30  # functions kept in the results (the report shows fewer)
_LINE = re.compile(r":\d+\)$")  # "f (file.py:12)" → "f (file.py)": lines of one function


def executable() -> str | None:
    """py-spy next to this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record(pid: int, seconds: int, load: Callable[[], None]) -> dict[str, Any]:
    """Profile ``pid`` for ``seconds`` while calling ``load()`` over and over; the
    summary, or ``{"error": why}`` when py-spy is missing or fails (no ptrace…)."""
    spy = executable()
    if spy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    with tempfile.TemporaryDirectory(prefix="toolpool-pyspy-") as tmp:
        out, log = Path(tmp) / "profile.txt", Path(tmp) / "py-spy.log"
        argv = [spy, "record", "--format", "raw", "--gil", "--nonblocking"]
        argv += ["-r", str(RATE), "-d", str(seconds), "-p", str(pid), "-o", str(out)]
        with log.open("wb") as errors:
            process = subprocess.Popen(argv, stdout=errors, stderr=errors)
        began = time.perf_counter()
        loads = drive(process, load, seconds)
        wall = time.perf_counter() - began
        said = log.read_text(errors="replace").strip()
        if process.returncode != 0 or not out.exists():
            last = said.splitlines()[-1] if said else "no output"
            return {"error": f"py-spy exited with {process.returncode}: {last}"}
        summary = summarise(out.read_text(), RATE, seconds)
    return summary | {"loads": loads, "load_seconds": round(wall, 2)}


def drive(process: subprocess.Popen[bytes], load: Callable[[], None], seconds: int) -> int:
    """Call ``load()`` over and over while the profiler ``process`` samples (killed
    when it outlives ``seconds`` by 30 s); how many loads ran."""
    loads = 0
    deadline = time.monotonic() + seconds + 30
    try:
        while process.poll() is None and time.monotonic() < deadline:
            load()
            loads += 1
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    return loads


def summarise(raw: str, rate: int, seconds: float) -> dict[str, Any]:
    """Functions by self samples (the innermost frame) and by inclusive samples (on
    the stack at all), in percent of every sample. The inclusive list leaves out a
    function that only ever calls one other and never runs itself (``runpy`` → ``main``
    → … → the event loop): the chain shows once, as its last link."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    callees: dict[str, set[str | None]] = collections.defaultdict(set)
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
        for caller, callee in zip(frames, [*frames[1:], None], strict=True):
            callees[caller].add(callee)
    wrappers = {f for f, called in callees.items() if len(called) == 1 and None not in called}

    def top(counter: collections.Counter[str], skip: set[str]) -> list[dict[str, Any]]:
        rows = [(f, n) for f, n in counter.most_common() if f not in skip]
        return [{"function": f, "percent": round(100 * n / total, 2)} for f, n in rows[:TOP]]

    return {
        "samples": total,
        "rate": rate,
        "seconds": seconds,
        # samples are taken only while a thread holds the GIL
        "gil_held_share": round(total / (rate * seconds), 3) if seconds else None,
        "self": top(own, set()),
        "inclusive": top(inclusive, wrappers),
    }
