"""A session's workspace written out (SPEC B9): to a new directory, or to a tarball
(``.tar``, ``.tar.gz``, ``.tgz``), as the session sees it — files, symlinks (as
links) and directories with their modes; special files are left out.

Nothing of it is followed: the tree is read through ``Tree`` and written below a
directory made here, each entry created from its parent's descriptor, never through
a name another process could swap. As root, what is written belongs to the owner of
the directory it is written into.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

from toolpool.changes.compare import EntryType, entry_type
from toolpool.changes.tree import Tree

TARBALLS = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz"}
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def tar_mode(destination: Path) -> str | None:
    """tarfile's mode for a tarball destination, or None for a directory."""
    name = destination.name
    return next((mode for end, mode in TARBALLS.items() if name.endswith(end)), None)


def export(tree: Tree, destination: Path) -> int:
    """Write ``tree`` to ``destination`` (which must not exist; its parent must);
    how many entries were written."""
    mode = tar_mode(destination)
    if mode is not None:
        return _tarball(tree, destination, mode)
    return _directory(tree, destination)


def _owner(directory: int) -> tuple[int, int] | None:
    """Whom new entries of ``directory`` should belong to (as root), or None."""
    if os.geteuid() != 0:
        return None
    found = os.fstat(directory)
    return found.st_uid, found.st_gid


def _directory(tree: Tree, destination: Path) -> int:
    parent = os.open(destination.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    owner = _owner(parent)
    try:
        os.mkdir(destination.name, 0o700, dir_fd=parent)
        top = os.open(destination.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    finally:
        os.close(parent)
    directories: dict[str, int] = {"": top}
    modes: list[tuple[int, str, int]] = []  # set last: a read-only directory takes no more
    written = 0
    try:
        for path, found in tree.below():
            kind = entry_type(found)
            if kind is None:
                continue
            head, _, name = path.rpartition("/")
            at = directories[head]
            if kind is EntryType.DIRECTORY:
                os.mkdir(name, 0o700, dir_fd=at)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                directories[path] = os.open(name, flags, dir_fd=at)
                modes.append((directories[path], path, stat.S_IMODE(found.st_mode)))
            elif kind is EntryType.SYMLINK:
                os.symlink(tree.readlink(path), name, dir_fd=at)
            else:
                _copy(tree, path, name, at, stat.S_IMODE(found.st_mode))
            if owner is not None:
                os.chown(name, *owner, dir_fd=at, follow_symlinks=False)
            written += 1
        if owner is not None:
            os.fchown(top, *owner)
        for fd, _, mode in reversed(modes):
            os.fchmod(fd, mode)
        root = tree.stat("")
        os.fchmod(top, 0o755 if root is None else stat.S_IMODE(root.st_mode))
    finally:
        for fd in directories.values():
            os.close(fd)
    return written


def _copy(tree: Tree, path: str, name: str, at: int, mode: int) -> None:
    source = tree.open(path)
    try:
        target = os.open(name, _NEW, 0o600, dir_fd=at)
        try:
            while chunk := os.read(source, 1 << 20):
                os.write(target, chunk)
            os.fchmod(target, mode)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _tarball(tree: Tree, destination: Path, mode: str) -> int:
    parent = os.open(destination.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    owner = _owner(parent)
    try:
        fd = os.open(destination.name, _NEW, 0o644, dir_fd=parent)
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(parent)
    written = 0
    with open(fd, "wb") as file, tarfile.open(fileobj=file, mode=mode) as tar:  # type: ignore[call-overload]
        for path, found in tree.below():
            kind = entry_type(found)
            if kind is None:
                continue
            info = tarfile.TarInfo(path)
            info.mode = stat.S_IMODE(found.st_mode)
            info.mtime = int(found.st_mtime)
            if kind is EntryType.DIRECTORY:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind is EntryType.SYMLINK:
                info.type = tarfile.SYMTYPE
                info.linkname = os.fsdecode(tree.readlink(path))
                tar.addfile(info)
            else:
                with open(tree.open(path), "rb") as content:
                    info.size = os.fstat(content.fileno()).st_size
                    tar.addfile(info, content)
            written += 1
    return written
