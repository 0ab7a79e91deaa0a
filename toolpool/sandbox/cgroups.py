"""cgroups for workers: memory, pids and CPU limits, and killing a whole group.

Each worker gets its own cgroup, nested under the coordinator's own cgroup in every
hierarchy where that is writable. Both layouts are handled, and mixed ones too:

- cgroup v1: one hierarchy per controller (``/sys/fs/cgroup/memory/...``);
- cgroup v2: one unified hierarchy; controllers only where delegated to us, and
  ``cgroup.kill`` (kill everything in the group at once) wherever v2 is mounted.

These machines mount v1 controllers and a v2 hierarchy that offers only
``cgroup.kill``: workers then take their limits from v1 and their kill from v2.

A worker reads its own cgroups (``CallAccounting``) to count a call over every
process it starts (SPEC X7): CPU time from v1 ``cpuacct.usage`` or v2 ``cpu.stat``
(which every v2 cgroup has, controllers or not), OOM kills, and how often the pids
limit refused a fork.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# "cpuacct" only counts (v1; in v2 cpu.stat is always there): a call's CPU time.
CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """A mounted hierarchy and our own place in it."""

    version: int  # 1 or 2
    mount: Path
    own: Path  # our cgroup's directory
    controllers: frozenset[str]  # the limits this hierarchy can apply for us


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(fstype, mount point, super options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((fstype, Path(left.split()[4]), set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) → our cgroup path in it, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else [""]:
                own[name] = path.lstrip("/")
    return own


def _writable(directory: Path) -> bool:
    """Can we create child cgroups here? (Try it: permissions alone do not tell.)"""
    probe = directory / f"toolpool-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _v2_controllers(own: Path) -> frozenset[str]:
    """The controllers we can enable for our children in v2: those the parent
    delegates to us, which we may switch on only if no process lives in our own
    cgroup (the "no internal processes" rule) or it is the root."""
    try:
        available = set((own / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()
    wanted = available & set(CONTROLLERS)
    enabled = set((own / "cgroup.subtree_control").read_text().split())
    for name in wanted - enabled:
        try:
            (own / "cgroup.subtree_control").write_text(f"+{name}")
            enabled.add(name)
        except OSError:
            continue
    return frozenset(wanted & enabled)


def discover() -> list[Hierarchy]:
    """The hierarchies where we may create cgroups, with what each can limit."""
    own = _own_paths()
    found: list[Hierarchy] = []
    for fstype, mount, options in _mounts():
        if fstype == "cgroup2":
            own_dir = mount / own.get("", "")
            if _writable(own_dir):
                found.append(Hierarchy(2, mount, own_dir, _v2_controllers(own_dir)))
            continue
        names = options & set(CONTROLLERS)
        if not names:
            continue
        own_dir = mount / own.get(sorted(names)[0], "")
        if _writable(own_dir):
            found.append(Hierarchy(1, mount, own_dir, frozenset(names)))
    return found


def remove_stale_cgroups(alive: Callable[[int], bool]) -> list[str]:
    """Remove the ``toolpool-<pid>`` cgroups of daemons no longer running (SPEC L7):
    whatever is left in them is killed first. Their paths, for the log."""
    removed: list[str] = []
    for h in discover():
        for stale in h.own.glob("toolpool-*"):
            pid = stale.name.removeprefix("toolpool-")
            if not pid.isdigit() or alive(int(pid)) or not stale.is_dir():
                continue
            groups = _subgroups(stale)
            for group in [*groups, stale]:
                _kill_members(group)
            for _ in range(20):  # members take a moment to leave once killed
                for group in [*groups, stale]:
                    with contextlib.suppress(OSError):
                        group.rmdir()
                if not stale.exists():
                    removed.append(str(stale))
                    break
                time.sleep(0.05)
    return removed


def _subgroups(top: Path) -> list[Path]:
    """The cgroups under ``top``, the deepest first. Another daemon starting now may be
    removing the same stale tree: a group that vanishes while it is walked is left out,
    never an error (os.walk passes over a directory it cannot list)."""
    found = [Path(where) / name for where, names, _ in os.walk(top) for name in names]
    return sorted(found, key=lambda p: -len(p.parts))


def _kill_members(group: Path) -> None:
    with contextlib.suppress(OSError):
        (group / "cgroup.kill").write_text("1")
        return
    with contextlib.suppress(OSError, ValueError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


class WorkerCgroup:
    """One worker's cgroups (one per hierarchy). Limits go where a hierarchy can
    apply them; v1 wins for a controller both offer."""

    def __init__(self, name: str, hierarchies: list[Hierarchy], parent: str) -> None:
        self.name = name
        self.dirs: dict[Hierarchy, Path] = {}
        for h in hierarchies:
            path = h.own / parent / name
            path.mkdir(parents=True, exist_ok=True)
            self.dirs[h] = path
        self.by_controller: dict[str, Path] = {}
        for h, path in sorted(self.dirs.items(), key=lambda item: -item[0].version):
            for controller in h.controllers:
                self.by_controller[controller] = path
        self._written: dict[Path, str] = {}  # skip writes that change nothing (~100 µs each)
        self._memory_files = self._memory_limit_files()
        self.kill_file = next(
            (p / "cgroup.kill" for h, p in self.dirs.items() if (p / "cgroup.kill").exists()),
            None,
        )

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(self.by_controller)

    def procs_files(self) -> list[Path]:
        return [p / "cgroup.procs" for p in self.dirs.values()]

    def _write(self, path: Path, value: str) -> None:
        if self._written.get(path) != value:
            path.write_text(value)
            self._written[path] = value

    def _v1(self, controller: str) -> bool:
        path = self.by_controller.get(controller)
        return path is not None and not (path / "cgroup.controllers").exists()

    def _memory_limit_files(self) -> list[Path]:
        path = self.by_controller.get("memory")
        if path is None:
            return []
        if not self._v1("memory"):
            return [path / "memory.max"]
        files = [path / "memory.limit_in_bytes", path / "memory.memsw.limit_in_bytes"]
        return [f for f in files if f.exists()]

    def set_memory(self, limit: int) -> None:
        # v1 memory+swap must stay >= memory: write in the order the change allows.
        try:
            for f in self._memory_files:
                self._write(f, str(limit))
        except OSError:
            for f in reversed(self._memory_files):
                self._write(f, str(limit))

    def set_pids(self, limit: int) -> None:
        path = self.by_controller.get("pids")
        if path is not None:
            self._write(path / "pids.max", str(limit))

    def set_cpu(self, cpus: float) -> None:
        path = self.by_controller.get("cpu")
        if path is None:
            return
        quota = int(cpus * CPU_PERIOD_US)
        if self._v1("cpu"):
            (path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in this group so far."""
        path = self.by_controller.get("memory")
        if path is None:
            return 0
        source = path / ("memory.oom_control" if self._v1("memory") else "memory.events")
        try:
            for line in source.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill_all(self) -> None:
        """SIGKILL everything in the group: at once with cgroup.kill, else one by one."""
        if self.kill_file is not None:
            with contextlib.suppress(OSError):
                self.kill_file.write_text("1")
                return
        for procs in self.procs_files():
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        """Remove the (empty) cgroups; a group still busy is left for the next try."""
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()


