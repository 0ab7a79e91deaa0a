"""What to say when the model names a file that does not exist: names that look
alike in the same directory, and files of the same name elsewhere in the workspace.

Directories are listed through fds, as the file tools open files (SPEC X4): a directory
swapped for a symlink meanwhile yields no names from outside."""

from __future__ import annotations

import difflib
import os
from collections import deque
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.refusals import Reason
from toolpool.tool import ToolContext
from toolpool.tools.support.paths import Access, allowed_roots, display, open_beneath, open_path
from toolpool.tools.support.tree import HiddenFilter, skipped_at

# The search for the same name elsewhere stops after this many directory entries, so
# a wrong path in a huge tree costs milliseconds, not seconds.
_WALK_BUDGET = 20_000
_MAX_SUGGESTIONS = 3


def _open_directory(directory: Path, ctx: ToolContext) -> tuple[int, Path] | None:
    """A readable fd of ``directory`` (resolved as the file tools do) and its real
    path; None when it cannot be reached."""
    try:
        with open_path(str(directory), ctx, Access.READ) as target:
            return target.open(os.O_RDONLY | os.O_DIRECTORY), target.path
    except (ToolError, OSError):
        return None


def similar_names(path: Path, ctx: ToolContext) -> list[str]:
    """Entries of ``path``'s directory whose names look like its name."""
    opened = _open_directory(path.parent, ctx)
    if opened is None:
        return []
    fd, real = opened
    try:
        hidden = HiddenFilter(real, allowed_roots(ctx, Access.READ))
        names = [n for n in os.listdir(fd) if not hidden.hides(n)]
    except OSError:
        return []
    finally:
        os.close(fd)
    close = difflib.get_close_matches(path.name, names, n=_MAX_SUGGESTIONS, cutoff=0.6)
    return [display(path.parent / name, ctx) for name in close]


def same_name_elsewhere(path: Path, ctx: ToolContext) -> list[str]:
    """Files named like ``path`` elsewhere under the workspace, nearest levels first."""
    opened = _open_directory(ctx.workspace, ctx)
    if opened is None:
        return []
    base, workspace = opened
    hidden = HiddenFilter(workspace, allowed_roots(ctx, Access.READ))
    found: list[str] = []
    budget = _WALK_BUDGET
    queue = deque([""])
    try:
        while queue and budget > 0 and len(found) < _MAX_SUGGESTIONS:
            prefix = queue.popleft()
            try:
                fd = open_beneath(base, prefix, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue  # gone, or swapped for a symlink
            try:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)  # the same answer every time
                budget -= len(entries)
                for entry in entries:
                    relative = prefix + entry.name
                    if skipped_at(entry, fd) or hidden.hides(relative):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        queue.append(relative + "/")
                    elif entry.name == path.name and workspace / relative != path:
                        found.append(display(workspace / relative, ctx))
            except OSError:
                continue
            finally:
                os.close(fd)
    finally:
        os.close(base)
    return found[:_MAX_SUGGESTIONS]


def missing_file(path: Path, ctx: ToolContext, more: str = "") -> ToolError:
    """The error of a path that does not exist (``missing_file_message`` and ``more``
    after it), with its reason."""
    return ToolError(f"{missing_file_message(path, ctx)}{more}", reason=Reason.NO_FILE)


def missing_file_message(path: Path, ctx: ToolContext) -> str:
    """``File does not exist: …`` with the suggestions that apply."""
    message = f"Path does not exist: {display(path, ctx)}."
    similar = similar_names(path, ctx)
    if similar:
        message += f" Did you mean {' or '.join(similar)}?"
    elsewhere = [p for p in same_name_elsewhere(path, ctx) if p not in similar]
    if elsewhere:
        message += f" Files with the same name: {', '.join(elsewhere)}."
    parent = _open_directory(path.parent, ctx)
    if parent is not None:
        os.close(parent[0])
    else:
        message += f" (Its directory {display(path.parent, ctx)} does not exist either.)"
    return message
