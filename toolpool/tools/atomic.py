"""Atomic file replacement: readers see the old content or the new, never half of it."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; not every file system allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> os.stat_result:
    """Replace (or create) ``path`` with ``data`` atomically and durably.

    The bytes go to a temporary file in the same directory, which is fsynced and then
    renamed over ``path`` (``os.replace``). An existing file keeps its permission
    bits; a new one gets the usual ``0o666`` minus the umask. Hard links to the old
    file are not carried over (it is a new inode). Returns the stat of the written
    file, taken before the rename: its mtime and size are exactly those of ``data``.
    """
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    while True:
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            # O_EXCL: never reuse someone else's file; 0o666 lets the umask decide.
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        break
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
            written = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return written
