"""What bounds background shells (SPEC L9), decided here without I/O: how many may run
— per session, per client, in the daemon — and which limit ended one, named as the
model reads it. The supervisor (``shells.py``) reads the counters and acts.
"""

from __future__ import annotations

import signal
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from toolpool.background import ShellState
from toolpool.sandbox.limits import Limits, named

MAX_RUNNING_PER_SESSION = 16  # not a setting: a session that needs more is a runaway


@dataclass(frozen=True, slots=True)
class ShellCaps:
    """How many background shells may run at once: one session's, one client's (all
    its sessions), the daemon's."""

    per_client: int = 32  # setting max_background_shells_per_client
    total: int = 256  # setting max_background_shells
    per_session: int = MAX_RUNNING_PER_SESSION

    def refusal(
        self, running: Iterable[tuple[str, Hashable | None]], session: str, client: Hashable | None
    ) -> str | None:
        """Why one more shell of ``session`` (of ``client``, None when not known) may
        not start, given the (session, client) of each running one; None when it may."""
        shells = list(running)
        mine = sum(1 for s, _ in shells if s == session)
        if mine >= self.per_session:
            return (
                f"This session already runs {mine} background shells, the most a session "
                f"may ({self.per_session}): end one with kill_shell first."
            )
        theirs = sum(1 for _, c in shells if client is not None and c == client)
        if theirs >= self.per_client:
            return (
                f"This client already runs {theirs} background shells in its sessions, the "
                f"most it may (max_background_shells_per_client = {self.per_client}): end "
                "one with kill_shell first."
            )
        if len(shells) >= self.total:
            return (
                f"The daemon already runs {len(shells)} background shells, the most it may "
                f"(max_background_shells = {self.total}): end one with kill_shell, or try "
                "again later."
            )
        return None


@dataclass(frozen=True, slots=True)
class LimitEnd:
    """A limit that ended a shell: its name and value, and why, as the state line
    says it ("was killed (it used up its CPU time limit (cpu_seconds = 5))")."""

    name: str
    value: float | int
    reason: str


def _of(limits: Limits, name: str) -> LimitEnd:
    value = getattr(limits, name)
    match name:
        case "cpu_seconds":
            why = "it used up its CPU time limit"
        case "memory_bytes":
            why = "it ran out of memory"
        case _:
            why = "it reached its process limit"
    return LimitEnd(name, value, f"{why} ({named(limits, name)})")


def wall_time(seconds: float) -> LimitEnd:
    """The daemon's ``background_wall_seconds``, reached."""
    return LimitEnd("background_wall_seconds", seconds, f"background_wall_seconds = {seconds:g}")


def reached(limits: Limits, cpu_used: float | None, pids_refusals: int) -> LimitEnd | None:
    """A running shell's limit that is spent, from its cgroup's counters: CPU time over
    ``cpu_seconds``, or a fork the pids limit refused (a foreground call is stopped
    then too, SPEC X7); None while neither."""
    if cpu_used is not None and cpu_used > limits.cpu_seconds:
        return _of(limits, "cpu_seconds")
    if pids_refusals > 0:
        return _of(limits, "processes")
    return None


def overrun(
    limits: Limits,
    now: float,
    deadline: float,
    wall_seconds: float,
    counters: tuple[float | None, int] | None,
) -> tuple[ShellState, LimitEnd] | None:
    """Whether a running shell must end now, and as what: past its ``deadline``
    (monotonic) it timed out; past a limit its cgroup's ``counters`` (CPU seconds,
    pids refusals; None: no counters to read) show, it is killed."""
    if now >= deadline:
        return ShellState.TIMED_OUT, wall_time(wall_seconds)
    if counters is None:
        return None
    limit = reached(limits, *counters)
    return None if limit is None else (ShellState.KILLED, limit)


def at_exit(
    limits: Limits, code: int, cpu_used: float | None, oom_kills: int, pids_refusals: int
) -> LimitEnd | None:
    """The limit that ended a shell whose process ended before the watch saw one;
    None when the end was its own. Three cases: the kernel's OOM killer in its
    cgroup; the per-process RLIMIT_CPU (the backstop, ``cpu_seconds`` rounded up),
    which ends a lone CPU hog about when the cgroup's total passes the limit, before
    the watch's next look — a death by its SIGXCPU, or by the SIGKILL a second after
    (for a command that ignores SIGXCPU) with the CPU time spent; and a fork its pids
    limit refused. The rlimit's clock is sampled at ticks and may run ahead of the
    cgroup's, so SIGXCPU is the sign, not the cgroup's total."""
    if oom_kills > 0:
        return _of(limits, "memory_bytes")
    signalled = -code if code < 0 else code - 128 if code > 128 else 0
    spent = cpu_used is not None and cpu_used >= limits.cpu_seconds
    if signalled == signal.SIGXCPU or (signalled == signal.SIGKILL and spent):
        return _of(limits, "cpu_seconds")
    return reached(limits, None, pids_refusals)
