"""Anthropic's bash tool, ``bash_20250124`` named ``bash`` (SPEC F17): one persistent
shell for the session, carried out as the session's ``bash`` carries out a command.

``command`` runs as ``bash -c`` in the session's sandbox; what the shell was left
with — its working directory, its variables, functions, options and aliases —
carries to the next command whatever the session's ``shell`` option (the tool is
defined as one persistent bash session: ``shell_state.py``'s saved shell, V10, V11).
``restart: true`` clears that saved state: the next command starts in the
workspace, in a fresh shell (with a ``command`` too, it runs in that fresh shell).

Each command is its own process tree, ended when the command ends (as the session's
``bash``): a process left running in the background does not outlive its command,
and the shell is "restarted" as far as processes go after every command — only its
state persists. The answer is the command's output (stdout and stderr as they
interleaved), its exit code when not 0, and the notes ``bash`` adds (a reset
working directory, where a long output was saved); a command that runs past bash's
default time (120 s) is stopped, and its answer is an error.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from toolpool.declared import ANTHROPIC_BASH
from toolpool.errors import ToolError
from toolpool.sandbox.limits import Limits
from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.bash import DEFAULT_TIMEOUT, layer_note
from toolpool.tools.support.command_run import (
    DRAIN_AFTER_EXIT,
    KILL_GRACE,
    run_command,
    shell_state,
)
from toolpool.tools.support.kinds import CommandTool
from toolpool.tools.support.paths import display

RESTARTED = "tool has been restarted."  # Anthropic's reference implementation's words
NO_COMMAND = "Error: no command provided. Give a command, or restart: true."

DESCRIPTION = """\
Anthropic's bash tool (declared to the model as {"type": "bash_20250124", "name": \
"bash"}): runs a command in the session's one persistent shell, confined; restart \
clears the shell's state."""


class AnthropicBash(CommandTool):
    """Not read-only, not concurrency-safe, cancelled by an interrupt, as ``bash``."""

    name = ANTHROPIC_BASH
    label_text = "Bash"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command to run."},
            "restart": {"type": "boolean", "description": "Restart the shell first."},
        },
        "additionalProperties": False,
    }

    def activity(self, args: Arguments) -> str:
        command = " ".join(str(args.get("command", ""))[:81].split())
        if not command:
            return "Restarting the shell"
        return f"Running: {command if len(command) <= 80 else command[:79] + '…'}"

    def call_limits(self, args: Arguments) -> dict[str, Any]:
        return {"wall_seconds": DEFAULT_TIMEOUT + KILL_GRACE + DRAIN_AFTER_EXIT + 5}

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        if not args.get("restart") and not str(args.get("command", "")).strip():
            return ValidationResult.failed(NO_COMMAND)
        return ValidationResult.passed()

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        if ctx.scratch_dir is None:
            raise ToolError("This session has no scratch directory for its shell.")
        command = str(args.get("command", ""))
        if args.get("restart"):
            shell_state(ctx, persistent=True).clear()
            if not command.strip():
                return RESTARTED
        elif not command.strip():
            raise ToolError(NO_COMMAND)
        run = run_command(command, ctx, time.monotonic() + DEFAULT_TIMEOUT, persistent=True)
        text, cut = run.output.text()
        lines = [text.rstrip("\n") if text.strip() else "(no output)"]
        if run.note is not None:
            lines.append(run.note)
        if run.exit_code != 0 and not run.timed_out:
            lines.append(f"Exit code: {run.exit_code}")
        output = run.output
        if output.spill_truncated or cut:
            limit = (ctx.limits or Limits()).spill_bytes
            kept = f", truncated at {limit} bytes" if output.spill_truncated else ""
            lines.append(
                f"Full output ({output.total_chars} characters{kept}): "
                f"{display(output.spill_path, ctx)}"
            )
        if run.timed_out:
            lines.insert(0, f"Error: Command timed out after {DEFAULT_TIMEOUT} seconds.")
            raise ToolError("\n".join(lines), details={"exit_code": run.exit_code})
        full = layer_note(run, ctx)
        if full is not None:
            raise ToolError("\n".join([*lines, full]), code="limit_exceeded")
        if args.get("restart"):
            lines.insert(0, RESTARTED)
        return "\n".join(lines)
