"""How a tool message names a path (SPEC E4): relative to the workspace when it lies
inside it, ``.`` for the workspace itself, absolute otherwise, never ``../…``; quoted
with escapes when it could be read as something else (``call_forms.quote``).
``paths.py`` says where the file tools may reach.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath

from toolpool.call_forms import quote
from toolpool.tool import ToolContext


def real_workspace(ctx: ToolContext) -> Path:
    """The workspace's real path, which resolved paths are compared with."""
    return real_root(ctx.workspace)


def real_root(root: Path) -> Path:
    """A session root's real path, resolved once per process. The session resolved
    its roots when it opened, and what lies above a root is outside every root, which
    no file tool may change and a command sees read-only; resolved at each use, they
    cost a system call per component, several times a call (a read and an edit:
    eight resolutions of their roots)."""
    real = _real_roots.get(root)
    if real is None:
        if len(_real_roots) >= _ROOTS_KEPT:
            _real_roots.clear()
        real = _real_roots[root] = Path(os.path.realpath(root))
    return real


_real_roots: dict[Path, Path] = {}
_ROOTS_KEPT = 256


def display(path: PurePath, ctx: ToolContext) -> str:
    """How a tool message names ``path`` (a real path, as resolution gives it):
    workspace-relative inside it, absolute outside (SPEC E4), quoted when needed."""
    return quote(argument_path(path, ctx))


def argument_path(path: PurePath, ctx: ToolContext) -> str:
    """``path`` as a call's argument names it: ``display``'s form, never quoted (a
    message that names a call writes it as a string literal: call_forms.literal)."""
    workspace = real_workspace(ctx)
    if path == workspace:
        return "."
    return str(path.relative_to(workspace) if path.is_relative_to(workspace) else path)


def display_in(path: PurePath, workspace: Path) -> str:
    """``display`` against ``workspace`` (a real path), for callers that name many
    paths of one call and resolve the workspace once."""
    if path == workspace:
        return "."
    if path.is_relative_to(workspace):
        return quote(str(path.relative_to(workspace)))
    return quote(str(path))


def display_spelling(raw: str, ctx: ToolContext) -> str:
    """How a message names a path the model spelled that did not resolve (a refusal):
    as written, but workspace-relative when it is an absolute spelling below the
    workspace without ``..`` (the same file either way; with a ``..`` after a symlink
    the lexical form could name another), quoted when needed."""
    spelled = Path(raw)
    if spelled.is_absolute() and ".." not in spelled.parts:
        for workspace in (Path(ctx.workspace), real_workspace(ctx)):
            if spelled.is_relative_to(workspace):
                return display_in(spelled, workspace)
    return quote(raw)
