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

``open_path`` returns a ``Resolved``: an fd of the directory that holds the target and
the target's name in it, with the real path for display and the read register. The
tools open, stat, create the temporary file and rename through that fd
(``dir_fd=``, ``O_NOFOLLOW``), never by full name. A swap of a directory for a symlink
while a tool works can then only make the tool fail, never lead it outside.

Only the part of a path *above* every root (an absolute path's ``/home/me/…`` before
it reaches the workspace, or a ``..`` out of a root) is looked at by name: symlinks
there are resolved with ``os.path.realpath``, and the walk goes on by fd only once it
is back under a root, so that part can choose which root, never reach outside one.

Every path a tool message names — results, refusals, previews, summaries — is written
by ``display`` (a resolved path) or ``display_spelling`` (the model's own spelling, for
a path that did not resolve): relative to the workspace when it lies inside it, ``.``
for the workspace itself, absolute otherwise (SPEC E4), never ``../…``. A name that
could be read as something else — a newline or another character that is not
printable, space at either end, a leading double quote — is written as a quoted
string with escapes (``quote``), so a message never names a different file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from enum import Enum
from pathlib import Path, PurePath, PurePosixPath
from types import TracebackType

from toolpool.call_forms import quote as quote  # re-exported: E4's rule, for tools
from toolpool.errors import ToolError
from toolpool.refusals import Reason
from toolpool.sandbox.policy import active_policy
from toolpool.tool import ToolContext
from toolpool.tools.fdwalk import STEP_FLAGS
from toolpool.tools.fdwalk import open_beneath as open_beneath  # re-exported: tools import it here
from toolpool.tools.fdwalk import stat_beneath as stat_beneath

_MAX_SYMLINKS = 40
_ROOT_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


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
    return [Path(os.path.realpath(root)) for root in roots]


class Resolved:
    """A path judged inside a root, held by an fd of its directory.

    ``dir_fd`` (an ``O_PATH`` directory fd, owned) holds the entry ``name`` (``"."``
    when the path is a root itself). ``missing`` are directories between ``dir_fd``
    and ``name`` that do not exist yet; when there are some, the target does not exist
    either. ``path`` is the real path, for display and the read register only.
    """

    __slots__ = ("dir_fd", "missing", "name", "path", "roots")

    def __init__(
        self, path: Path, dir_fd: int, name: str, missing: tuple[str, ...], roots: list[Path]
    ) -> None:
        self.path = path
        self.dir_fd = dir_fd
        self.name = name
        self.missing = missing
        self.roots = roots

    def __enter__(self) -> Resolved:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def seen_at(self) -> str:
        """A name of the target through its directory's fd: where it lies in the
        session's view (its workspace overlay, SPEC V14), for what looks by name."""
        return os.path.join(f"/proc/self/fd/{self.dir_fd}", *self.missing, self.name)

    def _not_found(self) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.path))

    def lstat(self) -> os.stat_result:
        """The target's stat, not following a symlink (one appears only by a swap)."""
        if self.missing:
            raise self._not_found()
        return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)

    def open(self, flags: int, mode: int = 0o666) -> int:
        """``openat(dir_fd, name, flags | O_NOFOLLOW | O_CLOEXEC)``: an fd of the
        target itself, never of what a symlink swapped in since points to."""
        if self.missing:
            raise self._not_found()
        try:
            return os.open(
                self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.dir_fd
            )
        except OSError as exc:
            # What was resolved a moment ago became a symlink, or no longer a
            # directory: something swaps it. Refused, like any path that leads out.
            if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and self._swapped()):
                raise ToolError(
                    f"Access denied: {display_in(self.path, self.roots[0])} changed while "
                    "it was being opened "
                    "(it is now a symlink, or no longer a directory). Try again once "
                    "it holds still."
                ) from exc
            raise

    def _swapped(self) -> bool:
        """After ENOTDIR: the name is a symlink now, or a directory again (it was
        swapped and back), rather than the file that was asked to be a directory.
        (The resolved name is never a link: the walk resolves links to their target.)"""
        try:
            found = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return True
        return stat.S_ISLNK(found.st_mode) or stat.S_ISDIR(found.st_mode)

    def make_parents(self) -> None:
        """Create the missing directories (mkdirat), each opened without following
        links; afterwards ``dir_fd`` holds the new file's directory."""
        while self.missing:
            part = self.missing[0]
            # One made meanwhile is fine: it is opened below without following a link.
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=self.dir_fd)
            fd = os.open(part, STEP_FLAGS | os.O_DIRECTORY, dir_fd=self.dir_fd)
            os.close(self.dir_fd)
            self.dir_fd = fd
            self.missing = self.missing[1:]


class _TooManyLinks(Exception):
    """More than ``_MAX_SYMLINKS`` symlinks on the way."""


