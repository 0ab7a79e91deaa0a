"""The few Linux calls the standard library lacks: prctl, /proc children lists; and
``readable``, the one wait for a descriptor (poll: select fails on fds past 1024,
which a daemon with many shells and sandboxes reaches).

psutil does the looking where it is the faster way; where it is not, on the paths
that termination polls every 10 ms, these read /proc themselves (measured on the
2-core machine with ~80 processes running):

- ``children``: the kernel's own list, ``/proc/<pid>/task/*/children``, ~46 µs;
  ``psutil.Process.children`` reads the parent of every process there is, ~2.7 ms.
- ``is_running``: one read of ``/proc/<pid>/stat``, ~23 µs; ``psutil.Process(pid)
  .status()`` reads it twice (its creation time, then its state), ~69 µs.
- ``process_group_members``: ``psutil.pids()`` and ``os.getpgid`` (a system call, no
  file), ~140 µs; reading every ``/proc/<pid>/stat`` took ~2.2 ms.
- ``lineage_includes``: ``psutil.Process.parents``.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
from pathlib import Path
from typing import Protocol

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies.

    Raises ``ProcessLookupError`` when the parent is already gone (we were adopted
    before the call could take effect), so the caller can exit at once.
    """
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        raise ProcessLookupError("the parent died before the death signal was set")


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to us (not to init), so we can find and
    end them — the children that called setsid included."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


# waitid through a handle without errno (ctypes saves and swaps errno around every
# call of a ``use_errno`` handle) and without argtypes (each converts its argument):
# every argument is a small int or NULL, which ctypes passes as a C int unasked.
_waitid = ctypes.CDLL(None).waitid
_WAITID_ANY = (os.P_ALL, 0, None, os.WEXITED | os.WNOHANG | os.WNOWAIT)


def has_children() -> bool:
    """Whether this process has any child, exited or not (one system call).

    For a subreaper this answers for every descendant: an orphan is re-parented to
    us, so no child means no descendant at all.

    libc's waitid, not ``os.waitid``: the answer a worker gets after nearly every call
    is "none", which ``os.waitid`` gives as a ChildProcessError (~7,200 instructions
    a call against ~3,900; the errno and argtypes handle took ~9,000). With these
    arguments (no hang, a NULL infop, which Linux allows) the only failure waitid
    has is ECHILD, so -1 is "none"; 0 is a child, running or exited.
    """
    return bool(_waitid(*_WAITID_ANY) == 0)


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), from /proc; [] when gone."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents before children."""
    found: list[int] = []
    frontier = children(pid)
    while frontier:
        found.extend(frontier)
        frontier = [c for p in frontier for c in children(p)]
    return found


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold any byte.
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"")


def process_group_members(pgid: int) -> list[int]:
    """Processes whose process group is ``pgid`` (every process looked at: for
    termination only)."""
    import psutil

    members: list[int] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                members.append(pid)
        except OSError:  # gone meanwhile
            continue
    return members


def reap_children() -> list[tuple[int, int]]:
    """Collect every exited child without blocking: [(pid, wait status)]."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def lineage_includes(pid: int, ancestors: set[int], cgroup_marker: str | None = None) -> bool:
    """Whether ``pid`` descends from one of ``ancestors`` or lives in a cgroup whose
    path holds ``cgroup_marker`` (a process that double-forked away from its parents
    stays in its cgroup). A process that cannot be looked at counts as included."""
    import psutil

    if cgroup_marker is not None:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                if cgroup_marker in f.read():
                    return True
        except OSError:
            return True
    try:
        process = psutil.Process(pid)
        return pid in ancestors or any(p.pid in ancestors for p in process.parents())
    except psutil.Error:
        return True


class HasFileno(Protocol):
    def fileno(self) -> int: ...


def readable(fd: int | HasFileno, timeout: float | None) -> bool:
    """Whether ``fd`` (a descriptor, or an object with ``fileno()``) is readable (or
    closed at its other end) within ``timeout`` seconds (None: however long it takes).
    poll, not select: any descriptor number works."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)  # POLLHUP and POLLERR come unasked
    wait = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return bool(poller.poll(wait))
