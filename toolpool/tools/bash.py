"""``bash``: run a shell command in the workspace, confined, streaming its output.

The command runs as ``bash -c`` in its own process group, stdin from /dev/null, in
the sandbox the machine offers (toolpool.sandbox.command: bubblewrap, Landlock,
seccomp). Output streams as progress while it runs; the model gets at most
``MAX_OUTPUT_CHARS`` (head and tail, with a marker) and the whole output stays in a
spill file in the session's scratch directory, up to the call's ``spill_bytes``
limit (then a truncation note; SPEC X8; the output's side: command_output.py). A
sandbox that fails before its command starts (no ready byte) is tried again
(SPEC X12). On timeout or cancel the whole process tree is ended — SIGTERM, a grace
period, SIGKILL — children that called setsid or nohup included. A background
process that keeps the output pipe open does not hold the call: once the shell
exits, the pipe is drained for a bounded time.

With ``run_in_background`` the command is started through ``ToolContext.shells``
instead (in a worker: by the pool, confined the same way) and the call returns at
once with the shell's id; ``bash_output`` and ``kill_shell`` (tools/shells.py) read
and end it. Where no executor offers background shells (in-process) it is refused.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

from toolpool.cancel import Cancelled
from toolpool.errors import ToolError
from toolpool.runtime import spill_name
from toolpool.sandbox.layers import layer_full
from toolpool.sandbox.limits import Limits
from toolpool.session_options import DEFAULT_LAYER_BYTES
from toolpool.tool import Arguments, InterruptBehavior, ToolContext
from toolpool.tools.bash_runs import Run, SpawnError, start_in_session, start_per_call
from toolpool.tools.command_output import MAX_OUTPUT_CHARS, CommandOutput, read_output
from toolpool.tools.paths import display
from toolpool.tools.shell_state import CommandShell, SavedShell

DEFAULT_TIMEOUT = 120
MAX_TIMEOUT = 600
IN_SESSION_FDS = (3, 4)  # the shell's memory files, as the session sandbox gives them
# Threads that read commands' output, kept: starting one per call costs more than
# the rest of a command's start in a session sandbox.
_READERS = futures.ThreadPoolExecutor(32, thread_name_prefix="toolpool-bash-output")
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when ending the command
DRAIN_AFTER_EXIT = 1.0  # seconds to keep reading after the shell exited
_CHUNK = 65536

DESCRIPTION = f"""\
Runs a bash command in the workspace and returns its output (stdout and stderr
interleaved) and exit code.

Use it for things only a shell can do: building, running tests, git, package
managers, running scripts. Do NOT use it to read, search or edit files: use read,
grep, glob, ls, edit and write, which are faster, safer and keep the read-before-write
record that edit and write need.

- The working directory persists between calls: a call starts where the last one
  ended (the first in the workspace root; a command that ends outside the workspace
  sends the next one back there). Each call is a new shell otherwise: variables,
  functions and options do not carry over, unless the session's shell is persistent.
- stdin is empty: interactive commands (editors, pagers, prompts) cannot work. Pass
  flags such as --yes or --no-pager.
- timeout: seconds before the command is stopped (default {DEFAULT_TIMEOUT}, at most
  {MAX_TIMEOUT}).
- Output longer than {MAX_OUTPUT_CHARS} characters is cut in the middle; the full output
  is saved to a file whose path the result gives (read it with read if you need it).
- Everything the command starts, background processes included, is ended when the
  command finishes or is stopped: do not rely on servers outliving the call.
- run_in_background: true starts the command and returns at once with a shell id,
  for long-running commands (a dev server, a watcher, a long build). Read its new
  output with bash_output and stop it with kill_shell; it ends by itself when the
  session ends or after the daemon's background time limit (timeout does not
  apply). Do not add "&".
- Depending on the session, the network may be unavailable and only the workspace
  writable.
- Give a short description (5-10 words) of what the command does, e.g. "Run the unit
  tests".