# Each tree of a process names its workers' cgroups apart: two pools in one process
# share the ``toolpool-<pid>`` parent, and must not share a worker's cgroup (closing
# one pool would kill what runs in the other's).
_TREES = itertools.count(1)


class CgroupTree:
    """The coordinator's ``toolpool-<pid>`` cgroups, parents of every worker's."""

    def __init__(self, hierarchies: list[Hierarchy]) -> None:
        self.hierarchies = hierarchies
        self.parent = f"toolpool-{os.getpid()}"
        self._tag = f"t{next(_TREES)}-"

    @classmethod
    def probe(cls) -> CgroupTree | None:
        hierarchies = discover()
        return cls(hierarchies) if hierarchies else None

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset().union(*(h.controllers for h in self.hierarchies))

    @property
    def can_kill(self) -> bool:
        return any(h.version == 2 for h in self.hierarchies)

    def describe(self) -> str:
        parts = []
        for h in self.hierarchies:
            what = ", ".join(sorted(h.controllers)) or "no controllers"
            extra = " + cgroup.kill" if h.version == 2 else ""
            parts.append(f"v{h.version} {h.mount} ({what}{extra})")
        return "; ".join(parts)

    def create(self, name: str) -> WorkerCgroup:
        return WorkerCgroup(self._tag + name, self.hierarchies, self.parent)

    def close(self) -> None:
        for h in self.hierarchies:
            with contextlib.suppress(OSError):
                (h.own / self.parent).rmdir()