class _Escape(Exception):
    """The walk left every root; ``where`` is the path it reached."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def _under(path: PurePosixPath | Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class _Walk:
    """One resolution: the state of the walk, and the fds it holds."""

    def __init__(self, roots: list[Path], views: dict[Path, Path]) -> None:
        self.roots = roots
        self.views = views  # a root's real path → where its session sees it (V14)
        self.root_fds: dict[Path, int] = {}
        self.root: Path | None = None  # the root the walk is under, None outside all
        self.outside = PurePosixPath("/")  # where the walk is, while outside all roots
        self.fds: list[int] = []  # fds below ``root``, one per component of ``parts``
        self.parts: list[str] = []
        self.missing: list[str] = []
        self.pending: deque[str] = deque()
        self.links = 0

    # -- where the walk is --------------------------------------------------------

    def _root_of(self, path: PurePosixPath | Path) -> Path | None:
        """The deepest root ``path`` lies under."""
        best: Path | None = None
        for root in self.roots:
            if _under(path, root) and (best is None or len(root.parts) > len(best.parts)):
                best = root
        return best

    def _top(self) -> int:
        assert self.root is not None
        if self.fds:
            return self.fds[-1]
        if self.root not in self.root_fds:
            self.root_fds[self.root] = os.open(self.views.get(self.root, self.root), _ROOT_FLAGS)
        return self.root_fds[self.root]

    def _here(self) -> PurePosixPath:
        if self.root is None:
            return self.outside
        return PurePosixPath(self.root, *self.parts)

    def _drop_fds(self) -> None:
        while self.fds:
            os.close(self.fds.pop())
        self.parts = []

    def _seat(self, path: PurePosixPath | Path) -> None:
        """Continue the walk at ``path`` (normalised, absolute): by fd from the root
        that holds it, its components walked again; by name when outside all roots."""
        self._drop_fds()
        root = self._root_of(path)
        self.root = root
        if root is None:
            self.outside = PurePosixPath(path)
            return
        self.pending.extendleft(reversed(PurePosixPath(path).relative_to(root).parts))

    # -- the walk -----------------------------------------------------------------

    def run(self, joined: str) -> Resolved:
        parts = PurePosixPath(joined).parts[1:]  # keeps "..", drops "." and "//"
        # Start at the deepest root the spelling begins with, before any "..".
        start: Path | None = None
        for root in self.roots:
            n = len(root.parts) - 1
            if tuple(parts[:n]) == root.parts[1:] and (
                start is None or len(root.parts) > len(start.parts)
            ):
                start = root
        if start is not None:
            self.root = start
            parts = parts[len(start.parts) - 1 :]
        else:
            self._seat(PurePosixPath("/"))
        self.pending.extend(parts)
        while self.pending:
            part = self.pending.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                self._up()
            elif self.missing:
                self.missing.append(part)
            elif self.root is None:
                self._step_outside(part)
            else:
                self._step(part)
        if self.root is None:
            raise _Escape(str(PurePosixPath(self.outside, *self.missing)))
        return self._result()

    def _up(self) -> None:
        if self.missing:
            self.missing.pop()
        elif self.root is None:
            self.outside = self.outside.parent
        elif self.fds:
            os.close(self.fds.pop())
            self.parts.pop()
        else:
            self._seat(PurePosixPath(self.root.parent))

    def _step(self, part: str) -> None:
        top = self._top()
        try:
            fd = os.open(part, STEP_FLAGS, dir_fd=top)
        except (FileNotFoundError, NotADirectoryError):
            self.missing.append(part)
            return
        try:
            mode = os.fstat(fd).st_mode
            target = os.readlink(part, dir_fd=top) if stat.S_ISLNK(mode) else None
        except BaseException:
            os.close(fd)
            raise
        if target is None:
            self.fds.append(fd)
            self.parts.append(part)
            return
        os.close(fd)
        self._follow(self._here(), target)

    def _follow(self, directory: PurePosixPath, target: str) -> None:
        """A symlink in ``directory`` (a real path under a root) points to ``target``:
        followed only when the target, normalised, stays under a root."""
        self.links += 1
        if self.links > _MAX_SYMLINKS:
            raise _TooManyLinks
        where = PurePosixPath(os.path.normpath(os.path.join(directory, target)))
        if self._root_of(where) is None:
            raise _Escape(str(where))
        self._seat(where)

    def _step_outside(self, part: str) -> None:
        """A component above every root: looked at by name, it only picks a root."""
        path = self.outside / part
        if self._root_of(path) is not None:
            self._seat(path)
            return
        try:
            is_link = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            is_link = False
        if is_link:
            self.links += 1
            if self.links > _MAX_SYMLINKS:
                raise _TooManyLinks
            self._seat(PurePosixPath(os.path.realpath(path)))
        else:
            self.outside = path

    def _result(self) -> Resolved:
        assert self.root is not None
        path = Path(self.root, *self.parts, *self.missing)
        if self.missing:
            dir_fd = self.fds.pop() if self.fds else os.dup(self._top())
            name, missing = self.missing[-1], tuple(self.missing[:-1])
        elif self.fds:
            os.close(self.fds.pop())
            name, missing = self.parts[-1], ()
            dir_fd = self.fds.pop() if self.fds else os.dup(self._top())
        else:
            dir_fd, name, missing = os.dup(self._top()), ".", ()
        return Resolved(path, dir_fd, name, missing, self.roots)

    def close(self) -> None:
        self._drop_fds()
        for fd in self.root_fds.values():
            os.close(fd)
        self.root_fds.clear()


def _denied(raw: str, where: str, joined: str, roots: list[Path], ctx: ToolContext) -> ToolError:
    # Only for the message: did the spelling stay inside, so that a symlink led out?
    lexical = Path(os.path.normpath(joined))
    spelled = display_spelling(raw, ctx)
    outside = display_in(PurePosixPath(where), roots[0])  # outside every root: absolute
    if any(_under(lexical, root) for root in roots):
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
    walk = _Walk(roots, root_views(ctx))
    try:
        resolved = walk.run(joined)
    except _Escape as escape:
        raise _denied(raw, escape.where, joined, roots, ctx) from None
    except _TooManyLinks:
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


def real_workspace(ctx: ToolContext) -> Path:
    """The workspace's real path, which resolved paths are compared with."""
    return Path(os.path.realpath(ctx.workspace))


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
