"""Resource limits of a call (SPEC D3): what they are, how they merge, how rlimits
carry them in a process.

The coordinator enforces ``wall_seconds`` (a timer) and the worker ``output_bytes``
(it counts); the kernel enforces the rest through rlimits and, where writable,
cgroups (cgroups.py). Where the worker can read its cgroup, ``cpu_seconds`` is
counted over every process of the call and enforced by the worker's watcher
(worker/runner.py, SPEC X7); RLIMIT_CPU stays as the per-process backstop.
``tmp_bytes`` sizes a command's private /tmp (a tmpfs) and ``spill_bytes`` caps the
spill file of a command's output (SPEC X8).
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-call limits. Every field can be set per session and per tool."""

    wall_seconds: float = 120.0  # a call running longer is cancelled, then killed
    cpu_seconds: float = 60.0  # the call's cgroup CPU time; RLIMIT_CPU per process too
    memory_bytes: int = 1024 * MiB  # the worker's memory cgroup, else RLIMIT_AS growth
    processes: int = 256  # pids cgroup (RLIMIT_NPROC does not bind root)
    file_size_bytes: int = 1024 * MiB  # RLIMIT_FSIZE: no file written bigger
    output_bytes: int = 10 * MiB  # result and printed output a call may return
    open_files: int = 1024  # RLIMIT_NOFILE
    tmp_bytes: int = 256 * MiB  # size of a command's private /tmp (tmpfs)
    spill_bytes: int = 64 * MiB  # a command's output kept in its spill file
    network: bool = False  # commands tools start may reach the network

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "network" and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"limit {f.name} must be a positive number, not {value!r}")

    def merged(self, overrides: Mapping[str, Any] | None) -> Limits:
        """These limits with ``overrides`` applied; unknown names are an error."""
        if not overrides:
            return self
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {sorted(known)}")
        return dataclasses.replace(self, **dict(overrides))

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies, and this runs for every call.
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        return cls().merged(data)


_FIELDS = tuple(f.name for f in dataclasses.fields(Limits))


def named(limits: Limits, name: str) -> str:
    """``name = value`` as a message names a limit: "cpu_seconds = 3"."""
    value = getattr(limits, name)
    return f"{name} = {value:g}" if isinstance(value, float) else f"{name} = {value}"


def _set(which: int, soft: int, hard: int | None = None) -> None:
    """Set an rlimit, never above the current hard limit (we may not raise it)."""
    _cur_soft, cur_hard = resource.getrlimit(which)
    cap = cur_hard if cur_hard != resource.RLIM_INFINITY else None
    if hard is None:
        hard = cur_hard
    elif cap is not None:
        hard = min(hard, cap)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def apply_process_limits(limits: Limits) -> None:
    """Limits a worker sets once, at start: no core dumps, bounded open files, and
    SIGXFSZ ignored so that an oversized write fails with EFBIG instead of killing
    the process (children inherit the ignored disposition through exec)."""
    _set(resource.RLIMIT_CORE, 0, 0)
    _set(resource.RLIMIT_NOFILE, limits.open_files, limits.open_files)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class CallLimits:
    """A worker's per-call soft rlimits, moved only when a call needs them moved.

    RLIMIT_CPU counts the process's whole life, so a call's allowance is "CPU used so
    far + the allowance" (SIGXCPU when spent, every second after). A worker does next
    to nothing between calls, so nothing is put back after a call: the CPU soft limit
    moves only when the next call would start with less than its allowance (or much
    more), and the file-size limit only when it differs from the last call's. Hard
    limits stay where they are: lowering one cannot be undone without privilege, and a
    tool that ignores SIGXCPU still meets its wall-time limit. RLIMIT_AS, used when no
    memory cgroup does the job, bounds each call's growth over the address space the
    worker already has.
    """

    def __init__(self, *, limit_address_space: bool) -> None:
        self.limit_address_space = limit_address_space
        self._fsize: int | None = None
        self._statm: int | None = None  # /proc/self/statm, open while RLIMIT_AS is used

    def apply(self, limits: Limits, cpu_used: float | None = None) -> None:
        """Move the soft limits for a call; ``cpu_used`` is the process's CPU time so
        far (user + system), when the caller has just read its rusage."""
        if cpu_used is None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu_used = usage.ru_utime + usage.ru_stime
        allowance = max(1, math.ceil(limits.cpu_seconds))
        soft = resource.getrlimit(resource.RLIMIT_CPU)[0]
        remaining = math.inf if soft == resource.RLIM_INFINITY else soft - cpu_used
        if not allowance <= remaining <= allowance + 1:
            _set(resource.RLIMIT_CPU, math.ceil(cpu_used) + allowance)
        if limits.file_size_bytes != self._fsize:
            _set(resource.RLIMIT_FSIZE, limits.file_size_bytes)
            self._fsize = limits.file_size_bytes
        if self.limit_address_space:
            _set(resource.RLIMIT_AS, self._address_space() + limits.memory_bytes)

    def _address_space(self) -> int:
        """The process's current virtual size in bytes (VmSize): the first field of
        /proc/self/statm, in pages. statm is a fraction of the cost of status (which
        the kernel writes out whole for every read), and it stays open: a pread from
        offset 0 is a fresh answer."""
        if self._statm is None:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(self._statm, 64, 0).split()[0]) * _PAGE_SIZE

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
