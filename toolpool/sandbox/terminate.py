"""Ending processes: the one place toolpool does it (SPEC D4; STYLE "one function
owns process termination").

``terminate`` sends SIGTERM to a set of processes, waits a grace period, sends
SIGKILL to whatever is left, waits again, and reports how far it had to go. The set
is re-read on every round, so children forked meanwhile are caught too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Protocol

from toolpool.sandbox import linux


class Escalation(IntEnum):
    """How far termination had to go, in order."""

    NOTHING = 0  # nothing was running
    TERM = 1  # everything ended within the grace period after SIGTERM
    KILL = 2  # SIGKILL was needed
    STUCK = 3  # something survived SIGKILL too (uninterruptible sleep)


@dataclass(frozen=True, slots=True)
class TerminationReport:
    escalation: Escalation
    pids: tuple[int, ...]  # every process seen in the set
    seconds: float
    survivors: tuple[int, ...] = ()


class ProcessSet(Protocol):
    """Processes to end: who is in it now, and how to signal all of them."""

    def pids(self) -> set[int]: ...

    def signal(self, sig: int) -> None: ...


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class ProcessTree:
    """A process and all its descendants (or only the descendants)."""

    def __init__(self, root: int, *, include_root: bool = True) -> None:
        self.root = root
        self.include_root = include_root

    def pids(self) -> set[int]:
        found = {p for p in linux.descendants(self.root) if linux.is_running(p)}
        if self.include_root and linux.is_running(self.root):
            found.add(self.root)
        return found

    def signal(self, sig: int) -> None:
        # Parents first, so a parent cannot fork a child we did not see.
        for pid in sorted(self.pids(), key=lambda p: p != self.root):
            _kill(pid, sig)


class ProcessGroup:
    """A process group: what a shell command and the children it forks belong to."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid

    def pids(self) -> set[int]:
        try:
            os.killpg(self.pgid, 0)  # one system call answers "nobody left" at once
        except ProcessLookupError:
            return set()
        except PermissionError:
            pass
        return {p for p in linux.process_group_members(self.pgid) if linux.is_running(p)}

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)


class CgroupMembers:
    """The processes of a cgroup (v1 or v2 ``cgroup.procs``), but for ``keep``."""

    def __init__(self, procs_files: Iterable[Path], keep: Iterable[int] = ()) -> None:
        self.procs_files = list(procs_files)
        self.keep = set(keep)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
        return {p for p in found - self.keep if linux.is_running(p)}

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            _kill(pid, sig)


def environment_marks(name: str) -> dict[int, str]:
    """Every process (of ours to look at) whose environment holds ``name``: pid →
    its value. Reads each process's ``environ``: for termination only."""
    needle = b"\0" + name.encode() + b"="
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = b"\0" + f.read()
        except OSError:
            continue
        at = environ.find(needle)
        if at >= 0:
            start = at + len(needle)
            end = environ.find(b"\0", start)
            found[int(entry.name)] = environ[start : end if end >= 0 else None].decode(
                errors="replace"
            )
    return found


class MarkedProcesses:
    """The processes whose environment has ``name=value``: what a command started,
    wherever it went (setsid, double forks re-parented to init), for machines without
    cgroups. A process that clears its environment leaves the set."""

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self.value = value

    def pids(self) -> set[int]:
        marks = environment_marks(self.name)
        return {p for p, v in marks.items() if v == self.value and linux.is_running(p)}

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            _kill(pid, sig)


class Together:
    """Several sets ended as one (a process group and the tree under a worker…)."""

    def __init__(self, *sets: ProcessSet) -> None:
        self.sets = sets

    def pids(self) -> set[int]:
        return set().union(*(s.pids() for s in self.sets))

    def signal(self, sig: int) -> None:
        for s in self.sets:
            s.signal(sig)


def terminate(
    target: ProcessSet,
    grace: float = 2.0,
    *,
    kill_wait: float = 2.0,
    poll: float = 0.01,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TerminationReport:
    """End every process of ``target``: SIGTERM (with SIGCONT, so stopped processes
    can act on it), up to ``grace`` seconds, then SIGKILL and up to ``kill_wait``.

    ``grace=0`` goes straight to SIGKILL. Zombies count as ended (reaping them is the
    parent's business). ``clock`` and ``sleep`` are injectable for tests.
    """
    started = clock()
    seen = target.pids()
    if not seen:
        return TerminationReport(Escalation.NOTHING, (), 0.0)

    def wait(seconds: float) -> set[int]:
        deadline = clock() + seconds
        while True:
            alive = target.pids()
            seen.update(alive)
            if not alive or clock() >= deadline:
                return alive
            sleep(poll)

    if grace > 0:
        target.signal(signal.SIGTERM)
        target.signal(signal.SIGCONT)
        if not wait(grace):
            return TerminationReport(Escalation.TERM, tuple(sorted(seen)), clock() - started)
    target.signal(signal.SIGKILL)
    survivors = wait(kill_wait)
    if survivors:
        # One more round: something forked between our read and our kill.
        target.signal(signal.SIGKILL)
        survivors = wait(kill_wait)
    escalation = Escalation.STUCK if survivors else Escalation.KILL
    return TerminationReport(
        escalation, tuple(sorted(seen)), clock() - started, tuple(sorted(survivors))
    )
