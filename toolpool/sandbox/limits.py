"""Resource limits of a call (SPEC D3): what they are, how they merge, and their one
mapping to the kernel.

The coordinator enforces ``wall_seconds`` (a timer) and the worker ``output_bytes``
(it counts); the kernel enforces the rest, through rlimits (``rlimits``: the one
mapping, for a worker, each of its calls and a background shell alike) and, where
writable, cgroups (``CgroupLimits``: the part of the limits a cgroup carries, written
by ``CgroupLimits.write``; cgroups.py knows the kernel's files). Where the worker can
read its cgroup, ``cpu_seconds`` is counted over every process of the call and
enforced by the worker's watcher (worker/runner.py, SPEC X7); RLIMIT_CPU stays as the
per-process backstop. ``tmp_bytes`` sizes a command's private /tmp (a tmpfs) and
``spill_bytes`` caps the spill file of a command's output (SPEC X8).
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolpool.sandbox.cgroups import WorkerCgroup

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
        for name in _FIELDS:
            value = getattr(self, name)
            why = refusal(name, value)
            if why is not None:
                raise ValueError(f"limit {name} = {_short(value)}: {why}")

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
# Each limit's type by name ("int", "float", "bool"), as its annotation spells it.
_KINDS = {f.name: str(getattr(f.type, "__name__", f.type)) for f in dataclasses.fields(Limits)}

# The most a limit may be: what the kernel takes where it carries one. rlimits and the
# memory cgroup take a C long (past it a value is refused, or wraps: a v1 memory
# cgroup reads 2**64 as 0); pids.max takes PID_MAX_LIMIT at most (64-bit Linux).
_KERNEL_MOST = 2**63 - 1
_MOST = {"processes": 4 * 1024 * 1024}


def refusal(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the limit ``name`` ("expected an integer more than 0"),
    or None when it can: the one rule, which ``Limits`` keeps and a session's limits
    (``toolpool.session_options``) are checked by. ``name`` must be a limit's."""
    kind = _KINDS[name]
    if kind == "bool":
        return None if isinstance(value, bool) else "expected true or false"
    what = "an integer" if kind == "int" else "a number"
    number = int if kind == "int" else int | float
    if isinstance(value, bool) or not isinstance(value, number) or not value > 0:
        return f"expected {what} more than 0"
    if isinstance(value, float) and not math.isfinite(value):
        return "expected a finite number"
    most = _MOST.get(name, _KERNEL_MOST)
    if value > most:
        return f"expected {what} of at most {most} (what the kernel takes)"
    return None


def _short(value: Any) -> str:
    try:
        return repr(value)
    except ValueError:  # an int of more than 4,300 digits
        return f"<{type(value).__name__} too long to show>"


def named(limits: Limits, name: str) -> str:
    """``name = value`` as a message names a limit: "cpu_seconds = 3"."""
    value = getattr(limits, name)
    return f"{name} = {value:g}" if isinstance(value, float) else f"{name} = {value}"


# --- to the kernel: rlimits ------------------------------------------------------------


def rlimits(limits: Limits, *, address_space: bool) -> dict[str, tuple[int, int]]:
    """The rlimits that carry ``limits`` in a process that starts now, by name
    (``RLIMIT_<name>``): soft, hard. The one mapping of limits to rlimits: a
    background shell's command starts with all of them; a worker sets those of
    ``PER_CALL`` for each call (``CallLimits``) and the others once, when it starts
    (``apply_process_limits``).

    No core files; the open files and the file size; the CPU time, with SIGXCPU at
    the soft limit (a death that names ``cpu_seconds``) and the kernel's SIGKILL a
    second later for a process that ignores it; and, with ``address_space`` (no
    memory cgroup bounds the process: ``memory_by_rlimit``), ``memory_bytes`` as
    RLIMIT_AS. RLIMIT_NPROC is not one: it is per user and does not bind root
    (``processes`` is the pids cgroup's, ``CgroupLimits``)."""
    cpu = max(1, math.ceil(limits.cpu_seconds))
    wanted = {
        "CORE": (0, 0),
        "NOFILE": (limits.open_files, limits.open_files),
        "FSIZE": (limits.file_size_bytes, limits.file_size_bytes),
        "CPU": (cpu, cpu + 1),
    }
    if address_space:
        wanted["AS"] = (limits.memory_bytes, limits.memory_bytes)
    return wanted


# The rlimits a worker moves for each of its calls (soft limits only); the others are
# its own, set once from the pool's limits when it starts: a tool's open_files could
# otherwise starve the worker's own sockets.
PER_CALL = ("CPU", "FSIZE", "AS")


def memory_by_rlimit(cgroup: WorkerCgroup | None) -> bool:
    """Whether ``memory_bytes`` must be RLIMIT_AS for a process in ``cgroup``: no
    memory cgroup bounds it (none at all, or one without the memory controller)."""
    return cgroup is None or "memory" not in cgroup.controllers


def resource_number(name: str) -> int:
    """``resource.RLIMIT_<name>``: the number an rlimit's name stands for."""
    number: int = getattr(resource, f"RLIMIT_{name}")
    return number


def capped(soft: int, hard: int, cap: int) -> tuple[int, int]:
    """``soft`` and ``hard``, neither above ``cap``, the hard limit the process has
    (it may lower it, never raise it), and soft no higher than hard."""
    if cap != resource.RLIM_INFINITY:
        soft, hard = min(soft, cap), min(hard, cap)
    return min(soft, hard), hard


