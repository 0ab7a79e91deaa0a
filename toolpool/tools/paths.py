"""Where the file tools may reach: a model's path resolved against the session's roots.

Rules, shared by every file tool:

- a relative path is relative to the workspace; an absolute path is taken as given;
- symlinks are resolved before judging (``os.path.realpath``), so a link inside the
  workspace that points outside is outside; for a path that does not exist yet, its
  nearest existing parent is resolved and the rest is appended;
- the resolved path must lie under the workspace or one of ``ctx.extra_roots``;
  reading tools may also reach ``ctx.scratch_dir``.

The tools then work on the resolved path, never on the model's spelling, so what was
judged is what is used. Paths in tool output are written relative to the workspace
when they lie inside it and absolute otherwise (``display``); both forms are valid
input again.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.tool import ToolContext


class Access(Enum):
    """What a tool does with a path: reading tools may also reach the scratch dir."""

    READ = "read"
    WRITE = "write"


def allowed_roots(ctx: ToolContext, access: Access) -> list[Path]:
    """The resolved roots a path may lie under for ``access``, workspace first."""
    roots = [ctx.workspace, *ctx.extra_roots]
    if access is Access.READ and ctx.scratch_dir is not None:
        roots.append(ctx.scratch_dir)
    return [Path(os.path.realpath(root)) for root in roots]


def resolve(raw: str, ctx: ToolContext, access: Access) -> Path:
    """The real path ``raw`` names, or a ToolError when it lies outside every root."""
    if not raw.strip():
        raise ToolError("The path is empty. Give a file path relative to the workspace.")
    if "\0" in raw:
        raise ToolError("The path contains a NUL character.")
    joined = ctx.workspace / raw  # an absolute ``raw`` replaces the workspace
    resolved = Path(os.path.realpath(joined))
    roots = allowed_roots(ctx, access)
    if any(resolved.is_relative_to(root) for root in roots):
        return resolved
    # Only for the message: did the spelling stay inside, so that a symlink led out?
    lexical = Path(os.path.normpath(joined))
    if any(lexical.is_relative_to(root) for root in roots):
        why = f"{raw} is a symlink (or lies under one) that points outside, to {resolved}"
    else:
        why = f"{raw} resolves to {resolved}, outside the workspace {ctx.workspace}"
    reach = "under the workspace"
    if ctx.extra_roots:
        reach += " or the extra roots " + ", ".join(str(r) for r in ctx.extra_roots)
    raise ToolError(f"Access denied: {why}. File tools may only reach paths {reach}.")


def display(path: Path, ctx: ToolContext) -> str:
    """How tool output names ``path``: workspace-relative inside it, absolute outside."""
    workspace = Path(os.path.realpath(ctx.workspace))
    if path == workspace:
        return "."
    if path.is_relative_to(workspace):
        return str(path.relative_to(workspace))
    return str(path)
