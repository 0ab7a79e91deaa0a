"""Where the file tools may reach: a model's path resolved against the session's roots,
race-free (SPEC F1, X4, X9).

Rules, shared by every file tool:

- a relative path is relative to the workspace; an absolute path is taken as given;
- the roots are the workspace and ``ctx.extra_roots``; reading tools may also reach
  ``ctx.scratch_dir``. The roots themselves are trusted (the operator chose them);
- below a root the path is walked component by component from a directory fd of the
  root, each step an ``openat(O_PATH | O_NOFOLLOW)`` relative to the directory fd of
  the step before, so what was judged is what is used: nothing is looked up by its
  full name again. A ``..`` goes back to the real parent (the fd one step up);
- a symlink met on the way is followed only when its target stays inside a root: the
  target is joined to the link's (real) directory and normalised lexically, and must
  lie under a root — a relative or absolute link into the workspace is followed (and
  walked again, from the fd of the root it points into, re-checked at every step), a
  link that points outside is refused at once, even when something outside would
  lead back in. At most 40 links per path;
- a path that does not exist yet (``write`` of a new file) keeps its missing
  components; ``write`` creates the missing directories through the fds (mkdirat);
- a path hidden by the ``deny_read`` policy (``active_policy().is_hidden``) is
  refused, inside a root or not.

``open_path`` returns a ``Resolved`` (``path_walk.py``, which walks): an fd of the
directory that holds the target and the target's name in it, with the real path for
display and the read register. The tools open, stat, create the temporary file and
rename through that fd (``dir_fd=``, ``O_NOFOLLOW``), never by full name. A swap of
a directory for a symlink while a tool works can then only make the tool fail, never
lead it outside.

Only the part of a path *above* every root (an absolute path's ``/home/me/…`` before
it reaches the workspace, or a ``..`` out of a root) is looked at by name: symlinks
there are resolved with ``os.path.realpath``, and the walk goes on by fd only once it
is back under a root, so that part can choose which root, never reach outside one.

Every path a tool message names — results, refusals, previews, summaries — is written
by ``display`` (a resolved path) or ``display_spelling`` (the model's own spelling, for
a path that did not resolve; both in ``path_names.py``, named here too): relative to
the workspace when it lies inside it, ``.`` for the workspace itself, absolute
otherwise (SPEC E4), never ``../…``. A name that could be read as something else — a
newline or another character that is not printable, space at either end, a leading
double quote — is written as a quoted string with escapes (``quote``), so a message
never names a different file.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path, PurePosixPath

from toolpool.call_forms import quote as quote  # re-exported: E4's rule, for tools
from toolpool.errors import ToolError
from toolpool.refusals import Reason
from toolpool.sandbox.policy import active_policy
from toolpool.tool import ToolContext
from toolpool.tools.support.fdwalk import (
    open_beneath as open_beneath,  # re-exported: tools import it here
)
from toolpool.tools.support.fdwalk import stat_beneath as stat_beneath
from toolpool.tools.support.path_names import argument_path as argument_path
from toolpool.tools.support.path_names import display as display
from toolpool.tools.support.path_names import display_in as display_in
from toolpool.tools.support.path_names import display_spelling as display_spelling
from toolpool.tools.support.path_names import real_root
from toolpool.tools.support.path_names import real_workspace as real_workspace
from toolpool.tools.support.path_walk import Escape, TooManyLinks, Walk, under
from toolpool.tools.support.path_walk import (
    Resolved as Resolved,  # re-exported: tools import it here
)


def os_reason(exc: OSError) -> str:
    """The reason of a ToolError made of ``exc``: ``PERMISSION_DENIED`` or none."""
    return Reason.PERMISSION_DENIED if isinstance(exc, PermissionError) else ""


class Access(Enum):
    """What a tool does with a path: reading tools may also reach the scratch dir."""

    READ = "read"
    WRITE = "write"


def root_views(ctx: ToolContext) -> dict[Path, Path]:
    """Where the session sees a root, where that is not the root itself: its overlay
    of the workspace (SPEC V14). A session whose workspace is an overlay that this
    executor does not give (in-process) has every file tool refused: it would read
    and write the host's directory."""
    if not ctx.workspace_overlay:
        return {}
    if ctx.workspace_view is None:
        raise ToolError(
            "This session's workspace_mode is \"overlay\", which only the daemon's pool "
            "gives (here the file tools would write the host's directory).",
            code="sandbox_failed",
        )
    return {Path(os.path.realpath(ctx.workspace)): ctx.workspace_view}


def allowed_roots(ctx: ToolContext, access: Access) -> list[Path]:
    """The resolved roots a path may lie under for ``access``, workspace first."""
    roots = [ctx.workspace, *ctx.extra_roots]
    if access is Access.READ and ctx.scratch_dir is not None:
        roots.append(ctx.scratch_dir)
    return [real_root(root) for root in roots]


def _denied(raw: str, where: str, joined: str, roots: list[Path], ctx: ToolContext) -> ToolError:
    # Only for the message: did the spelling stay inside, so that a symlink led out?
    lexical = Path(os.path.normpath(joined))
    spelled = display_spelling(raw, ctx)
    outside = display_in(PurePosixPath(where), roots[0])  # outside every root: absolute
    if any(under(lexical, root) for root in roots):
        why = f"{spelled} is a symlink (or lies under one) that points outside, to {outside}"
    else:
        why = f"{spelled} resolves to {outside}, outside the workspace {quote(str(ctx.workspace))}"
    reach = "under the workspace"
    if ctx.extra_roots:
        reach += " or the extra roots " + ", ".join(quote(str(r)) for r in ctx.extra_roots)
    return ToolError(f"Access denied: {why}. File tools may only reach paths {reach}.")


def hidden_message(path: Path, ctx: ToolContext) -> str:
    return (
        f"Access denied: {display(path, ctx)} is hidden by the deny_read policy; "
        "file tools may not read or change it."
    )


def open_path(raw: str, ctx: ToolContext, access: Access) -> Resolved:
    """Resolve ``raw`` by fd (module docstring): a ``Resolved`` to close, or a
    ToolError when it lies outside every root or is hidden."""
    if not raw.strip():
        raise ToolError("The path is empty. Give a file path relative to the workspace.")
    if "\0" in raw:
        raise ToolError("The path contains a NUL character.")
    roots = allowed_roots(ctx, access)
    joined = os.path.join(ctx.workspace, raw)  # an absolute ``raw`` replaces the workspace
    walk = Walk(roots, root_views(ctx))
    try:
        resolved = walk.run(joined)
    except Escape as escape:
        raise _denied(raw, escape.where, joined, roots, ctx) from None
    except TooManyLinks:
        spelled = display_spelling(raw, ctx)
        raise ToolError(f"{spelled}: too many levels of symbolic links.") from None
    except OSError as exc:
        spelled = display_spelling(raw, ctx)
        raise ToolError(
            f"{spelled} cannot be resolved: {exc.strerror or exc}.", reason=os_reason(exc)
        ) from None
    finally:
        walk.close()
    if active_policy().is_hidden(resolved.path, roots):
        resolved.close()
        raise ToolError(hidden_message(resolved.path, ctx))
    return resolved


def resolve(raw: str, ctx: ToolContext, access: Access) -> Path:
    """The real path ``raw`` names, or a ToolError when it lies outside every root or
    is hidden. For judging and naming only: tools work through ``open_path``."""
    with open_path(raw, ctx, access) as resolved:
        return resolved.path
