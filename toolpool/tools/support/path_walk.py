"""The walk of a model's path below the session's roots, component by component
from a directory fd of the root (``paths.py`` says the rules), and what it gives: a
``Resolved``, the target's directory held by an fd.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from pathlib import Path, PurePosixPath
from types import TracebackType

from toolpool.errors import ToolError
from toolpool.tools.support.fdwalk import STEP_FLAGS
from toolpool.tools.support.path_names import display_in

_MAX_SYMLINKS = 40
_ROOT_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class Resolved:
    """A path judged inside a root, held by an fd of its directory.

    ``dir_fd`` (an ``O_PATH`` directory fd, owned) holds the entry ``name`` (``"."``
    when the path is a root itself). ``missing`` are directories between ``dir_fd``
    and ``name`` that do not exist yet; when there are some, the target does not exist
    either. ``path`` is the real path, for display and the read register only.
    """

    __slots__ = ("dir_fd", "missing", "name", "path", "roots")

    def __init__(
        self, path: Path, dir_fd: int, name: str, missing: tuple[str, ...], roots: list[Path]
    ) -> None:
        self.path = path
        self.dir_fd = dir_fd
        self.name = name
        self.missing = missing
        self.roots = roots

    def __enter__(self) -> Resolved:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def seen_at(self) -> str:
        """A name of the target through its directory's fd: where it lies in the
        session's view (its workspace overlay, SPEC V14), for what looks by name."""
        return os.path.join(f"/proc/self/fd/{self.dir_fd}", *self.missing, self.name)

    def _not_found(self) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.path))

    def lstat(self) -> os.stat_result:
        """The target's stat, not following a symlink (one appears only by a swap)."""
        if self.missing:
            raise self._not_found()
        return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)

    def open(self, flags: int, mode: int = 0o666) -> int:
        """``openat(dir_fd, name, flags | O_NOFOLLOW | O_CLOEXEC)``: an fd of the
        target itself, never of what a symlink swapped in since points to."""
        if self.missing:
            raise self._not_found()
        try:
            return os.open(
                self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.dir_fd
            )
        except OSError as exc:
            # What was resolved a moment ago became a symlink, or no longer a
            # directory: something swaps it. Refused, like any path that leads out.
            if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and self._swapped()):
                raise ToolError(
                    f"Access denied: {display_in(self.path, self.roots[0])} changed while "
                    "it was being opened "
                    "(it is now a symlink, or no longer a directory). Try again once "
                    "it holds still."
                ) from exc
            raise

    def _swapped(self) -> bool:
        """After ENOTDIR: the name is a symlink now, or a directory again (it was
        swapped and back), rather than the file that was asked to be a directory.
        (The resolved name is never a link: the walk resolves links to their target.)"""
        try:
            found = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return True
        return stat.S_ISLNK(found.st_mode) or stat.S_ISDIR(found.st_mode)

    def make_parents(self) -> None:
        """Create the missing directories (mkdirat), each opened without following
        links; afterwards ``dir_fd`` holds the new file's directory."""
        while self.missing:
            part = self.missing[0]
            # One made meanwhile is fine: it is opened below without following a link.
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=self.dir_fd)
            fd = os.open(part, STEP_FLAGS | os.O_DIRECTORY, dir_fd=self.dir_fd)
            os.close(self.dir_fd)
            self.dir_fd = fd
            self.missing = self.missing[1:]


class TooManyLinks(Exception):
    """More than ``_MAX_SYMLINKS`` symlinks on the way."""


