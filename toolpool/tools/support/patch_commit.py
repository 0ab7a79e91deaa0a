"""A planned patch written all or none across its files (``apply_patch.py``).

Every file that existed and changes gets a hard link beside it (its
backup, the same inode: content, mode and mtime), new and changed files are written
(atomically, as write does), and deleted and moved-away files are unlinked last. If
a step fails, what was done is undone in reverse: backups renamed back over their
names, created files and directories removed; then the error says so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable

from toolpool.errors import ToolError
from toolpool.tools.support.atomic import write_atomic_at
from toolpool.tools.support.patch_plan import PatchedFile


def commit(changes: list[PatchedFile]) -> None:
    """Write ``changes`` (module docstring: backups, writes, unlinks, undone in reverse
    on a failure); a ToolError that says what failed and that nothing was changed."""
    backups: dict[PatchedFile, str] = {}
    undo: list[tuple[Callable[[], None], str | None]] = []  # a step, the backup it uses
    current: PatchedFile | None = None
    try:
        for current in changes:
            if current.existed:
                backups[current] = _backup(current)
        # New and changed files first, then deletions: a move's source is still there
        # to give its destination the source's mode.
        for current in sorted(changes, key=lambda f: not f.present):
            if current.present:
                _write(current, undo)
            else:
                os.unlink(current.target.name, dir_fd=current.target.dir_fd)
            if current in backups:
                undo.append((_restore(current, backups[current]), backups[current]))
    except BaseException as exc:
        kept: list[str] = []
        for step, backup in reversed(undo):
            failure = _attempt(step)
            if failure is not None:
                kept.append(failure if backup is None else f"{failure} (kept as {backup})")
        for file, backup in backups.items():
            if not any(backup in k for k in kept):
                _remove(file.target.dir_fd, backup)
        if not isinstance(exc, OSError | ToolError):
            raise
        if isinstance(exc, ToolError):
            what = exc.message
        else:
            shown = "A file of the patch" if current is None else current.shown
            what = f"{shown} cannot be written: {exc.strerror or exc}."
        if kept:
            raise ToolError(
                f"{what} The files already written could not all be put back: {'; '.join(kept)}."
            ) from None
        undone = ": the files already written were put back" if undo else ""
        raise ToolError(f"{what} Nothing was changed{undone}.") from None
    for file, backup in backups.items():
        _remove(file.target.dir_fd, backup)


def _backup(file: PatchedFile) -> str:
    """A hard link to ``file`` beside it: the file as it was, to rename back."""
    while True:
        name = f".{file.target.name}.{secrets.token_hex(4)}.orig"
        try:
            os.link(
                file.target.name,
                name,
                src_dir_fd=file.target.dir_fd,
                dst_dir_fd=file.target.dir_fd,
                follow_symlinks=False,
            )
        except FileExistsError:
            continue
        except OSError as exc:
            raise ToolError(
                f"{file.shown}: no backup can be kept to undo the patch if a later write "
                f"failed ({exc.strerror}), so nothing was written."
            ) from None
        return name


def _write(file: PatchedFile, undo: list[tuple[Callable[[], None], str | None]]) -> None:
    target = file.target
    assert file.data is not None
    if target.missing:
        base = os.dup(target.dir_fd)
        missing = target.missing
        undo.append((lambda: _remove_directories(base, missing), None))
        target.make_parents()
    if not file.existed:
        undo.append((lambda: _remove(target.dir_fd, target.name, strict=True), None))
        source = file.moved_from
        if source is not None and source.existed:
            # A moved file keeps its mode: the destination starts as a link to the
            # source, whose mode write_atomic_at then keeps. Another file system, or
            # one without hard links: the usual mode.
            with contextlib.suppress(OSError):
                os.link(
                    source.target.name,
                    target.name,
                    src_dir_fd=source.target.dir_fd,
                    dst_dir_fd=target.dir_fd,
                    follow_symlinks=False,
                )
    file.written = write_atomic_at(target.dir_fd, target.name, file.data)


def _restore(file: PatchedFile, backup: str) -> Callable[[], None]:
    fd, name = file.target.dir_fd, file.target.name
    return lambda: os.rename(backup, name, src_dir_fd=fd, dst_dir_fd=fd)


def _remove(dir_fd: int, name: str, *, strict: bool = False) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        if strict:
            raise


def _remove_directories(base: int, missing: tuple[str, ...]) -> None:
    """Remove the directories a write created below ``base`` (deepest first; only
    empty ones go), then close ``base``."""
    try:
        for depth in range(len(missing), 0, -1):
            with contextlib.suppress(OSError):
                os.rmdir("/".join(missing[:depth]), dir_fd=base)
    finally:
        os.close(base)


def _attempt(step: Callable[[], None]) -> str | None:
    try:
        step()
    except OSError as exc:
        return f"{exc.filename or 'a file'}: {exc.strerror}"
    return None
