"""One foreground command of a session, from its start to its end: what ``bash``, and
the providers' shells over it (OpenAI's ``shell``, Anthropic's ``bash``), run.

The command runs as ``bash -c`` in the session's sandbox where the executor offers
one, else in a sandbox of its own (``bash_runs.py``), its output read as it comes
(``command_output.py``: streamed as progress, kept head and tail for the model, whole
in a spill file up to the call's ``spill_bytes``), its shell's directory and state
carried to the next command (``shell_state.py``, SPEC V10, V11). At the deadline, on
cancel or when it ends, its whole process tree is ended — SIGTERM, a grace period,
SIGKILL —, and the pipes are drained for a bounded time (a background process that
holds them does not hold the call).

With ``split_stderr`` its stderr is read apart from its stdout, each with its own
spill file (OpenAI's ``shell`` answers with both, F16).
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

from toolpool.cancel import Cancelled
from toolpool.errors import ToolError
from toolpool.runtime import spill_name
from toolpool.sandbox.limits import Limits
from toolpool.tool import ToolContext
from toolpool.tools.support.bash_runs import Run, SpawnError, start_in_session, start_per_call
from toolpool.tools.support.command_output import CommandOutput, read_output
from toolpool.tools.support.shell_state import CommandShell, SavedShell

IN_SESSION_FDS = (3, 4, 5)  # the shell's memory files (and stderr), as the sandbox gives them
# Threads that read commands' output, kept: starting one per call costs more than
# the rest of a command's start in a session sandbox.
_READERS = futures.ThreadPoolExecutor(32, thread_name_prefix="toolpool-bash-output")
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when ending the command
DRAIN_AFTER_EXIT = 1.0  # seconds to keep reading after the shell exited


@dataclass(eq=False, slots=True)
class Finished:
    """A command that ran: its output (stdout and stderr interleaved, or stdout alone
    when ``errors`` holds its stderr), how it ended, and what its shell says."""

    output: CommandOutput
    errors: CommandOutput | None
    exit_code: int
    timed_out: bool
    note: str | None  # "Shell cwd was reset to …", when it was
    layer: Path | None  # the session's root layer, where it has one (V12)


def run_command(
    command: str,
    ctx: ToolContext,
    deadline: float,
    *,
    split_stderr: bool = False,
    persistent: bool | None = None,
) -> Finished:
    """Run ``command`` until it ends or ``deadline`` (``time.monotonic()``); raises
    Cancelled on a cancel (the command ended), ToolError when its sandbox failed.
    ``persistent`` overrides the session's ``shell`` option (Anthropic's ``bash``
    keeps its state whatever the session's)."""
    if ctx.scratch_dir is None:
        raise ToolError("This session has no scratch directory for the command's output.")
    spill_dir = ctx.scratch_dir / "bash"
    spill_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    limits = ctx.limits or Limits()
    output = CommandOutput(spill_dir / spill_name(ctx.call_id, ".log"), ctx, limits.spill_bytes)
    errors = None
    if split_stderr:
        errors = CommandOutput(
            spill_dir / spill_name(ctx.call_id, ".stderr.log"), ctx, limits.spill_bytes
        )
    state = shell_state(ctx, persistent)
    try:
        run, shell, layer, stderr_read = _start(command, ctx, limits, state, deadline, split_stderr)
    except BaseException:
        output.close()
        if errors is not None:
            errors.close()
        raise
    stop = threading.Event()
    readers = [_READERS.submit(read_output, run.output_fd, output, stop)]
    if errors is not None:
        readers.append(_READERS.submit(read_output, stderr_read, errors, stop))
    timed_out = False
    note = None
    try:
        exit_code = run.wait(ctx, deadline)
        if exit_code is None:
            timed_out = True
            exit_code = run.end(KILL_GRACE)
        else:
            note = state.record(shell, ended_by_itself=not _killed_by_a_limit(exit_code))
    except (Cancelled, KeyboardInterrupt):
        run.end(KILL_GRACE)
        raise
    finally:
        shell.close()  # our copy of stderr's write end too: its reader sees the end
        # Background processes may hold the pipes: read on for a moment, then stop.
        futures.wait(readers, DRAIN_AFTER_EXIT)
        stop.set()
        run.end(KILL_GRACE)
        for reader in readers:
            reader.result()
        run.close()
        _close_fd(stderr_read)
        output.close()
        if errors is not None:
            errors.close()
    text, _ = output.text()
    sandbox_failure = run.failure(exit_code, text[:4096])
    if sandbox_failure is not None:
        raise ToolError(sandbox_failure, code="sandbox_failed", details={"output": text[:4096]})
    return Finished(output, errors, exit_code, timed_out, note, layer)


