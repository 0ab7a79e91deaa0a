"""Per-call accounting over the worker's cgroups, and the result of a call a limit
stopped (SPEC X7). The runner starts a watch for each call and ends it after."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass

from toolpool.models import ErrorCode, ToolCall, ToolResult
from toolpool.sandbox.cgroups import CallAccounting
from toolpool.sandbox.limits import Limits, named

# The call watcher looks at the cgroups at least this often (seconds) during a call;
# a tool whose processes it stopped for CPU has CPU_GRACE to return before SIGXCPU.
WATCH_INTERVAL = 0.1
CPU_GRACE = 1.0


@dataclass(slots=True)
class _Watched:
    """One call as the watcher sees it."""

    limits: Limits
    cpu_base: float | None
    oom_base: int
    pids_base: int
    tripped: str | None = None  # "cpu_seconds" or "processes", once acted on
    tripped_at: float = 0.0
    signalled_at: float = -math.inf
    killed: int = 0  # processes the watcher ended


class CallWatch:
    """Per-call accounting over the worker's cgroups (SPEC X7).

    One worker runs one call at a time, so the cgroups' usage delta over a call is the
    call's. A thread, started at the first call, looks at the CPU counter and the pids
    refusals every WATCH_INTERVAL while a call runs — more often as the allowance runs
    out; a call is not announced to it (a call shorter than that is never looked at
    until its end, when the OOM and pids counters are read) — and, when a
    limit is hit, ends the call's processes (SIGKILL to every member but the worker,
    again at each look: a tool may start more) and, for CPU, sends the worker SIGXCPU
    if its own code spends the time or it has not returned after ``CPU_GRACE``.
    Without cgroups it does nothing: RLIMIT_CPU per process is all there is.

    The OOM and pids counters a call starts from are those its predecessor's end
    read: between two calls nothing moves them (the worker forks nothing, and the
    sweep has ended whatever the last call left), so reading them again would cost
    each call two reads (~7 µs) for the same numbers. The runner calls ``rebase``
    after a call a limit stopped, or whose leftovers the sweep ended (their deaths
    come after that read), and a call whose end was never seen starts from fresh
    reads. The CPU counter is read at every start: the worker's own work between
    calls moves it.
    """

    def __init__(self, accounting: CallAccounting | None) -> None:
        self._acct = accounting if accounting is not None and accounting.active else None
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._call: _Watched | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cpus = max(1, len(os.sched_getaffinity(0)))
        self._bases: tuple[int, int] | None = None  # (OOM kills, pids refusals) at the last end

    def begin(self, limits: Limits) -> None:
        acct = self._acct
        if acct is None:
            return
        bases, self._bases = self._bases, None
        oom, pids = bases if bases is not None else (acct.oom_kills(), acct.pids_refusals())
        watched = _Watched(limits, acct.cpu_seconds(), oom, pids)
        with self._cond:
            self._call = watched
            # The watcher looks in every WATCH_INTERVAL anyway: waking it for every
            # call would cost each call a thread switch (~100 µs of the worker's
            # CPU, measured), most of them for calls that end before it looks.
            if limits.cpu_seconds < 2 * WATCH_INTERVAL:
                self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="call-watch", daemon=True)
            self._thread.start()

    def end(self) -> tuple[str, int] | None:
        """The limit that stopped the call, if one did, and how many processes the
        watcher ended."""
        with self._cond:
            watched, self._call = self._call, None
        acct = self._acct
        if watched is None or acct is None:
            return None
        oom, pids = acct.oom_kills(), acct.pids_refusals()
        self._bases = (oom, pids)
        if watched.tripped == "cpu_seconds":
            return "cpu_seconds", watched.killed
        if oom > watched.oom_base:
            return "memory_bytes", watched.killed
        if watched.tripped == "processes" or pids > watched.pids_base:
            return "processes", watched.killed
        return None

    def rebase(self) -> None:
        """Processes of the last call ended after its end: the next call reads the
        counters it starts from anew."""
        self._bases = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._call = None
            self._cond.notify()
        if self._acct is not None:
            self._acct.close()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                watched = self._call
                if watched is None:
                    self._cond.wait(WATCH_INTERVAL)
                    continue
                self._cond.wait(self._look(watched))

    def _look(self, w: _Watched) -> float:
        """Check the call once (the lock is held); the seconds until the next look."""
        acct = self._acct
        assert acct is not None
        now = time.monotonic()
        if w.tripped is None and acct.pids_refusals() > w.pids_base:
            w.tripped, w.tripped_at = "processes", now
        if w.tripped is None and w.cpu_base is not None:
            used = acct.cpu_seconds()
            left = w.limits.cpu_seconds - ((used if used is not None else w.cpu_base) - w.cpu_base)
            if left > 0:
                # All CPUs busy cannot spend the rest sooner than this.
                return min(WATCH_INTERVAL, max(0.01, left / self._cpus))
            w.tripped, w.tripped_at = "cpu_seconds", now
        if w.tripped is None:
            return WATCH_INTERVAL
        w.killed += acct.kill_others(self._pid)
        if (
            w.tripped == "cpu_seconds"
            and (w.killed == 0 or now - w.tripped_at >= CPU_GRACE)
            and now - w.signalled_at >= 1.0
        ):
            w.signalled_at = now
            os.kill(self._pid, signal.SIGXCPU)
        return 0.05


def stopped_by_limit(
    call: ToolCall, result: ToolResult, limits: Limits, name: str, killed: int
) -> ToolResult:
    """``result`` of a call a limit stopped: limit_exceeded, naming the limit and its
    value; what the tool had to say (a command's output) follows."""
    value = named(limits, name)
    if name == "cpu_seconds":
        who = "command" if killed else "tool"
        text = f"The {who} used up its CPU time limit ({value}) and was stopped."
    elif name == "memory_bytes":
        text = (
            f"The command ran out of memory: it went past the memory limit ({value}) "
            "and the kernel killed it."
        )
    else:
        text = f"The command reached the process limit ({value}): it could not start more."
    before = result.text.strip()
    if before:
        text += "\n\n" + before
    details = {**result.details, "limit": name, "limit_value": getattr(limits, name)}
    return ToolResult.error(call, ErrorCode.LIMIT_EXCEEDED, text, details)
