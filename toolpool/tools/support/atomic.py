"""Atomic file replacement: readers see the old content or the new, never half of it.

Everything goes through the fd of the file's directory (``dir_fd``), never a full
name, so a directory swapped for a symlink meanwhile cannot redirect the write (X4).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat


def _fsync_directory(dir_fd: int) -> None:
    """Make a rename in the directory durable; not every file system allows it."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _link_new(temp: str, name: str, dir_fd: int) -> None:
    """``temp`` as ``name``, which must not exist: linked (never replaces), or, on a
    file system without hard links, renamed after a look (a window, but no other way)."""
    try:
        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return
        raise FileExistsError(name) from None
    os.unlink(temp, dir_fd=dir_fd)


def write_atomic_at(dir_fd: int, name: str, data: bytes, *, replace: bool = True) -> os.stat_result:
    """Replace (or create) the entry ``name`` of the directory ``dir_fd`` with ``data``,
    atomically and durably; with ``replace=False`` only create it (FileExistsError
    when something is there by then: the file is linked in, which never replaces).

    The bytes go to a temporary file in the same directory (``openat`` with
    ``O_CREAT | O_EXCL | O_NOFOLLOW``), which is fsynced and then renamed over
    ``name`` (``renameat``; a symlink at ``name`` is replaced, never followed). An
    existing file keeps its permission bits; a new one gets the usual ``0o666`` minus
    the umask. Hard links to the old file are not carried over (it is a new inode).
    Returns the stat of the written file, taken before the rename: its mtime and size
    are exactly those of ``data``.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        mode: int | None = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        temp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            # O_EXCL: never reuse someone else's file; 0o666 lets the umask decide.
            fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
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
        if replace:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            _link_new(temp, name, dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    _fsync_directory(dir_fd)
    return written
