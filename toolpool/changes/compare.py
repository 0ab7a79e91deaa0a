"""What differs between two trees, path by path (SPEC B8): a session's workspace now
against where it started (or a checkpoint), as ``Change`` records.

Files, symlinks and directories count; a special file (a fifo a command left) is
neither compared nor carried anywhere. Content is compared byte for byte, modes by
their permission bits; owners and extended attributes are not compared.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from toolpool.changes.tree import Tree


class ChangeKind(StrEnum):
    ADDED = "added"
    MODIFIED = "modified"  # content (and maybe mode) differs
    DELETED = "deleted"
    MODE = "mode"  # only the permission bits differ


class EntryType(StrEnum):
    FILE = "file"
    SYMLINK = "symlink"
    DIRECTORY = "directory"


@dataclass(frozen=True, slots=True)
class Change:
    """One path that differs: ``path`` relative to the workspace, its ``type`` (the
    new one, or the old for a deletion), and its permission bits before and after
    (None where it is absent)."""

    path: str
    kind: ChangeKind
    type: EntryType
    old_mode: int | None = None
    new_mode: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "kind": self.kind.value,
            "type": self.type.value,
            "old_mode": self.old_mode,
            "new_mode": self.new_mode,
        }


def entry_type(found: os.stat_result) -> EntryType | None:
    """What kind of entry this is, or None for a special file (not compared)."""
    mode = found.st_mode
    if stat.S_ISREG(mode):
        return EntryType.FILE
    if stat.S_ISLNK(mode):
        return EntryType.SYMLINK
    if stat.S_ISDIR(mode):
        return EntryType.DIRECTORY
    return None


def same_content(old: Tree, new: Tree, path: str, kind: EntryType) -> bool:
    if kind is EntryType.SYMLINK:
        return old.readlink(path) == new.readlink(path)
    left, right = old.open(path), new.open(path)
    try:
        while True:
            a, b = os.read(left, 1 << 20), os.read(right, 1 << 20)
            if a != b:
                return False
            if not a:
                return True
    finally:
        os.close(left)
        os.close(right)


def compare(old: Tree, new: Tree, paths: Iterable[str]) -> list[Change]:
    """The changes from ``old`` to ``new`` at ``paths`` (parents before children),
    in that order; a directory that became something else takes what lay under it
    along (its entries deleted, or added)."""
    changes: list[Change] = []
    done: set[str] = set()

    def deleted(path: str, kind: EntryType, mode: int) -> None:
        if path not in done:
            done.add(path)
            changes.append(Change(path, ChangeKind.DELETED, kind, old_mode=mode))

    for path in paths:
        if path in done:
            continue
        before, after = old.stat(path), new.stat(path)
        was = None if before is None else entry_type(before)
        now = None if after is None else entry_type(after)
        old_mode = None if before is None or was is None else stat.S_IMODE(before.st_mode)
        new_mode = None if after is None or now is None else stat.S_IMODE(after.st_mode)
        if was is None and now is None:
            continue
        if was is not None and now is not was:
            if was is EntryType.DIRECTORY:
                for below, entry in sorted(old.below(path), key=lambda e: e[0].split("/")):
                    kind = entry_type(entry)
                    if kind is not None:
                        deleted(below, kind, stat.S_IMODE(entry.st_mode))
            assert old_mode is not None
            deleted(path, was, old_mode)
            if now is None:
                continue
        if was is not now:
            assert now is not None
            done.add(path)
            changes.append(Change(path, ChangeKind.ADDED, now, new_mode=new_mode))
            continue
        assert now is not None
        done.add(path)
        content = now is EntryType.DIRECTORY or same_content(old, new, path, now)
        if not content:
            changes.append(Change(path, ChangeKind.MODIFIED, now, old_mode, new_mode))
        elif old_mode != new_mode and now is not EntryType.SYMLINK:
            changes.append(Change(path, ChangeKind.MODE, now, old_mode, new_mode))
    return changes
