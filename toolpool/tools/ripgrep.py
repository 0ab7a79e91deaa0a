"""Running ripgrep for ``glob`` and ``grep``: streamed, cancellable, never leaked.

Both tools see files the same way, through ``RIPGREP_DEFAULTS``: ``.gitignore``,
``.ignore`` and ``.rgignore`` are honoured even outside a git repository
(``--no-require-git``); hidden files are included (``.github/``, ``.env.example``
matter) but the ``.git`` directory is not; a user's ``~/.ripgreprc`` is not read, so
the output is the same on every machine.

The process is always killed and reaped before ``run_ripgrep`` returns or raises —
when the caller has seen enough, when the call is cancelled (``ctx.cancelled``, or a
``Cancelled`` raised into this thread by a worker), or when anything else fails.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolpool.cancel import Cancelled, CancelSource
from toolpool.errors import ToolError
from toolpool.tool import ToolContext

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


def _decode(raw: bytes | bytearray) -> str:
    return bytes(raw).decode("utf-8", errors="replace").removesuffix("\r")


def run_ripgrep(
    args: Sequence[str], cwd: Path, ctx: ToolContext, on_line: Callable[[str], bool]
) -> RipgrepExit:
    """Run ``rg RIPGREP_DEFAULTS + args`` in ``cwd`` and pass each output line to
    ``on_line`` as it comes; ``on_line`` answers False to stop early."""
    with subprocess.Popen(
        [ripgrep_executable(), *RIPGREP_DEFAULTS, *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,  # with no path given, rg must not search stdin
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:  # leaving the block closes the pipes and reaps rg
        try:
            return _pump(proc, ctx, on_line)
        finally:
            if proc.poll() is None:
                proc.kill()


def _pump(
    proc: subprocess.Popen[bytes], ctx: ToolContext, on_line: Callable[[str], bool]
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
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if not on_line(_decode(line)):
                            return RipgrepExit(None, _decode(stderr).strip())
    if pending and not on_line(_decode(pending)):
        return RipgrepExit(None, _decode(stderr).strip())
    return RipgrepExit(proc.wait(), _decode(stderr).strip())
