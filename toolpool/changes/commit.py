"""A session's workspace changes applied to the host directory it came from (SPEC
B10): every changed path checked against what the session started from first, each
file written atomically, and everything written so far put back if one write fails.

What the session started from is known without a copy of it: the host's directory is
the lower layer, unchanged by the session, so a path the host changed since the
session began has a ``ctime`` from after it (``BaseMarks.since_ns``; a path a commit
wrote, after that commit). A path the host no longer has counts as changed by the
host when the session found it there (the session's layer copied it up: overlayfs's
``origin`` mark) or a commit wrote it. Any such path refuses the whole commit
(``CommitConflict``, listing them) before a byte is written; a path that changes
between that check and its own write is found then, and the commit undone.

Writes go through descriptors, never through a symlink of the host's: a file is
written to a new name in its directory and renamed over the old one, a deletion is a
rename out of the way, a directory is made where one is missing and removed where the
session removed it (unless the host put something in it). What a write replaces or
removes is kept in one directory of the commit's own at the host directory's top
(``.toolpool-commit-*``: a hard link, or the entry moved there) until the commit is
whole, and put back from there otherwise. As root, a replaced file keeps its owner
and a new one takes its directory's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.changes.compare import Change, ChangeKind, EntryType
from toolpool.changes.tree import Tree

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CommitConflict(Exception):
    """Paths the host changed since the session started from them: nothing written."""

    def __init__(self, paths: Sequence[str], why: str = "") -> None:
        self.paths = list(paths)
        shown = ", ".join(self.paths[:20]) + (" …" if len(self.paths) > 20 else "")
        super().__init__(
            f"the host changed {len(self.paths)} of the session's paths since it started "
            f"from them{why}: {shown}. Nothing was written."
        )


@dataclass(slots=True)
class BaseMarks:
    """What the session knows of the host directory it started from: the time it
    began (``since_ns``, a little before, on the safe side) and, for each path a
    commit wrote, its ctime after the write (None: the commit deleted it)."""

    since_ns: int
    written: dict[str, int | None] = field(default_factory=dict)

    def copy(self) -> BaseMarks:
        return BaseMarks(self.since_ns, dict(self.written))


@dataclass(slots=True)
class _Step:
    """One change done, and how to undo it: ``kept`` names what it replaced or
    removed in the commit's own directory; ``made``, it made the entry."""

    directory: int  # an fd of the host directory it happened in (owned)
    name: str
    kept: str | None = None
    made: bool = False
    mode: int | None = None  # a directory's mode before (a mode change, or its removal)