def _close_fd(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def _start(
    command: str,
    ctx: ToolContext,
    limits: Limits,
    state: SavedShell,
    deadline: float,
    split_stderr: bool,
) -> tuple[Run, CommandShell, Path | None, int]:
    """The command started — in the session's sandbox where the executor offers one
    (SPEC V1), else in a sandbox of its own —, its shell's memory files, the
    session's root layer where it has one (V12), and the read end of its stderr's
    own pipe (-1 without ``split_stderr``)."""
    argv = ["bash", "-c", command]
    sandbox = ctx.shells.sandbox() if ctx.shells is not None else None
    cwd = state.start_cwd(sandbox.working_dir if sandbox is not None else "")
    refusal = None
    if sandbox is None and ctx.root != "host":
        refusal = (
            f'This session\'s root is "{ctx.root}", which only a session sandbox of the '
            "daemon gives (here every command would get the host's root)."
        )
    elif sandbox is None and ctx.workspace_overlay and ctx.workspace_view is None:
        refusal = (
            "This session's workspace_mode is \"overlay\", which only the daemon's pool "
            "gives (here the command would write the host's directory)."
        )
    elif sandbox is None and (ctx.egress or (ctx.network_policy and not limits.network)):
        refusal = (
            "This session's network is a policy, which only a session sandbox of the "
            "daemon's pool carries out (its own network namespace and proxy)."
        )
    if refusal is not None:
        raise ToolError(refusal, code="sandbox_failed")
    stderr_read, stderr_write = os.pipe2(os.O_CLOEXEC) if split_stderr else (-1, None)
    try:
        # The shell owns stderr's write end from here (and closes it if this fails).
        shell = state.command_shell(IN_SESSION_FDS if sandbox is not None else None, stderr_write)
    except BaseException:
        _close_fd(stderr_read)
        raise
    try:
        if sandbox is None:
            run = start_per_call(argv, ctx, limits, cwd, shell, deadline)
            return run, shell, None, stderr_read
        try:
            run = start_in_session(sandbox.socket, argv, ctx, cwd, shell, sandbox.env)
        except SpawnError:  # it ended since (its session reopened?): ask once more
            sandbox = ctx.shells.sandbox(again=True) if ctx.shells is not None else None
            if sandbox is None:
                raise ToolError("The session's sandbox is gone.", code="sandbox_failed") from None
            run = start_in_session(sandbox.socket, argv, ctx, cwd, shell, sandbox.env)
        return run, shell, sandbox.layer, stderr_read
    except BaseException:
        shell.close()
        _close_fd(stderr_read)
        raise


def shell_state(ctx: ToolContext, persistent: bool | None = None) -> SavedShell:
    """The session's saved shell (SPEC V10, V11): in its scratch directory, so that
    each worker running one of its commands finds it; ``persistent`` overrides the
    session's ``shell`` option."""
    assert ctx.scratch_dir is not None
    return SavedShell.of_session(
        ctx.scratch_dir,
        ctx.workspace,
        ctx.extra_roots,
        persistent=ctx.persistent_shell if persistent is None else persistent,
        view=ctx.workspace_view,
    )


def _killed_by_a_limit(exit_code: int) -> bool:
    """Whether the command ended by a limit's signal (the OOM killer's SIGKILL, CPU
    time, file size): then what it did last is not its state to keep. 128 + n is
    how bash reports a child's death, and bubblewrap the shell's own."""
    return exit_code < 0 or exit_code in _SIGNAL_DEATHS


_SIGNAL_DEATHS = frozenset(128 + s for s in (9, 24, 25))  # KILL (OOM), XCPU, XFSZ
