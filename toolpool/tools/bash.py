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

import time
from typing import Any

from toolpool.errors import ToolError
from toolpool.sandbox.layers import DEFAULT_LAYER_BYTES, layer_full
from toolpool.sandbox.limits import Limits
from toolpool.tool import Arguments, ToolContext
from toolpool.tools.support.command_output import MAX_OUTPUT_CHARS
from toolpool.tools.support.command_run import DRAIN_AFTER_EXIT, KILL_GRACE, Finished, run_command
from toolpool.tools.support.kinds import CommandTool
from toolpool.tools.support.paths import display

DEFAULT_TIMEOUT = 120
MAX_TIMEOUT = 600

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


class Bash(CommandTool):
    name = "bash"
    label_text = "Bash"
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

    def activity(self, args: Arguments) -> str:
        command = _shown(str(args.get("command", "")))
        if args.get("run_in_background"):
            return f"Starting in the background: {command}"
        return f"Running: {command}"

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
        run = run_command(command, ctx, time.monotonic() + timeout)
        return result_text(run, ctx, timeout)

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


def result_text(run: Finished, ctx: ToolContext, timeout: float) -> str:
    """What the model gets of a command that ran: its output (or "(no output)"), the
    notes, its exit code and where its full output is; a ToolError when it timed out
    or filled the session's root layer (the same text, as an error)."""
    text, cut = run.output.text()
    output = run.output
    lines = [text.rstrip("\n")] if text.strip() else ["(no output)"]
    if run.timed_out:
        lines.append(f"Command timed out after {timeout:g} s and was stopped.")
    if run.note is not None:
        lines.append(run.note)
    lines.append(f"Exit code: {run.exit_code}")
    spill = display(output.spill_path, ctx)  # in the scratch dir: absolute
    limits = ctx.limits or Limits()
    if output.spill_truncated:
        lines.append(
            f"Output ({output.total_chars} characters) saved to {spill}, "
            f"truncated at {limits.spill_bytes} bytes (the spill_bytes limit)."
        )
    elif cut:
        lines.append(f"Full output ({output.total_chars} characters): {spill}")
    if run.timed_out:
        raise ToolError("\n".join(lines), details={"exit_code": run.exit_code, "timed_out": True})
    full = layer_note(run, ctx)
    if full is not None:
        lines.append(full)
        raise ToolError(
            "\n".join(lines), code="limit_exceeded", details={"exit_code": run.exit_code}
        )
    return "\n".join(lines)


def layer_note(run: Finished, ctx: ToolContext) -> str | None:
    """What to say when the command filled the session's root layer (V12), else None."""
    if run.layer is None or not layer_full(run.layer):
        return None
    size = ctx.layer_bytes or DEFAULT_LAYER_BYTES
    return (
        f"The session's root layer is full (layer_bytes = {size}): writes outside "
        "the workspace fail with 'No space left on device' until files there are "
        "removed."
    )


def _shown(command: str) -> str:
    """A command on one line, at most 80 characters."""
    command = " ".join(command.split())
    return command if len(command) <= 80 else command[:79] + "…"


bash = Bash()
