"""A directory tree as indented text, for ``ls`` and for ``read`` of a directory.

Entries are picked level by level (breadth first) until the cap, then printed as a
tree: when a tree is too big, its top levels are shown whole and the deepest entries
are the ones left out — the model sees the shape and knows where to look closer.

The walk is by fd (SPEC X4): each directory is opened below the listed one with
``open_beneath`` (openat2 ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``, or an
``O_NOFOLLOW`` walk), listed with ``scandir(fd)`` and its entries stat'ed with
``fstatat(fd, name, AT_SYMLINK_NOFOLLOW)``; a directory swapped for a symlink mid-walk
fails to open and is left out, so the walk never lists anything outside. Entries
hidden by the ``deny_read`` policy (X9) are left out too.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.cancel import Cancelled, CancelSource
from toolpool.sandbox.policy import active_policy
from toolpool.tool import ToolContext
from toolpool.tools.support.ignores import DEFAULT_IGNORED_DIRS
from toolpool.tools.support.paths import Resolved, open_beneath, quote


@dataclass(slots=True)
class _Node:
    line: str  # "name/" for a directory, "name -> target" for a symlink, else "name"
    # (each name quoted by paths.quote when it needs it)
    children: list[_Node] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Tree:
    """A rendered tree: its text and how many entries were found and shown."""

    text: str
    shown: int
    total: int


def _ignored(entry: os.DirEntry[str], relative: str, patterns: Sequence[str]) -> bool:
    return any(
        fnmatch.fnmatchcase(entry.name, p) or fnmatch.fnmatchcase(relative, p) for p in patterns
    )


def _line(entry: os.DirEntry[str], dir_fd: int) -> tuple[str, bool]:
    """The entry's line, and whether it is a directory to descend into."""
    name = quote(entry.name)  # a name with a newline must not read as two entries
    if entry.is_symlink():
        try:
            return f"{name} -> {quote(os.readlink(entry.name, dir_fd=dir_fd))}", False
        except OSError:
            return f"{name} -> ?", False
    if entry.is_dir(follow_symlinks=False):
        return f"{name}/", True
    return name, False


def skipped_at(entry: os.DirEntry[str], dir_fd: int) -> bool:
    """Whether a walk leaves this entry out, by fd: an ignored directory by name, or a virtual
    environment under any name (a directory holding ``pyvenv.cfg``)."""
    try:
        if not entry.is_dir(follow_symlinks=False):
            return False
        if entry.name in DEFAULT_IGNORED_DIRS:
            return True
        st = os.stat(f"{entry.name}/pyvenv.cfg", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


class HiddenFilter:
    """Which paths under ``base`` (a real path under the roots) the ``deny_read``
    policy hides: only the hidden paths that lie below ``base`` matter."""

    def __init__(self, base: Path, roots: Sequence[Path]) -> None:
        self.base = base
        self.roots = list(roots)
        self.policy = active_policy()
        self.below = [h for h in self.policy.hidden_paths() if h.is_relative_to(base)]

    def hides(self, relative: str) -> bool:
        if not self.below:
            return False
        path = self.base / relative
        return any(path.is_relative_to(h) for h in self.below) and self.policy.is_hidden(
            path, self.roots
        )


def list_tree(
    target: Resolved,
    ctx: ToolContext,
    *,
    ignore: Sequence[str] = (),
    max_entries: int = 1000,
    max_depth: int | None = None,
) -> Tree:
    """The tree under the directory ``target``, without the default ignores
    (ignores.py), hidden paths, and entries whose name or root-relative path matches
    an ``ignore`` glob; directories first, then files, each by name; symlinks shown
    with their target, never followed. At most ``max_entries`` entries;
    ``max_depth`` 1 lists ``target`` alone."""
    patterns = [p.rstrip("/") for p in ignore]
    hidden = HiddenFilter(target.path, target.roots)
    top = _Node(".")
    queue: deque[tuple[str, _Node | None, int]] = deque([("", top, 1)])
    shown = total = 0
    base_fd = target.open(os.O_RDONLY | os.O_DIRECTORY)
    try:
        while queue:
            if ctx.cancelled:
                raise Cancelled(ctx.cancel_token.source or CancelSource.ABORT)
            prefix, node, depth = queue.popleft()
            try:
                fd = open_beneath(base_fd, prefix, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue  # gone, or swapped for a symlink: nothing to list
            try:
                picked = []
                with os.scandir(fd) as it:
                    for entry in it:
                        relative = prefix + entry.name
                        if (
                            skipped_at(entry, fd)
                            or _ignored(entry, relative, patterns)
                            or hidden.hides(relative)
                        ):
                            continue
                        line, descend = _line(entry, fd)
                        picked.append((not descend, entry.name, line, descend, relative))
            except OSError:
                continue
            finally:
                os.close(fd)
            picked.sort()  # directories first, then by name
            for _, _, line, descend, relative in picked:
                total += 1
                child: _Node | None = None
                # Past the cap the walk goes on only to count what was left out.
                if node is not None and shown < max_entries:
                    child = _Node(line)
                    node.children.append(child)
                    shown += 1
                if descend and (max_depth is None or depth < max_depth):
                    queue.append((relative + "/", child, depth + 1))
    finally:
        os.close(base_fd)
    lines: list[str] = []
    _render(top, 0, lines)
    return Tree("\n".join(lines), shown, total)


def _render(node: _Node, depth: int, out: list[str]) -> None:
    for child in node.children:
        out.append("  " * depth + child.line)
        _render(child, depth + 1, out)