def _stamp(found: os.stat_result | None) -> tuple[int, ...] | None:
    if found is None:
        return None
    return (found.st_ino, found.st_mode, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class _Host:
    """The host directory, walked by descriptor, and the commit's own directory at its
    top (made at the first entry it keeps)."""

    def __init__(self, root: Path) -> None:
        self.root = os.open(root, _DIR)
        self.keep_fd = -1
        self.keep_name = ""
        self._kept = 0

    def close(self) -> None:
        if self.keep_fd >= 0:
            os.close(self.keep_fd)
        os.close(self.root)

    def directory(self, parts: Sequence[str], made: list[tuple[int, str]] | None = None) -> int:
        """An fd of the directory ``parts`` (owned by the caller). A missing one is
        made when ``made`` collects what was made; a symlink on the way is a
        CommitConflict."""
        fd = os.dup(self.root)
        for part in parts:
            try:
                below = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if made is None:
                    os.close(fd)
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                made.append((os.dup(fd), part))
                below = os.open(part, _DIR, dir_fd=fd)
                self.own(below, fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CommitConflict(
                        ["/".join(parts)], " (a symlink or file where a directory was)"
                    ) from None
                raise
            os.close(fd)
            fd = below
        return fd

    def stat(self, path: str) -> os.stat_result | None:
        *parents, name = path.split("/")
        try:
            fd = self.directory(parents)
        except (FileNotFoundError, CommitConflict):
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def own(self, fd: int, directory: int) -> None:
        """As root, a new entry belongs to its directory's owner."""
        if os.geteuid() == 0:
            found = os.fstat(directory)
            os.fchown(fd, found.st_uid, found.st_gid)

    def keep(self, directory: int, name: str, *, move: bool) -> str:
        """Keep the entry ``name`` of ``directory`` in the commit's own directory (a
        hard link, or moved there); its name there."""
        if self.keep_fd < 0:
            self.keep_name = f".toolpool-commit-{secrets.token_hex(6)}"
            os.mkdir(self.keep_name, 0o700, dir_fd=self.root)
            self.keep_fd = os.open(self.keep_name, _DIR, dir_fd=self.root)
        self._kept += 1
        kept = str(self._kept)
        if move:
            os.rename(name, kept, src_dir_fd=directory, dst_dir_fd=self.keep_fd)
        else:
            os.link(name, kept, src_dir_fd=directory, dst_dir_fd=self.keep_fd,
                    follow_symlinks=False)  # fmt: skip
        return kept

    def put_back(self, step: _Step) -> None:
        assert step.kept is not None
        os.rename(step.kept, step.name, src_dir_fd=self.keep_fd, dst_dir_fd=step.directory)

    def discard_kept(self) -> None:
        """The commit is whole: what it kept goes."""
        if self.keep_fd >= 0:
            shutil.rmtree(self.keep_name, dir_fd=self.root, ignore_errors=True)


_UNKNOWN = -2  # a path no commit wrote


def _check(
    place: _Host, changes: Sequence[Change], marks: BaseMarks, from_base: Callable[[str], bool]
) -> tuple[list[str], dict[str, tuple[int, ...] | None]]:
    """The changed paths the host changed since the session started from them, and
    what the host holds at each path now (to find a change as the commit runs)."""
    refused = []
    found = {}
    for change in changes:
        now = place.stat(change.path)
        found[change.path] = _stamp(now)
        if change.type is EntryType.DIRECTORY:
            continue  # a directory's ctime moves with its entries: not a sign
        known = marks.written.get(change.path, _UNKNOWN)
        if now is not None:
            after = marks.since_ns if known in (_UNKNOWN, None) else (known or 0) + 1
            if now.st_ctime_ns >= after:
                refused.append(change.path)
        elif change.kind is not ChangeKind.DELETED:
            existed = from_base(change.path) if known == _UNKNOWN else known is not None
            if existed:  # the host removed what the session found (or a commit wrote)
                refused.append(change.path)
    return refused, found


def commit(
    view: Tree,
    host: Path,
    changes: Sequence[Change],
    marks: BaseMarks,
    from_base: Callable[[str], bool],
) -> list[str]:
    """Apply ``changes`` (from the host's directory ``host`` to the session's
    ``view``) to ``host``; the paths written. CommitConflict (nothing written) when
    the host changed one of them; OSError (everything undone) when a write fails."""
    place = _Host(host)
    steps: list[_Step] = []
    made: list[tuple[int, str]] = []
    try:
        refused, expected = _check(place, changes, marks, from_base)
        if refused:
            raise CommitConflict(refused)
        # Deletions first, the deepest first (a directory after what it held), then
        # the rest, parents before what they hold.
        deletions = [c for c in changes if c.kind is ChangeKind.DELETED]
        for change in sorted(deletions, key=lambda c: c.path.count("/"), reverse=True):
            _delete(place, change, expected[change.path], steps)
            expected[change.path] = None  # what takes its place finds nothing there
        for change in changes:
            if change.kind is not ChangeKind.DELETED:
                _write(place, view, change, expected[change.path], steps, made)
    except BaseException:
        _undo(place, steps, made)
        place.close()
        raise
    place.discard_kept()
    for step in steps:
        os.close(step.directory)
    for fd, _ in made:
        os.close(fd)
    written = []
    try:
        for change in changes:
            after = place.stat(change.path)
            if change.type is not EntryType.DIRECTORY:
                marks.written[change.path] = None if after is None else after.st_ctime_ns
            written.append(change.path)
    finally:
        place.close()
    return written


def _unchanged(place: _Host, path: str, expected: tuple[int, ...] | None) -> None:
    if _stamp(place.stat(path)) != expected:
        raise CommitConflict([path], " (as the commit ran)")


def _delete(
    place: _Host, change: Change, expected: tuple[int, ...] | None, steps: list[_Step]
) -> None:
    *parents, name = change.path.split("/")
    try:
        fd = place.directory(parents)
    except FileNotFoundError:
        return  # gone on the host too
    try:
        if change.type is EntryType.DIRECTORY:
            try:
                mode = stat.S_IMODE(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                os.close(fd)
                return
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:  # the host put something in it since
                    raise CommitConflict(
                        [change.path], " (entries the session never saw)"
                    ) from None
                raise
            steps.append(_Step(fd, name, mode=mode))
            return
        _unchanged(place, change.path, expected)
        steps.append(_Step(fd, name, kept=place.keep(fd, name, move=True)))
    except BaseException:
        if not steps or steps[-1].directory != fd:
            os.close(fd)
        raise


def _write(
    place: _Host,
    view: Tree,
    change: Change,
    expected: tuple[int, ...] | None,
    steps: list[_Step],
    made: list[tuple[int, str]],
) -> None:
    *parents, name = change.path.split("/")
    fd = place.directory(parents, made)
    if change.type is EntryType.DIRECTORY:
        _directory(place, change, name, fd, steps)
        return
    temporary = f".toolpool-commit-{secrets.token_hex(6)}"
    if change.type is EntryType.SYMLINK:
        os.symlink(view.readlink(change.path), temporary, dir_fd=fd)
    else:
        _copy_in(view, change, temporary, fd)
    try:
        old = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    owner = old if old is not None else os.fstat(fd)
    if os.geteuid() == 0:
        os.chown(temporary, owner.st_uid, owner.st_gid, dir_fd=fd, follow_symlinks=False)
    step = _Step(fd, name, made=old is None)
    try:
        _unchanged(place, change.path, expected)
        if old is not None:
            step.kept = place.keep(fd, name, move=False)
        os.rename(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=fd)
        os.close(fd)
        raise
    steps.append(step)


def _directory(place: _Host, change: Change, name: str, fd: int, steps: list[_Step]) -> None:
    """A directory the session made, or whose mode it changed."""
    try:
        os.mkdir(name, 0o700, dir_fd=fd)
        step = _Step(fd, name, made=True)
    except FileExistsError:
        step = _Step(fd, name)
    steps.append(step)
    try:
        inside = os.open(name, _DIR, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CommitConflict(
                [change.path], " (a symlink or file where a directory was)"
            ) from None
        raise
    try:
        if step.made:
            place.own(inside, fd)
        else:
            step.mode = stat.S_IMODE(os.fstat(inside).st_mode)
        os.fchmod(inside, change.new_mode if change.new_mode is not None else 0o755)
    finally:
        os.close(inside)


def _copy_in(view: Tree, change: Change, temporary: str, directory: int) -> None:
    source = view.open(change.path)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        target = os.open(temporary, flags, 0o600, dir_fd=directory)
        try:
            while chunk := os.read(source, 1 << 20):
                os.write(target, chunk)
            os.fchmod(target, change.new_mode if change.new_mode is not None else 0o644)
            os.fsync(target)
        except BaseException:
            os.close(target)
            os.unlink(temporary, dir_fd=directory)
            raise
        os.close(target)
    finally:
        os.close(source)


def _undo(place: _Host, steps: list[_Step], made: list[tuple[int, str]]) -> None:
    """Put back what ``steps`` changed, the last first, then remove the directories
    made on the way and the commit's own directory."""
    for step in reversed(steps):
        with contextlib.suppress(OSError):
            if step.made:
                try:
                    os.unlink(step.name, dir_fd=step.directory)
                except IsADirectoryError:
                    os.rmdir(step.name, dir_fd=step.directory)
            if step.kept is not None:
                place.put_back(step)
            elif step.mode is not None:
                try:
                    inside = os.open(step.name, _DIR, dir_fd=step.directory)
                    os.fchmod(inside, step.mode)
                    os.close(inside)
                except FileNotFoundError:  # a removed directory: made again
                    os.mkdir(step.name, step.mode, dir_fd=step.directory)
        os.close(step.directory)
    for fd, name in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=fd)
        os.close(fd)
    if place.keep_fd >= 0:
        with contextlib.suppress(OSError):
            os.rmdir(place.keep_name, dir_fd=place.root)
