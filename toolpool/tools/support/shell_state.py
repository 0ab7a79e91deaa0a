"""What a session's ``bash`` carries from one command to the next (SPEC V10, V11).

Every command is its own process tree; what persists is saved, not kept alive:

- always, the working directory: where the last command ended, if that lies inside
  the session's roots (the workspace, ``extra_roots``); elsewhere, or gone, the next
  command starts in the workspace and the result of the one that left says so
  (``Shell cwd was reset to <workspace>``);
- with the session's ``shell = "persistent"``, also the shell's state: its variables,
  functions, options (``set``, ``shopt``) and aliases.

How: bash reads ``$BASH_ENV`` before a non-interactive command, so the command runs as
plain ``bash -c COMMAND`` with ``BASH_ENV`` naming a memfd that holds the prelude: it
unsets ``BASH_ENV`` (the command's own scripts must not read it), restores the saved
state, and sets an EXIT trap that writes the working directory (and the state) to a
second memfd, read once the command's processes are gone. A report is kept only when
it is complete and the command ended by itself: a command killed by a limit, a
timeout or a cancel leaves the state saved before it. A command that sets its own
EXIT trap replaces ours: its cwd and state are not saved that time.

Both memfds are the command's own (what it writes there can only change its own
session's next start, which the command could do anyway); a report bigger than
``MAX_REPORT_BYTES`` is dropped.

A command whose stderr is read apart from its stdout (OpenAI's ``shell``, F16) gets a
third fd, a pipe's write end: the prelude moves the command's stderr there before it
runs (``exec 2>&N``), so that what the sandbox says before bash starts still reaches
the output, as its failure.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from toolpool.sandbox.policy import is_under

MAX_REPORT_BYTES = 4 * 1024 * 1024
_END = b"\0toolpool-end\0"
_CWD_FILE = "cwd"
_STATE_FILE = "state.sh"

# Variables bash owns or that describe the process, not the session: never restored.
_SKIPPED = (
    "BASH*|EUID|UID|PPID|SHELLOPTS|SHLVL|FUNCNAME|GROUPS|RANDOM|SRANDOM|SECONDS|LINENO"
    "|HISTCMD|PIPESTATUS|EPOCH*|DIRSTACK|COMP_*|PWD|OLDPWD|_|__toolpool_*|COPROC*"
)
_NAME_STARTS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"

_SAVE_STATE = (
    "    local __toolpool_n\n"
    f"    for __toolpool_n in {' '.join('${!' + c + '@}' for c in _NAME_STARTS)}; do\n"
    f"      case $__toolpool_n in {_SKIPPED}) continue ;; esac\n"
    '      builtin declare -p "$__toolpool_n" 2>/dev/null\n'
    "    done\n"
    "    builtin declare -f\n"
    "    builtin shopt -p\n"
    "    builtin set +o\n"
    "    builtin alias -p\n"
)


@dataclass(slots=True)
class CommandShell:
    """The two memfds of one command (and its stderr's pipe, when it has one of its
    own): ``env`` and ``fds`` go to its start (the fd numbers are the same inside:
    both starters keep them); ``report`` reads what it left, ``close`` lets them go."""

    env: dict[str, str]
    fds: tuple[int, ...]  # the prelude, the report[, stderr's write end]

    def report(self) -> bytes | None:
        """What the EXIT trap wrote, without the end mark; None when it did not end it."""
        report = self.fds[1]
        size = os.fstat(report).st_size
        if size > MAX_REPORT_BYTES:
            return None
        data = os.pread(report, size, 0)
        return data[: -len(_END)] if data.endswith(_END) else None

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class SavedShell:
    """A session's saved shell: its directory is the session's (``bash/shell`` in the
    scratch directory), so every worker that runs one of its commands shares it."""

    @classmethod
    def of_session(
        cls,
        scratch_dir: Path,
        workspace: Path,
        roots: tuple[Path, ...],
        *,
        persistent: bool,
        view: Path | None = None,
    ) -> SavedShell:
        """The saved shell of the session whose scratch directory is ``scratch_dir``;
        ``view``: where its workspace overlay shows the workspace (V14)."""
        directory = scratch_dir / "bash" / "shell"
        return cls(directory, workspace, roots, persistent=persistent, view=view)

    def __init__(
        self,
        directory: Path,
        workspace: Path,
        roots: tuple[Path, ...],
        *,
        persistent: bool,
        view: Path | None = None,
    ) -> None:
        self.directory = directory
        self.workspace = workspace
        self._roots = tuple(os.path.realpath(r) for r in (workspace, *roots))
        self._view = view
        self.persistent = persistent
        self._saved_cwd: bytes | None = None  # as start_cwd read it: unchanged, not written

    def start_cwd(self, first: str = "") -> Path:
        """Where the next command starts: the saved directory while it still is one
        inside the roots, else the workspace; ``first`` (an image's WorkingDir, V13)
        instead of the workspace while nothing is saved, when it lies inside them."""
        try:
            self._saved_cwd = (self.directory / _CWD_FILE).read_bytes()
            saved = self._saved_cwd.decode()
        except (OSError, UnicodeDecodeError):
            return Path(first) if first and self._inside(first) else self.workspace
        if self._inside(saved) and os.path.isdir(self._seen(saved)):
            return Path(saved)
        return self.workspace

    def _seen(self, path: str) -> str:
        """Where ``path`` (inside the roots) is seen from here: in the workspace's
        overlay for a session that has one."""
        workspace = self._roots[0]
        if self._view is None or not is_under(path, workspace):
            return path
        return str(self._view) + path[len(workspace) :]

    def command_shell(
        self, inside: tuple[int, ...] | None = None, stderr: int | None = None
    ) -> CommandShell:
        """The prelude for the next command, and an empty report for it; ``inside``:
        the numbers the command will know them by, when not the same as ours (the
        session sandbox's helper gives them as 3, 4, 5); ``stderr``: a pipe's write
        end the command's stderr goes to (the shell owns it from here)."""
        prelude = os.memfd_create("toolpool-bash-prelude")
        report = os.memfd_create("toolpool-bash-report")
        fds = (prelude, report) if stderr is None else (prelude, report, stderr)
        try:
            named = inside[: len(fds)] if inside else fds
            with open(prelude, "wb", closefd=False) as f:
                f.write(self._prelude(named[1], named[2] if stderr is not None else None))
            os.lseek(prelude, 0, os.SEEK_SET)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return CommandShell({"BASH_ENV": f"/dev/fd/{named[0]}"}, fds)

    def _prelude(self, report: int, stderr: int | None) -> bytes:
        parts = [b"builtin unset BASH_ENV\n"]
        if stderr is not None:  # the command's stderr apart from its stdout (F16)
            # `command exec`: `builtin exec` would apply the redirections to itself alone.
            parts.append(f"command exec 2>&{stderr} {stderr}>&-\n".encode())
        if self.persistent:
            with contextlib.suppress(OSError):
                state = (self.directory / _STATE_FILE).read_bytes()
                # Readonly and bash-owned names refuse assignment: quietly.
                parts.append(b"{\n" + state + b"\n} 2>/dev/null\n")
        parts.append(
            (
                "__toolpool_exit() {\n"
                "  {\n"
                '    builtin cd -P . 2>/dev/null && builtin printf "%s" "$PWD"\n'
                "    builtin printf '\\0'\n"
                f"{_SAVE_STATE if self.persistent else ''}"
                "    builtin printf '\\0toolpool-end\\0'\n"
                f"  }} >&{report}\n"
                "}\n"
                "builtin trap __toolpool_exit EXIT\n"
            ).encode()
        )
        return b"".join(parts)

    def record(self, shell: CommandShell, *, ended_by_itself: bool) -> str | None:
        """Keep what the command left (when it ended by itself and said it all);
        the note for its result when its directory was reset, else None."""
        if not ended_by_itself:
            return None
        report = shell.report()
        if report is None:
            return None
        cwd, _, state = report.partition(b"\0")
        path = cwd.decode(errors="replace")
        if self._saved_cwd is None or self.persistent:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.persistent:
            _replace(self.directory / _STATE_FILE, state)
        if path and self._inside(path) and os.path.isdir(self._seen(path)):
            if cwd != self._saved_cwd:
                _replace(self.directory / _CWD_FILE, cwd)
            return None
        with contextlib.suppress(FileNotFoundError):
            (self.directory / _CWD_FILE).unlink()
        return f"Shell cwd was reset to {self.workspace}"

    def clear(self) -> None:
        """Forget the saved directory and state (a restart)."""
        for name in (_CWD_FILE, _STATE_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()

    def _inside(self, path: str) -> bool:
        return os.path.isabs(path) and any(is_under(path, root) for root in self._roots)


def _replace(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` now, whole (a crash leaves the old or the new)."""
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
    os.replace(part, path)