class Escape(Exception):
    """The walk left every root; ``where`` is the path it reached."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def under(path: PurePosixPath | Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class Walk:
    """One resolution: the state of the walk, and the fds it holds."""

    def __init__(self, roots: list[Path], views: dict[Path, Path]) -> None:
        self.roots = roots
        self.views = views  # a root's real path → where its session sees it (V14)
        self.root_fds: dict[Path, int] = {}
        self.root: Path | None = None  # the root the walk is under, None outside all
        self.outside = PurePosixPath("/")  # where the walk is, while outside all roots
        self.fds: list[int] = []  # fds below ``root``, one per component of ``parts``
        self.parts: list[str] = []
        self.missing: list[str] = []
        self.pending: deque[str] = deque()
        self.links = 0

    # -- where the walk is --------------------------------------------------------

    def _root_of(self, path: PurePosixPath | Path) -> Path | None:
        """The deepest root ``path`` lies under."""
        best: Path | None = None
        for root in self.roots:
            if under(path, root) and (best is None or len(root.parts) > len(best.parts)):
                best = root
        return best

    def _top(self) -> int:
        assert self.root is not None
        if self.fds:
            return self.fds[-1]
        if self.root not in self.root_fds:
            self.root_fds[self.root] = os.open(self.views.get(self.root, self.root), _ROOT_FLAGS)
        return self.root_fds[self.root]

    def _here(self) -> PurePosixPath:
        if self.root is None:
            return self.outside
        return PurePosixPath(self.root, *self.parts)

    def _drop_fds(self) -> None:
        while self.fds:
            os.close(self.fds.pop())
        self.parts = []

    def _seat(self, path: PurePosixPath | Path) -> None:
        """Continue the walk at ``path`` (normalised, absolute): by fd from the root
        that holds it, its components walked again; by name when outside all roots."""
        self._drop_fds()
        root = self._root_of(path)
        self.root = root
        if root is None:
            self.outside = PurePosixPath(path)
            return
        self.pending.extendleft(reversed(PurePosixPath(path).relative_to(root).parts))

    # -- the walk -----------------------------------------------------------------

    def run(self, joined: str) -> Resolved:
        parts = PurePosixPath(joined).parts[1:]  # keeps "..", drops "." and "//"
        # Start at the deepest root the spelling begins with, before any "..".
        start: Path | None = None
        for root in self.roots:
            n = len(root.parts) - 1
            if tuple(parts[:n]) == root.parts[1:] and (
                start is None or len(root.parts) > len(start.parts)
            ):
                start = root
        if start is not None:
            self.root = start
            parts = parts[len(start.parts) - 1 :]
        else:
            self._seat(PurePosixPath("/"))
        self.pending.extend(parts)
        while self.pending:
            part = self.pending.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                self._up()
            elif self.missing:
                self.missing.append(part)
            elif self.root is None:
                self._step_outside(part)
            else:
                self._step(part)
        if self.root is None:
            raise Escape(str(PurePosixPath(self.outside, *self.missing)))
        return self._result()

    def _up(self) -> None:
        if self.missing:
            self.missing.pop()
        elif self.root is None:
            self.outside = self.outside.parent
        elif self.fds:
            os.close(self.fds.pop())
            self.parts.pop()
        else:
            self._seat(PurePosixPath(self.root.parent))

    def _step(self, part: str) -> None:
        top = self._top()
        try:
            fd = os.open(part, STEP_FLAGS, dir_fd=top)
        except (FileNotFoundError, NotADirectoryError):
            self.missing.append(part)
            return
        try:
            mode = os.fstat(fd).st_mode
            target = os.readlink(part, dir_fd=top) if stat.S_ISLNK(mode) else None
        except BaseException:
            os.close(fd)
            raise
        if target is None:
            self.fds.append(fd)
            self.parts.append(part)
            return
        os.close(fd)
        self._follow(self._here(), target)

    def _follow(self, directory: PurePosixPath, target: str) -> None:
        """A symlink in ``directory`` (a real path under a root) points to ``target``:
        followed only when the target, normalised, stays under a root."""
        self.links += 1
        if self.links > _MAX_SYMLINKS:
            raise TooManyLinks
        where = PurePosixPath(os.path.normpath(os.path.join(directory, target)))
        if self._root_of(where) is None:
            raise Escape(str(where))
        self._seat(where)

    def _step_outside(self, part: str) -> None:
        """A component above every root: looked at by name, it only picks a root."""
        path = self.outside / part
        if self._root_of(path) is not None:
            self._seat(path)
            return
        try:
            is_link = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            is_link = False
        if is_link:
            self.links += 1
            if self.links > _MAX_SYMLINKS:
                raise TooManyLinks
            self._seat(PurePosixPath(os.path.realpath(path)))
        else:
            self.outside = path

    def _result(self) -> Resolved:
        assert self.root is not None
        path = Path(self.root, *self.parts, *self.missing)
        if self.missing:
            dir_fd = self.fds.pop() if self.fds else os.dup(self._top())
            name, missing = self.missing[-1], tuple(self.missing[:-1])
        elif self.fds:
            os.close(self.fds.pop())
            name, missing = self.parts[-1], ()
            dir_fd = self.fds.pop() if self.fds else os.dup(self._top())
        else:
            dir_fd, name, missing = os.dup(self._top()), ".", ()
        return Resolved(path, dir_fd, name, missing, self.roots)

    def close(self) -> None:
        self._drop_fds()
        for fd in self.root_fds.values():
            os.close(fd)
        self.root_fds.clear()