"""


class Bash:
    name = "bash"
    description = DESCRIPTION
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to run."},
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_TIMEOUT,
                "description": f"Seconds before it is stopped (default {DEFAULT_TIMEOUT}).",
            },
            "description": {
                "type": "string",
                "description": "What the command does, in 5-10 words.",
            },
            "run_in_background": {
                "type": "boolean",
                "description": "Start it in the background and return at once with a "
                "shell id; read its output with bash_output, stop it with kill_shell.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Bash"

    def read_only(self, args: Arguments) -> bool:
        return False  # a command can do anything; the kernel cannot tell ls from rm

    def concurrency_safe(self, args: Arguments) -> bool:
        return False

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior:
        return InterruptBehavior.CANCEL

    def fixed_answers(self) -> dict[str, Any]:
        return {
            "label": "Bash",
            "read_only": False,
            "concurrency_safe": False,
            "interrupt_behavior": InterruptBehavior.CANCEL,
        }

    def activity(self, args: Arguments) -> str:
        command = _shown(str(args.get("command", "")))
        if args.get("run_in_background"):
            return f"Starting in the background: {command}"
        return f"Running: {command}"

    def permissions(self) -> list[str]:
        return ["exec", "read", "write", "network"]

    def call_limits(self, args: Arguments) -> dict[str, Any]:
        # The pool's wall-time limit must leave room for our own timeout and clean-up.
        timeout = float(args.get("timeout") or DEFAULT_TIMEOUT)
        return {"wall_seconds": timeout + KILL_GRACE + DRAIN_AFTER_EXIT + 5}

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        command = str(args["command"])
        if not command.strip():
            raise ToolError("The command is empty.")
        if args.get("run_in_background"):
            return self._start_in_background(command, ctx)
        timeout = min(float(args.get("timeout") or DEFAULT_TIMEOUT), MAX_TIMEOUT)
        if ctx.scratch_dir is None:
            raise ToolError("This session has no scratch directory for the command's output.")
        spill_dir = ctx.scratch_dir / "bash"
        spill_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        limits = ctx.limits or Limits()
        output = CommandOutput(spill_dir / spill_name(ctx.call_id, ".log"), ctx, limits.spill_bytes)
        state = shell_state(ctx)
        started = time.monotonic()
        try:
            run, shell, layer = _start(command, ctx, limits, state, started + timeout)
        except BaseException:
            output.close()
            raise
        stop = threading.Event()
        reader = _READERS.submit(read_output, run.output_fd, output, stop)
        timed_out = False
        note = None
        try:
            exit_code = run.wait(ctx, started + timeout)
            if exit_code is None:
                timed_out = True
                exit_code = run.end(KILL_GRACE)
            else:
                note = state.record(shell, ended_by_itself=not _killed_by_a_limit(exit_code))
        except (Cancelled, KeyboardInterrupt):
            run.end(KILL_GRACE)
            raise
        finally:
            shell.close()
            # Background processes may hold the pipe: read on for a moment, then stop.
            futures.wait([reader], DRAIN_AFTER_EXIT)
            stop.set()
            run.end(KILL_GRACE)
            reader.result()
            run.close()
            output.close()
        text, cut = output.text()
        sandbox_failure = run.failure(exit_code, text[:4096])
        if sandbox_failure is not None:
            raise ToolError(sandbox_failure, code="sandbox_failed", details={"output": text[:4096]})
        lines = [text.rstrip("\n")] if text.strip() else ["(no output)"]
        if timed_out:
            lines.append(f"Command timed out after {timeout:g} s and was stopped.")
        if note is not None:
            lines.append(note)
        lines.append(f"Exit code: {exit_code}")
        spill = display(output.spill_path, ctx)  # in the scratch dir: absolute
        if output.spill_truncated:
            lines.append(
                f"Output ({output.total_chars} characters) saved to {spill}, "
                f"truncated at {limits.spill_bytes} bytes (the spill_bytes limit)."
            )
        elif cut:
            lines.append(f"Full output ({output.total_chars} characters): {spill}")
        if timed_out:
            raise ToolError("\n".join(lines), details={"exit_code": exit_code, "timed_out": True})
        if layer is not None and layer_full(layer):
            size = ctx.layer_bytes or DEFAULT_LAYER_BYTES
            lines.append(
                f"The session's root layer is full (layer_bytes = {size}): writes outside "
                "the workspace fail with 'No space left on device' until files there are "
                "removed."
            )
            raise ToolError(
                "\n".join(lines), code="limit_exceeded", details={"exit_code": exit_code}
            )
        return "\n".join(lines)

    @staticmethod
    def _start_in_background(command: str, ctx: ToolContext) -> str:
        if ctx.shells is None:
            raise ToolError(
                "Background commands are not available here (this executor offers no "
                "background shells): run the command without run_in_background."
            )
        shell = ctx.shells.start(command)
        return (
            f"Started background shell {shell.shell_id}: {_shown(command)}. "
            "Read its output with bash_output, stop it with kill_shell."
        )


def _start(
    command: str, ctx: ToolContext, limits: Limits, state: SavedShell, deadline: float
) -> tuple[Run, CommandShell, Path | None]:
    """The command started — in the session's sandbox where the executor offers one
    (SPEC V1), else in a sandbox of its own —, its shell's memory files, and the
    session's root layer where it has one (V12)."""
    argv = ["bash", "-c", command]
    sandbox = ctx.shells.sandbox() if ctx.shells is not None else None
    cwd = state.start_cwd(sandbox.working_dir if sandbox is not None else "")
    if sandbox is None and ctx.root != "host":
        raise ToolError(
            f'This session\'s root is "{ctx.root}", which only a session sandbox of the '
            "daemon gives (here every command would get the host's root).",
            code="sandbox_failed",
        )
    if sandbox is None and ctx.workspace_overlay and ctx.workspace_view is None:
        raise ToolError(
            "This session's workspace_mode is \"overlay\", which only the daemon's pool "
            "gives (here the command would write the host's directory).",
            code="sandbox_failed",
        )
    if sandbox is None and (ctx.egress or (ctx.network_policy and not limits.network)):
        raise ToolError(
            "This session's network is a policy, which only a session sandbox of the "
            "daemon's pool carries out (its own network namespace and proxy).",
            code="sandbox_failed",
        )
    shell = state.command_shell(IN_SESSION_FDS if sandbox is not None else None)
    try:
        if sandbox is None:
            return start_per_call(argv, ctx, limits, cwd, shell, deadline), shell, None
        try:
            run = start_in_session(sandbox.socket, argv, ctx, cwd, shell, sandbox.env)
        except SpawnError:  # it ended since (its session reopened?): ask once more
            sandbox = ctx.shells.sandbox(again=True) if ctx.shells is not None else None
            if sandbox is None:
                raise ToolError("The session's sandbox is gone.", code="sandbox_failed") from None
            run = start_in_session(sandbox.socket, argv, ctx, cwd, shell, sandbox.env)
        return run, shell, sandbox.layer
    except BaseException:
        shell.close()
        raise


def shell_state(ctx: ToolContext) -> SavedShell:
    """The session's saved shell (SPEC V10, V11): in its scratch directory, so that
    each worker running one of its commands finds it."""
    assert ctx.scratch_dir is not None
    return SavedShell.of_session(
        ctx.scratch_dir,
        ctx.workspace,
        ctx.extra_roots,
        persistent=ctx.persistent_shell,
        view=ctx.workspace_view,
    )


def _killed_by_a_limit(exit_code: int) -> bool:
    """Whether the command ended by a limit's signal (the OOM killer's SIGKILL, CPU
    time, file size): then what it did last is not its state to keep. 128 + n is
    how bash reports a child's death, and bubblewrap the shell's own."""
    return exit_code < 0 or exit_code in _SIGNAL_DEATHS


_SIGNAL_DEATHS = frozenset(128 + s for s in (9, 24, 25))  # KILL (OOM), XCPU, XFSZ


def _shown(command: str) -> str:
    """A command on one line, at most 80 characters."""
    command = " ".join(command.split())
    return command if len(command) <= 80 else command[:79] + "…"


bash = Bash()
