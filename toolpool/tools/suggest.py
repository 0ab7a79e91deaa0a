"""What to say when the model names a file that does not exist: names that look
alike in the same directory, and files of the same name elsewhere in the workspace."""

from __future__ import annotations

import difflib
import os
from collections import deque
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.tool import ToolContext
from toolpool.tools.ignores import skipped_by_default
from toolpool.tools.paths import display

# The search for the same name elsewhere stops after this many directory entries, so
# a wrong path in a huge tree costs milliseconds, not seconds.
_WALK_BUDGET = 20_000
_MAX_SUGGESTIONS = 3


def similar_names(path: Path, ctx: ToolContext) -> list[str]:
    """Entries of ``path``'s directory whose names look like its name."""
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    close = difflib.get_close_matches(path.name, names, n=_MAX_SUGGESTIONS, cutoff=0.6)
    return [display(path.parent / name, ctx) for name in close]


def same_name_elsewhere(path: Path, ctx: ToolContext) -> list[str]:
    """Files named like ``path`` elsewhere under the workspace, nearest levels first."""
    found: list[str] = []
    budget = _WALK_BUDGET
    queue = deque([ctx.workspace])
    while queue and budget > 0 and len(found) < _MAX_SUGGESTIONS:
        try:
            with os.scandir(queue.popleft()) as it:
                entries = sorted(it, key=lambda e: e.name)  # the same answer every time
        except OSError:
            continue
        budget -= len(entries)
        for entry in entries:
            if skipped_by_default(entry):
                continue
            if entry.is_dir(follow_symlinks=False):
                queue.append(Path(entry.path))
            elif entry.name == path.name and Path(entry.path) != path:
                found.append(display(Path(entry.path), ctx))
    return found[:_MAX_SUGGESTIONS]


def missing_file_message(path: Path, ctx: ToolContext) -> str:
    """``File does not exist: …`` with the suggestions that apply."""
    message = f"Path does not exist: {display(path, ctx)}."
    similar = similar_names(path, ctx)
    if similar:
        message += f" Did you mean {' or '.join(similar)}?"
    elsewhere = [p for p in same_name_elsewhere(path, ctx) if p not in similar]
    if elsewhere:
        message += f" Files with the same name: {', '.join(elsewhere)}."
    if not path.parent.is_dir():
        message += f" (Its directory {display(path.parent, ctx)} does not exist either.)"
    return message


def existing(path: Path, ctx: ToolContext) -> os.stat_result:
    """``path``'s stat, or a ToolError that says what exists instead."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise ToolError(missing_file_message(path, ctx)) from None
    except OSError as exc:
        raise ToolError(f"{display(path, ctx)} cannot be accessed: {exc.strerror}.") from None
