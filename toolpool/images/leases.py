"""Flock-based marks on cache entries: shared while in use, exclusive to take one away.

A layer in use (by a prepare under way or by a live session's lease) holds a shared
flock on its lock file; eviction takes the exclusive lock without waiting and skips the
layer when it cannot. Locks belong to open files, so a crashed daemon's leases lapse
with its process. A lock file is unlinked when its entry is evicted; whoever locked
the unlinked file checks that the path still names the file it locked, and tries again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC


def is_current(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def share(path: Path) -> int:
    """An fd holding a shared lock on the lock file ``path`` (waits for an evictor)."""
    while True:
        fd = os.open(path, _FLAGS, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if is_current(path, fd):
            return fd
        os.close(fd)


def try_exclusive(path: Path) -> int | None:
    """An fd holding the exclusive lock on ``path``, or None when it is held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not is_current(path, fd):
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """The exclusive lock on ``path`` for the block (waiting for it)."""
    fd = os.open(path, _FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Lease:
    """A session's hold on the layers of a prepared image: while it is held, none of
    them is evicted. ``release`` (or the end of a ``with`` block) lets them go; so does
    the end of the process that holds it."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def add(self, fd: int) -> None:
        self._fds.append(fd)

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def shared(self) -> Lease:
        """Another lease on the same layers (a fork's): the locks' open files shared,
        so they hold until both leases let go."""
        other = Lease()
        for fd in self._fds:
            other.add(os.dup(fd))
        return other

    def release(self) -> None:
        """Let the layers go (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
