"""CPU time per call, per process and per thread, read from the kernel.

A process's total is its CPU clock (``clock_gettime`` on the process's CPU-time clock:
nanoseconds of user + system time, ended threads included). A thread's is the first
field of ``/proc/PID/task/TID/schedstat`` (nanoseconds on the CPU). User and system
apart come from ``/proc/PID/stat`` in clock ticks (10 ms): coarse over a short run.
Threads are told apart by their kernel name: ZeroMQ names its I/O threads
``ZMQbg/…``; Python threads keep the process's name.

``StackMeter`` puts the daemon, the client (this process), the workers and the zygote
together: two snapshots and a count of calls give µs per call for each.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_CPUCLOCK_SCHED = 2  # the kernel's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


def process_cpu_ns(pid: int) -> int | None:
    """The process's CPU time in ns (every thread, ended ones too); None when gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class ThreadTime:
    name: str
    cpu_ns: int


@dataclass(frozen=True, slots=True)
class ProcessTime:
    pid: int
    cpu_ns: int
    user: float  # seconds, from clock ticks
    system: float
    children: float  # user + system of reaped children (commands it ran), seconds
    threads: Mapping[int, ThreadTime]


def threads_of(pid: int) -> dict[int, ThreadTime]:
    """Each live thread's name and CPU time; threads that end while read are left out."""
    found: dict[int, ThreadTime] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                cpu_ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        found[int(tid)] = ThreadTime(name, cpu_ns)
    return found


def read(pid: int, *, threads: bool = True) -> ProcessTime | None:
    """The process's times now; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # After the name: state is field 3 of proc(5), utime 14, stime 15, cutime 16, cstime 17.
    utime, stime, cutime, cstime = (int(v) / CLOCK_TICKS for v in fields[11:15])
    cpu_ns = process_cpu_ns(pid)
    if cpu_ns is None:
        return None
    return ProcessTime(
        pid, cpu_ns, utime, stime, cutime + cstime, threads_of(pid) if threads else {}
    )


def foreign_threads() -> set[int]:
    """Native ids of this process's Python threads other than the calling one (the
    bench's progress display…): not the client's, left out of its figures."""
    me = threading.get_native_id()
    return {t.native_id for t in threading.enumerate() if t.native_id not in (None, me)}


def _thread_delta(a: ProcessTime, b: ProcessTime, tids: AbstractSet[int]) -> int:
    """CPU ns of the threads ``tids`` between two reads (a thread new in ``b``
    counts from zero)."""
    total = 0
    for tid in tids:
        if tid in b.threads:
            before = a.threads[tid].cpu_ns if tid in a.threads else 0
            total += b.threads[tid].cpu_ns - before
    return total


def split(
    a: ProcessTime, b: ProcessTime, main: int, exclude: AbstractSet[int] = frozenset()
) -> dict[str, int]:
    """A process's CPU ns between two reads: total (but ``exclude``'s threads),
    its ``main`` thread, ZeroMQ's I/O threads, and the rest (ended threads included)."""
    zmq = {t for t, v in b.threads.items() if v.name.startswith("ZMQbg")}
    total = (b.cpu_ns - a.cpu_ns) - _thread_delta(a, b, exclude)
    main_ns = _thread_delta(a, b, {main})
    zmq_ns = _thread_delta(a, b, zmq)
    return {
        "total": total,
        "main": main_ns,
        "zmq": zmq_ns,
        "other": total - main_ns - zmq_ns,
    }


@dataclass(frozen=True, slots=True)
class StackSnapshot:
    at: float
    daemon: ProcessTime | None
    client: ProcessTime | None
    client_children: float  # RUSAGE_CHILDREN user + system of this process, seconds
    zygotes: Mapping[int, ProcessTime]
    workers: Mapping[int, ProcessTime]


class StackMeter:
    """CPU per call of the daemon (``daemon_pid``; None for an in-process run), of the
    client (this process: the calling thread, ZeroMQ's, any other but the bench's
    own threads), of the workers (the zygote's children) and of the zygote."""

    def __init__(self, daemon_pid: int | None) -> None:
        self.daemon_pid = daemon_pid
        self.main = threading.get_native_id()
        self.foreign = foreign_threads()

    def _pool(self) -> tuple[list[int], list[int]]:
        if self.daemon_pid is None:
            return [], []
        try:
            children = psutil.Process(self.daemon_pid).children()
            zygotes = [c for c in children if "toolpool.worker.zygote" in " ".join(c.cmdline())]
            workers = [w.pid for z in zygotes for w in z.children()]
        except psutil.Error:
            return [], []
        return [z.pid for z in zygotes], workers

    def snapshot(self) -> StackSnapshot:
        zygotes, workers = self._pool()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)

        def table(pids: list[int]) -> dict[int, ProcessTime]:
            return {p: t for p in pids if (t := read(p)) is not None}

        return StackSnapshot(
            at=time.perf_counter(),
            daemon=None if self.daemon_pid is None else read(self.daemon_pid),
            client=read(os.getpid()),
            client_children=usage.ru_utime + usage.ru_stime,
            zygotes=table(zygotes),
            workers=table(workers),
        )

    def per_call(self, a: StackSnapshot, b: StackSnapshot, calls: int) -> dict[str, Any]:
        """µs per call of each process (and thread group) between two snapshots."""

        def us(ns: float) -> float:
            return ns / 1000 / calls

        out: dict[str, Any] = {"calls": calls, "wall": (b.at - a.at) * 1e6 / calls}
        if a.client is not None and b.client is not None:
            parts = split(a.client, b.client, self.main, self.foreign)
            out["client"] = {k: us(v) for k, v in parts.items()}
            out["client"]["commands"] = us((b.client_children - a.client_children) * 1e9)
        if a.daemon is not None and b.daemon is not None:
            parts = split(a.daemon, b.daemon, a.daemon.pid)
            out["daemon"] = {k: us(v) for k, v in parts.items()}
            out["daemon"]["user"] = us((b.daemon.user - a.daemon.user) * 1e9)
            out["daemon"]["system"] = us((b.daemon.system - a.daemon.system) * 1e9)
        if self.daemon_pid is not None:
            kept = a.workers.keys() & b.workers.keys()
            new = b.workers.keys() - a.workers.keys()
            cpu = sum(b.workers[p].cpu_ns - a.workers[p].cpu_ns for p in kept)
            cpu += sum(b.workers[p].cpu_ns for p in new)  # started meanwhile: all of it
            commands = sum(b.workers[p].children - a.workers[p].children for p in kept)
            commands += sum(b.workers[p].children for p in new)
            out["workers"] = {
                "total": us(cpu),
                "commands": us(commands * 1e9),
                "user": us(sum(b.workers[p].user - a.workers[p].user for p in kept) * 1e9),
                "system": us(sum(b.workers[p].system - a.workers[p].system for p in kept) * 1e9),
                "count": len(b.workers),
                # a worker that ended meanwhile took its CPU time since ``a`` with it
                "ended": len(a.workers.keys() - b.workers.keys()),
                "started": len(new),
            }
            both = a.zygotes.keys() & b.zygotes.keys()
            zygote = sum(b.zygotes[p].cpu_ns - a.zygotes[p].cpu_ns for p in both)
            out["zygote"] = {"total": us(zygote)}
        return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number across runs of the same shape (nested dicts)."""
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = median_of([r[key] for r in runs])
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
        else:
            out[key] = value
    return out
