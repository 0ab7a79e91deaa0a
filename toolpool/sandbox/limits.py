"""Resource limits of a call (SPEC D3): what they are, how they merge, how rlimits
carry them in a process.

The coordinator enforces ``wall_seconds`` (a timer) and the worker ``output_bytes``
(it counts); the kernel enforces the rest through rlimits and, where writable,
cgroups (cgroups.py).
"""

from __future__ import annotations

import dataclasses
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
    cpu_seconds: float = 60.0  # RLIMIT_CPU, moved per call
    memory_bytes: int = 1024 * MiB  # the worker's memory cgroup, else RLIMIT_AS growth
    processes: int = 256  # pids cgroup (RLIMIT_NPROC does not bind root)
    file_size_bytes: int = 1024 * MiB  # RLIMIT_FSIZE: no file written bigger
    output_bytes: int = 10 * MiB  # result and printed output a call may return
    open_files: int = 1024  # RLIMIT_NOFILE
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
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        return cls().merged(data)


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


@dataclass(frozen=True, slots=True)
class SavedLimits:
    cpu: tuple[int, int]
    fsize: tuple[int, int]
    address_space: tuple[int, int]


def apply_call_limits(limits: Limits, *, limit_address_space: bool) -> SavedLimits:
    """Move the soft limits for one call; ``restore_call_limits`` puts them back.

    RLIMIT_CPU counts the process's whole life, so the soft limit becomes "CPU used
    so far + this call's allowance" (SIGXCPU then, every second). Hard limits stay
    where they are: lowering one cannot be undone without privilege, and a tool that
    ignores SIGXCPU still meets its wall-time limit. RLIMIT_AS, when no memory
    cgroup does the job, bounds the call's growth over the address space the worker
    already has.
    """
    saved = SavedLimits(
        resource.getrlimit(resource.RLIMIT_CPU),
        resource.getrlimit(resource.RLIMIT_FSIZE),
        resource.getrlimit(resource.RLIMIT_AS),
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime)
    allowance = max(1, int(limits.cpu_seconds + 0.999))
    _set(resource.RLIMIT_CPU, used + allowance)
    _set(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    if limit_address_space:
        _set(resource.RLIMIT_AS, _address_space() + limits.memory_bytes)
    return saved


def restore_call_limits(saved: SavedLimits) -> None:
    for which, value in (
        (resource.RLIMIT_FSIZE, saved.fsize),
        (resource.RLIMIT_AS, saved.address_space),
        (resource.RLIMIT_CPU, saved.cpu),
    ):
        resource.setrlimit(which, value)


def _address_space() -> int:
    """The process's current virtual size in bytes (VmSize)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
