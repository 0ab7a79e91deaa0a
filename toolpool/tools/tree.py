"""A directory tree as indented text, for ``ls`` and for ``read`` of a directory.

Entries are picked level by level (breadth first) until the cap, then printed as a
tree: when a tree is too big, its top levels are shown whole and the deepest entries
are the ones left out — the model sees the shape and knows where to look closer.
"""

from __future__ import annotations

import fnmatch
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.cancel import Cancelled, CancelSource
from toolpool.tool import ToolContext
from toolpool.tools.ignores import skipped_by_default


@dataclass(slots=True)
class _Node:
    line: str  # "name/" for a directory, "name -> target" for a symlink, else "name"
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


def _line(entry: os.DirEntry[str]) -> tuple[str, bool]:
    """The entry's line, and whether it is a directory to descend into."""
    if entry.is_symlink():
        try:
            return f"{entry.name} -> {os.readlink(entry.path)}", False
        except OSError:
            return f"{entry.name} -> ?", False
    if entry.is_dir(follow_symlinks=False):
        return f"{entry.name}/", True
    return entry.name, False


def list_tree(
    root: Path,
    ctx: ToolContext,
    *,
    ignore: Sequence[str] = (),
    max_entries: int = 1000,
    max_depth: int | None = None,
) -> Tree:
    """The tree under ``root``, without the default ignores (ignores.py) and entries
    whose name or root-relative path matches an ``ignore`` glob; directories first,
    then files, each by name; symlinks shown with their target, never followed.
    At most ``max_entries`` entries; ``max_depth`` 1 lists ``root`` alone."""
    patterns = [p.rstrip("/") for p in ignore]
    top = _Node(".")
    queue: deque[tuple[Path, str, _Node | None, int]] = deque([(root, "", top, 1)])
    shown = total = 0
    while queue:
        if ctx.cancelled:
            raise Cancelled(ctx.cancel_token.source or CancelSource.ABORT)
        directory, prefix, node, depth = queue.popleft()
        try:
            with os.scandir(directory) as it:
                entries = [e for e in it if not skipped_by_default(e)]
        except OSError:
            continue
        picked = []
        for entry in entries:
            relative = prefix + entry.name
            if _ignored(entry, relative, patterns):
                continue
            line, descend = _line(entry)
            picked.append((not descend, entry.name, line, descend, relative, entry.path))
        picked.sort()  # directories first, then by name
        for _, _, line, descend, relative, path in picked:
            total += 1
            child: _Node | None = None
            # Past the cap the walk goes on only to count what was left out.
            if node is not None and shown < max_entries:
                child = _Node(line)
                node.children.append(child)
                shown += 1
            if descend and (max_depth is None or depth < max_depth):
                queue.append((Path(path), relative + "/", child, depth + 1))
    lines: list[str] = []
    _render(top, 0, lines)
    return Tree("\n".join(lines), shown, total)


def _render(node: _Node, depth: int, out: list[str]) -> None:
    for child in node.children:
        out.append("  " * depth + child.line)
        _render(child, depth + 1, out)