class CallAccounting:
    """A worker's view of its own cgroups, from the ``cgroup.procs`` paths it was
    given: CPU time used so far by every process in them, OOM kills and pids-limit
    refusals so far, and the members. Files stay open; each read is one pread."""

    def __init__(self, procs_files: Sequence[str | Path]) -> None:
        dirs = [Path(p).parent for p in procs_files]
        self._fds: list[int] = []
        self._procs = [d / "cgroup.procs" for d in dirs]
        # CPU: v1 cpuacct.usage (ns), else v2 cpu.stat usage_usec.
        self._cpu: tuple[int, float, bytes | None] | None = None
        for d in dirs:
            if (d / "cpuacct.usage").exists():
                self._cpu = (self._open(d / "cpuacct.usage"), 1e-9, None)
                break
        else:
            for d in dirs:
                if (d / "cgroup.controllers").exists() and (d / "cpu.stat").exists():
                    self._cpu = (self._open(d / "cpu.stat"), 1e-6, b"usage_usec")
                    break
        self._oom = self._first(dirs, ("memory.oom_control", "memory.events"))
        self._pids = self._first(dirs, ("pids.events",))

    def _open(self, path: Path) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._fds.append(fd)
        return fd

    def _first(self, dirs: list[Path], names: tuple[str, ...]) -> int | None:
        for name in names:
            for d in dirs:
                if (d / name).exists():
                    with contextlib.suppress(OSError):
                        return self._open(d / name)
        return None

    @property
    def active(self) -> bool:
        return self._cpu is not None or self._oom is not None or self._pids is not None

    @staticmethod
    def _key(fd: int | None, key: bytes) -> int:
        """The value of ``key`` in a flat keyed file ("name value" lines); 0 without.

        A search for the line, not a split of every line: the worker reads two such
        files after every call, and splitting cost more than the read (~3 µs of 5)."""
        if fd is None:
            return 0
        try:
            data = b"\n" + os.pread(fd, 4096, 0)
            needle = b"\n" + key + b" "
            at = data.find(needle)
            if at < 0:
                return 0
            start = at + len(needle)
            end = data.find(b"\n", start)
            return int(data[start:end] if end >= 0 else data[start:])
        except (OSError, ValueError):
            return 0

    def cpu_seconds(self) -> float | None:
        """CPU time every process of the group used so far; None when not counted."""
        if self._cpu is None:
            return None
        fd, scale, key = self._cpu
        if key is not None:
            return self._key(fd, key) * scale
        try:
            return int(os.pread(fd, 64, 0)) * scale
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        return self._key(self._oom, b"oom_kill")

    def pids_refusals(self) -> int:
        """How many forks the pids limit refused so far ("max" in pids.events)."""
        return self._key(self._pids, b"max")

    def members(self) -> set[int]:
        found: set[int] = set()
        for procs in self._procs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in procs.read_text().split())
        return found

    def kill_others(self, own: int) -> int:
        """SIGKILL every member but ``own`` (the worker); how many were signalled."""
        killed = 0
        for pid in self.members() - {own}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
