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
A truncated file's blocks are free whoever holds it. And a layer's files are its own:
overlayfs copies a file up before it links it, so no inode of a layer is another
layer's or the host's, and emptying one empties nothing that stays.

A file is opened without following a link and emptied only if it is a regular file (a
link, a fifo or a device of the layer is never opened through). What this user may not
open or change as it is (an unprivileged daemon's: a file of mode 0444, a directory of
0555 or 000) is given its owner's permissions first, through a descriptor of the entry
itself. The walk holds one directory open at a time, down by name and back up by "..",
so no depth of nesting stops it. Nothing else writes a layer let go: its session's
processes are gone and no command can reach it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def remove_layer(top: Path) -> None:
    """Remove the directory ``top`` and everything in it, each regular file emptied
    before it is unlinked. What cannot be removed is left (as ``rmtree`` with
    ``ignore_errors`` would)."""
    fd = _open_directory(None, str(top))
    if fd < 0:
        return  # gone already, or no directory of ours
    below: list[list[str]] = [_clear(fd)]  # per level: subdirectories still to visit
    names: list[str] = []  # per level below ``top``: its directory's name in its parent
    try:
        while below:
            if below[-1]:
                name = below[-1].pop()
                child = _open_directory(fd, name)
                if child < 0:
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
            _in(fd, functools.partial(os.rmdir, names.pop(), dir_fd=fd))
    except OSError:
        pass  # a directory that went meanwhile: what is left stays
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(top)


def _open_directory(parent: int | None, name: str) -> int:
    """The directory ``name`` (of ``parent``), opened to be read, made readable and
    searchable by its owner first if need be; -1 when it cannot be."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except PermissionError:
        place = _given_to_owner(parent, name, stat.S_ISDIR, 0o700)
        if place < 0:
            return -1
        os.close(place)
        try:
            return os.open(name, _DIRECTORY, dir_fd=parent)
        except OSError:
            return -1
    except OSError:
        return -1


def _clear(directory: int) -> list[str]:
    """Empty and unlink everything in ``directory`` but its subdirectories; their
    names."""
    try:
        with os.scandir(directory) as entries:
            found = [
                (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                for e in entries
            ]
    except OSError:
        return []
    subdirectories = []
    for name, is_directory, is_file in found:
        if is_directory:
            subdirectories.append(name)
            continue
        if is_file:
            _empty(directory, name)
        _in(directory, functools.partial(os.unlink, name, dir_fd=directory))
    return subdirectories


def _in(directory: int, change: Callable[[], None]) -> None:
    """``change`` of ``directory``'s entries; refused (a directory of 0555), again
    once its owner may write it; left undone if it still cannot be."""
    try:
        change()
    except PermissionError:
        with contextlib.suppress(OSError):
            os.fchmod(directory, 0o700)
            change()
    except OSError:
        pass


def _empty(directory: int, name: str) -> None:
    """Truncate the regular file ``name`` of ``directory`` to nothing."""
    try:
        fd = os.open(name, _WRITE, dir_fd=directory)
    except PermissionError:
        place = _given_to_owner(directory, name, stat.S_ISREG, 0o600)
        if place < 0:
            return
        try:
            fd = os.open(f"/proc/self/fd/{place}", _WRITE & ~os.O_NOFOLLOW)
        except OSError:
            return
        finally:
            os.close(place)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.ftruncate(fd, 0)
    except OSError:
        pass
    finally:
        os.close(fd)


def _given_to_owner(
    directory: int | None, name: str, kind: Callable[[int], bool], mode: int
) -> int:
    """An O_PATH descriptor of the entry ``name`` (of ``directory``), never a link,
    given ``mode`` if it is of ``kind``; -1 when it is not, or cannot be."""
    try:
        place = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return -1
    try:
        if kind(os.fstat(place).st_mode):
            os.chmod(f"/proc/self/fd/{place}", mode)  # the entry itself
            return place
    except OSError:
        pass
    os.close(place)
    return -1
