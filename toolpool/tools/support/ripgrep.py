"""Running ripgrep for ``glob`` and ``grep``: streamed, cancellable, never leaked.

Both tools see files the same way, through ``RIPGREP_DEFAULTS``: ``.gitignore``,
``.ignore`` and ``.rgignore`` are honoured even outside a git repository
(``--no-require-git``); hidden files are included (``.github/``, ``.env.example``
matter) but the ``.git`` directory is not; a user's ``~/.ripgreprc`` is not read, so
the output is the same on every machine.

rg walks the tree by name, so a directory swapped for a symlink mid-walk could lead it
outside (X4). When the sandbox profile has Landlock, rg therefore starts from a thread
restricted by Landlock read rules (toolpool.sandbox.landlock): it may read only
beneath the session's roots (workspace, extra roots, scratch dir), the ignore files in
the directories above them, and what rg itself needs (its binary, the loader and its
shared libraries, ``/etc/ld.so.cache``, ``/proc/self``), and write nothing. It
starts in the searched directory through that directory's fd (``/proc/self/fd/N``),
never by name. Paths the ``deny_read`` policy hides inside the searched directory are
excluded with ``--glob=!/…`` (X9). Without
Landlock (the profile has it off) rg runs as before, unconfined: the swap race is then
open for glob and grep, as ``toolpool doctor`` says by reporting Landlock off.

The process is always killed and reaped before ``run_ripgrep`` returns or raises —
when the caller has seen enough, when the call is cancelled (``ctx.cancelled``, or a
``Cancelled`` raised into this thread by a worker), or when anything else fails.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import selectors
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolpool.cancel import Cancelled, CancelSource
from toolpool.errors import ToolError
from toolpool.sandbox.landlock import start_restricted
from toolpool.sandbox.layer_namespace import entering
from toolpool.sandbox.policy import active_policy
from toolpool.sandbox.profile import active_profile
from toolpool.tool import ToolContext
from toolpool.tools.support.paths import Access, allowed_roots, root_views

RIPGREP_DEFAULTS = (
    "--no-config",
    "--no-require-git",
    "--hidden",
    "--glob=!.git",
    "--color=never",
)
# How often a silent rg (a long search with no match yet) is checked for cancellation.
_POLL_SECONDS = 0.1
_MAX_STDERR_BYTES = 8192


@dataclass(frozen=True, slots=True)
class RipgrepExit:
    """How rg ended: its exit code (1 means no match, 2 an error; None when the caller
    stopped reading and rg was killed) and what it said on stderr."""

    code: int | None
    stderr: str


def ripgrep_executable() -> str:
    """The path of ``rg``, or a ToolError naming the package to install."""
    found = shutil.which("rg")
    if found is None:
        raise ToolError(
            "ripgrep (rg) is not installed, and this tool needs it. Install the "
            "'ripgrep' package (e.g. apt install ripgrep, brew install ripgrep)."
        )
    return found


def _decode(raw: bytes | bytearray, separator: bytes) -> str:
    text = bytes(raw).decode("utf-8", errors="replace")
    return text.removesuffix("\r") if separator == b"\n" else text


# Outside the roots, what rg reads to start and run (ldd lists the libraries).
_RG_ALSO_READS = ("/etc/ld.so.cache", "/proc/self")
_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


@functools.cache
def ripgrep_needs(rg: str) -> tuple[str, ...]:
    """The files rg needs to read outside the roots: itself, its loader and shared
    libraries (from ``ldd``, once; the library directories when ldd fails), the loader
    cache and ``/proc/self`` (the Rust runtime reads its maps and cgroup)."""
    needs = [os.path.realpath(rg)]
    try:
        done = subprocess.run(["ldd", rg], capture_output=True, text=True, timeout=10, check=False)
        libraries = _LDD_PATH.findall(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        libraries = []
    needs += libraries or [d for d in _LIBRARY_DIRS if os.path.isdir(d)]
    needs += [p for p in _RG_ALSO_READS if os.path.exists(p)]
    return tuple(dict.fromkeys(needs))


_IGNORE_FILES = (".gitignore", ".ignore", ".rgignore", ".git/info/exclude")


def _ignore_files_above(roots: Sequence[Path]) -> list[str]:
    """The ignore files rg reads in the directories above the roots (a workspace in a
    repository's subdirectory), so that confining rg keeps its answers."""
    found: list[str] = []
    for root in roots:
        for parent in root.parents:
            for name in _IGNORE_FILES:
                candidate = parent / name
                if candidate.is_file() and not candidate.is_symlink():
                    found.append(str(candidate))
    return found


def _glob_escape(relative: str) -> str:
    return re.sub(r"([\\*?\[\]{}!])", r"\\\1", relative)


def hidden_globs(cwd: Path, roots: Sequence[Path]) -> list[str]:
    """``--glob=!/…`` for each path the ``deny_read`` policy hides below ``cwd``."""
    policy = active_policy()
    globs = []
    for hidden in policy.hidden_paths():
        if hidden != cwd and hidden.is_relative_to(cwd) and policy.is_hidden(hidden, roots):
            globs.append(f"--glob=!/{_glob_escape(str(hidden.relative_to(cwd)))}")
    return globs


def ripgrep_argv(args: Sequence[str], cwd: Path, ctx: ToolContext) -> list[str]:
    """The argv that runs ``rg RIPGREP_DEFAULTS + args`` in ``cwd`` (a real path under
    the roots): under Landlock read rules when the profile has Landlock, and with the
    hidden paths excluded (after the caller's globs, so that they win: the later
    glob takes precedence in rg)."""
    rg = ripgrep_executable()
    roots = allowed_roots(ctx, Access.READ)
    args = list(args)
    cut = args.index("--") if "--" in args else len(args)
    args[cut:cut] = hidden_globs(cwd, roots)
    return [rg, *RIPGREP_DEFAULTS, *args]


def ripgrep_readable(ctx: ToolContext) -> list[str] | None:
    """What rg may read under Landlock (the roots, the ignore files above them, what
    rg itself needs), or None when the profile has no Landlock. Nothing is writable:
    with reads handled, Landlock leaves rg no file to write either."""
    if not active_profile().active("landlock"):
        return None  # rg reads by name, unconfined, as before (see the docstring)
    roots = allowed_roots(ctx, Access.READ)
    views = root_views(ctx)
    readable = [str(views.get(r, r)) for r in roots if r.is_dir()]
    return [*readable, *_ignore_files_above(roots), *ripgrep_needs(ripgrep_executable())]


_HOLDER_VIEW = re.compile(r"/proc/(\d+)/root/.*")


def _holder_of(ctx: ToolContext) -> int | None:
    """The holder of the session's layers when they live in a user namespace of their
    own (SPEC V17): its workspace view is reached through ``/proc/<holder>/root``."""
    view = ctx.workspace_view
    found = None if view is None else _HOLDER_VIEW.fullmatch(str(view))
    return None if found is None else int(found.group(1))


def run_ripgrep(
    args: Sequence[str],
    cwd: Path,
    ctx: ToolContext,
    on_line: Callable[[str], bool],
    *,
    cwd_fd: int | None = None,
    separator: bytes = b"\n",
) -> RipgrepExit:
    """Run ``rg RIPGREP_DEFAULTS + args`` in ``cwd`` and pass each output line to
    ``on_line`` as it comes; ``on_line`` answers False to stop early. With
    ``cwd_fd`` (an fd of ``cwd``), rg starts in that directory through the fd. With
    ``separator=b"\0"`` (rg's ``--null`` lists of paths) ``on_line`` gets each
    NUL-ended record whole, newlines in file names included."""
    argv = ripgrep_argv(args, cwd, ctx)
    # Opened here: the restricted thread that starts rg may not open /dev/null.
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    holder = _holder_of(ctx) if cwd_fd is not None else None
    with contextlib.ExitStack() as stack:
        # A directory of a session's layers in a user namespace (SPEC V17) is no place
        # rg could name as its working directory from here (getcwd fails): it starts
        # in their namespaces, in the directory by its fd.
        enter = None if holder is None else stack.enter_context(entering(holder, cwd_fd or 0))

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                cwd=cwd if cwd_fd is None else f"/proc/self/fd/{cwd_fd}",
                stdin=devnull,  # with no path given, rg must not search stdin
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=enter,
            )

        readable = ripgrep_readable(ctx)
        try:
            process = start() if readable is None else start_restricted(start, readable=readable)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ToolError(f"ripgrep could not be started confined: {exc}") from exc
        finally:
            os.close(devnull)
    with process as proc:  # leaving the block closes the pipes and reaps rg
        try:
            return _pump(proc, ctx, on_line, separator)
        finally:
            if proc.poll() is None:
                proc.kill()


def _pump(
    proc: subprocess.Popen[bytes],
    ctx: ToolContext,
    on_line: Callable[[str], bool],
    separator: bytes,
) -> RipgrepExit:
    """Feed rg's stdout to ``on_line`` line by line until rg ends or the caller stops."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    pending = bytearray()
    stderr = bytearray()
    with selectors.DefaultSelector() as selector:
        # Both pipes are drained together, so rg never blocks on a full stderr.
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        while selector.get_map():
            if ctx.cancelled:
                raise Cancelled(ctx.cancel_token.source or CancelSource.ABORT)
            for key, _ in selector.select(_POLL_SECONDS):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                elif key.fd == err_fd:
                    stderr += chunk[: _MAX_STDERR_BYTES - len(stderr)]
                else:
                    pending += chunk
                    *lines, pending = pending.split(separator)
                    for line in lines:
                        if not on_line(_decode(line, separator)):
                            return RipgrepExit(None, _decode(stderr, b"\n").strip())
    if pending and not on_line(_decode(pending, separator)):
        return RipgrepExit(None, _decode(stderr, b"\n").strip())
    return RipgrepExit(proc.wait(), _decode(stderr, b"\n").strip())
