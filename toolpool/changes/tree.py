"""A directory tree read from the daemon without following any symlink below its
root, and what overlay layers say may differ between two trees (SPEC B8).

The trees compared are a session's workspace as it is (its overlay's merged view), as
it was at a checkpoint (a read-only view of its lower layers) and the host directory
it started from. Their contents are the session's: a symlink to ``/etc`` or a fifo is
read as what it is — a link, a special file — never through. ``Tree`` opens every
component from its parent's descriptor with ``O_NOFOLLOW``.

Which paths to compare comes from the layers between the two trees, never from a walk
of the whole tree: every entry of those layers, and the whole subtree at a whiteout,
an opaque directory or a directory overlayfs moved (``redirect_dir``), on both sides.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Tree:
    """A directory tree at ``root``, read by relative paths ("a/b.txt")."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _directory(self, parts: Sequence[str]) -> int | None:
        """An fd of the directory ``parts`` (owned by the caller), or None when a
        component is missing or not a directory (a symlink is not one)."""
        fd = os.dup(self._fd)
        for part in parts:
            try:
                below = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return None
                raise
            os.close(fd)
            fd = below
        return fd

    def stat(self, path: str) -> os.stat_result | None:
        """The entry itself (a symlink as one), or None when absent."""
        *parents, name = path.split("/")
        fd = self._directory(parents)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def read(self, path: str) -> bytes:
        """A regular file's bytes (OSError for anything else)."""
        with open(self.open(path), "rb") as file:
            return file.read()

    def open(self, path: str) -> int:
        """An fd to read the regular file ``path`` (the caller closes it)."""
        *parents, name = path.split("/")
        fd = self._directory(parents)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        try:
            opened = os.open(name, _FILE, dir_fd=fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(opened).st_mode):
            os.close(opened)
            raise OSError(errno.EINVAL, "not a regular file", path)
        return opened

    def readlink(self, path: str) -> bytes:
        *parents, name = path.split("/")
        fd = self._directory(parents)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "no such link", path)
        try:
            return os.fsencode(os.readlink(name, dir_fd=fd))
        finally:
            os.close(fd)

    def xattr(self, path: str, name: str) -> bytes | None:
        """The extended attribute ``name`` of the entry itself, or None."""
        *parents, entry = path.split("/")
        fd = self._directory(parents)
        if fd is None:
            return None
        try:
            return os.getxattr(f"/proc/self/fd/{fd}/{entry}", name, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def below(self, path: str = "") -> Iterator[tuple[str, os.stat_result]]:
        """Every entry under the directory ``path`` (not itself), parents first; nothing
        when it is not a directory."""
        fd = self._directory(path.split("/") if path else [])
        if fd is None:
            return
        try:
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        with os.scandir(listing) as entries:
            found = sorted((e.name, e.stat(follow_symlinks=False)) for e in entries)
        os.close(listing)
        for name, entry in found:
            child = f"{path}/{name}" if path else name
            yield child, entry
            if stat.S_ISDIR(entry.st_mode):
                yield from self.below(child)


def _xattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def touched(layers: Iterable[Path], namespace: str) -> tuple[set[str], set[str]]:
    """What the overlay ``layers`` (upper layers, seen from here) may have changed:
    the paths of their entries, and the subtrees to compare whole (below a whiteout,
    an opaque directory, a directory moved with ``redirect_dir``). ``namespace`` is
    their overlay xattrs' ("trusted", or "user" in a user namespace)."""
    paths: set[str] = set()
    subtrees: set[str] = set()
    for layer in layers:
        with Tree(layer) as tree:
            entries = list(tree.below())
        for path, entry in entries:
            paths.add(path)
            mode = entry.st_mode
            if stat.S_ISCHR(mode) and entry.st_rdev == 0:
                subtrees.add(path)  # a whiteout: whatever lay there, a directory too
            elif stat.S_ISDIR(mode):
                seen = layer / path
                moved = _xattr(seen, f"{namespace}.overlay.redirect") is not None
                if moved or _xattr(seen, f"{namespace}.overlay.opaque") == b"y":
                    subtrees.add(path)
    return paths, subtrees


def candidates(old: Tree, new: Tree, paths: set[str], subtrees: set[str]) -> list[str]:
    """The paths to compare: ``paths``, and everything under each of ``subtrees`` on
    either side; sorted, parents before children."""
    found = set(paths)
    for subtree in subtrees:
        for tree in (old, new):
            found.update(path for path, _ in tree.below(subtree))
    return sorted(found, key=lambda p: p.split("/"))
