"""Removing a layer let go — a rewind's, a merge's, a fork's last — so that its room is
free when the removal returns (SPEC B13).

    remove_layer(path)   # every regular file emptied, then the tree removed

Unlinking alone is not enough. A mount namespace made while an overlay of the layer
was mounted — another session's sandbox and each command in it, a fork's, anything on
the host that ran ``unshare -m`` — holds a copy of that mount, which keeps the overlay
alive and, through it, every file of the layer it looked up: an unlinked file's blocks
stay taken until that namespace ends, seconds later or never. Taking the copies away
is no cure: the kernel detaches them (when their mount point is removed) from every
namespace at once, one that a sandbox is being set up in among them, which then fails.
A truncated file's blocks are free whoever holds it.

A file is opened without following a link and emptied only if it is a regular file (a
link, a fifo or a device of the layer is never opened through); one this user may not
write (an unprivileged daemon's file of mode 0444) is made writable first. The walk
holds one directory open at a time, down by name and back up by "..", so no depth of
nesting stops it. Nothing else writes a layer let go: its session's processes are gone
and no command can reach it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def remove_layer(top: Path) -> None:
    """Remove the directory ``top`` and everything in it, each regular file emptied
    before it is unlinked. What cannot be removed is left (as ``rmtree`` with
    ``ignore_errors`` would)."""
    try:
        fd = os.open(top, _DIRECTORY)
    except OSError:
        return  # gone already, or no directory of ours
    below: list[list[str]] = [_clear(fd)]  # per level: subdirectories still to visit
    names: list[str] = []  # per level below ``top``: its directory's name in its parent
    try:
        while below:
            if below[-1]:
                name = below[-1].pop()
                try:
                    child = os.open(name, _DIRECTORY, dir_fd=fd)
                except OSError:
                    continue
                os.close(fd)
                fd = child
                names.append(name)
                below.append(_clear(fd))
                continue
            below.pop()
            if not names:
                break
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            with contextlib.suppress(OSError):
                os.rmdir(names.pop(), dir_fd=fd)
    except OSError:
        pass  # a directory that went meanwhile: what is left stays
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(top)


def _clear(directory: int) -> list[str]:
    """Empty and unlink everything in ``directory`` but its subdirectories; their
    names."""
    try:
        with os.scandir(directory) as entries:
            found = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                     for e in entries]  # fmt: skip
    except OSError:
        return []
    subdirectories = []
    for name, is_directory, is_file in found:
        if is_directory:
            subdirectories.append(name)
            continue
        if is_file:
            _empty(directory, name)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=directory)
    return subdirectories


def _empty(directory: int, name: str) -> None:
    """Truncate the regular file ``name`` of ``directory`` to nothing."""
    try:
        fd = os.open(name, _WRITE, dir_fd=directory)
    except PermissionError:
        fd = _made_writable(directory, name)
        if fd < 0:
            return
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.ftruncate(fd, 0)
    except OSError:
        pass
    finally:
        os.close(fd)


def _made_writable(directory: int, name: str) -> int:
    """The regular file ``name`` of ``directory``, made writable by its owner and
    opened for writing; -1 when it cannot be."""
    try:
        place = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return -1
    try:
        if not stat.S_ISREG(os.fstat(place).st_mode):
            return -1
        os.chmod(f"/proc/self/fd/{place}", 0o600)  # the file itself, never a link
        return os.open(f"/proc/self/fd/{place}", _WRITE & ~os.O_NOFOLLOW)
    except OSError:
        return -1
    finally:
        os.close(place)