def _set(which: int, soft: int, hard: int | None = None) -> None:
    """Set an rlimit (its soft limit alone when ``hard`` is None), never above the
    current hard limit, nor past what the kernel takes (a call's CPU and address
    space are offsets from where the worker is: their sum may be)."""
    cap = resource.getrlimit(which)[1]
    soft = min(soft, _KERNEL_MOST)
    if hard is not None:
        resource.setrlimit(which, capped(soft, hard, cap))
    else:
        resource.setrlimit(which, (soft if cap == resource.RLIM_INFINITY else min(soft, cap), cap))


def apply_process_limits(limits: Limits) -> None:
    """Limits a worker sets once, at start: the rlimits not moved per call (no core
    dumps, bounded open files), and SIGXFSZ ignored so that an oversized write fails
    with EFBIG instead of killing the process (children inherit the ignored
    disposition through exec)."""
    for name, (soft, hard) in rlimits(limits, address_space=False).items():
        if name not in PER_CALL:
            _set(resource_number(name), soft, hard)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class CallLimits:
    """A worker's per-call soft rlimits (``rlimits``' of ``PER_CALL``), moved only
    when a call needs them moved.

    RLIMIT_CPU counts the process's whole life, so a call's allowance is "CPU used so
    far + the allowance" (SIGXCPU when spent, every second after). A worker does next
    to nothing between calls, so nothing is put back after a call: the CPU soft limit
    moves only when the next call would start with less than its allowance (or much
    more), and any other only when it differs from the last call's. Hard limits stay
    where they are: lowering one cannot be undone without privilege, and a tool that
    ignores SIGXCPU still meets its wall-time limit. RLIMIT_AS, used when no memory
    cgroup does the job, bounds each call's growth over the address space the worker
    already has.
    """

    def __init__(self, *, limit_address_space: bool) -> None:
        self.limit_address_space = limit_address_space
        self._soft: dict[int, int] = {}  # soft limits set for the last call, by resource
        # The soft limits of the last Limits seen: a session's calls carry the same.
        self._wanted: tuple[Limits, tuple[tuple[int, int], ...]] | None = None
        self._statm: int | None = None  # /proc/self/statm, open while RLIMIT_AS is used

    def apply(self, limits: Limits, cpu_used: float | None = None) -> None:
        """Move the soft limits for a call; ``cpu_used`` is the process's CPU time so
        far (user + system), when the caller has just read its rusage."""
        for which, soft in self._soft_limits(limits):
            if which == resource.RLIMIT_CPU:
                if cpu_used is None:
                    usage = resource.getrusage(resource.RUSAGE_SELF)
                    cpu_used = usage.ru_utime + usage.ru_stime
                now = resource.getrlimit(resource.RLIMIT_CPU)[0]
                remaining = math.inf if now == resource.RLIM_INFINITY else now - cpu_used
                if not soft <= remaining <= soft + 1:
                    _set(which, math.ceil(cpu_used) + soft)
            elif which == resource.RLIMIT_AS:
                _set(which, self._address_space() + soft)
            elif self._soft.get(which) != soft:
                _set(which, soft)
                self._soft[which] = soft

    def _soft_limits(self, limits: Limits) -> tuple[tuple[int, int], ...]:
        """(resource, soft limit) of each per-call rlimit ``limits`` ask for."""
        if self._wanted is None or self._wanted[0] is not limits:
            wanted = rlimits(limits, address_space=self.limit_address_space)
            soft = tuple((resource_number(n), wanted[n][0]) for n in PER_CALL if n in wanted)
            self._wanted = (limits, soft)
        return self._wanted[1]

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


# --- to the kernel: cgroups ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    """The part of a call's limits its cgroup carries, counted by the kernel over
    every process in it: memory (past it, the OOM killer) and processes (a fork past
    it fails). A worker's cgroup is written again when a call needs other ones
    (compared per call: ``of`` gives one object per Limits object), a background
    shell's once, when it is made."""

    memory_bytes: int  # memory.max (v2); memory.limit_in_bytes and memsw (v1)
    processes: int  # pids.max

    @classmethod
    def of(cls, limits: Limits) -> CgroupLimits:
        """The cgroup limits of ``limits``; the same object for the same Limits
        object (a session's calls share theirs, merged once)."""
        known = _CGROUP_LIMITS.get(id(limits))
        if known is not None:  # held below: its id is no other's
            return known[1]
        made = cls(*(getattr(limits, name) for name in _CGROUP_FIELDS))
        if len(_CGROUP_LIMITS) >= _CGROUP_LIMITS_KEPT:
            _CGROUP_LIMITS.clear()
        _CGROUP_LIMITS[id(limits)] = (limits, made)
        return made

    def __str__(self) -> str:  # as a message names them: "memory_bytes = 1024, processes = 8"
        return ", ".join(f"{f.name} = {getattr(self, f.name)}" for f in dataclasses.fields(self))

    def write(self, cgroup: WorkerCgroup) -> None:
        """Write these limits to ``cgroup`` (a value it has already is not written
        again). Raises OSError when the kernel refuses one."""
        cgroup.set_memory(self.memory_bytes)
        cgroup.set_pids(self.processes)


# Its fields are Limits' of the same names (a test keeps it so).
_CGROUP_FIELDS = tuple(f.name for f in dataclasses.fields(CgroupLimits))
# By the id of a Limits object: that object (held, so that its id stays its own) and
# its cgroup limits. A pool sees few distinct Limits (per tool and session); bounded.
_CGROUP_LIMITS: dict[int, tuple[Limits, CgroupLimits]] = {}
_CGROUP_LIMITS_KEPT = 256
