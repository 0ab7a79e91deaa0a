"""``bash_output`` and ``kill_shell``: the session's background shells (bash's
``run_in_background``), read and ended through ``ToolContext.shells``.

``bash_output`` gets the output that came since the last read (the owner keeps the
read position) and reads it from the shell's output file in the session's scratch
directory; only ``MAX_OUTPUT_CHARS`` of it (head and tail) reach the model, the file
keeps the rest. ``filter`` keeps the lines a regular expression matches; the others
are passed over for good. A shell a limit ended (its CPU time, memory, processes,
its wall time) is reported as ``limit_exceeded``, naming the limit, at every read of
it. ``kill_shell`` ends a shell's whole process tree.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Any

from toolpool.background import BackgroundShells, ShellInfo
from toolpool.errors import ToolError
from toolpool.tool import Arguments, InterruptBehavior, ToolContext, ValidationResult
from toolpool.tools.support.command_output import MAX_OUTPUT_CHARS
from toolpool.tools.support.head_tail import HeadAndTail
from toolpool.tools.support.paths import display

_CHUNK = 1 << 20

_SHELL_ID = {
    "type": "string",
    "description": "The id of the shell, as bash gave it when it started the command.",
}

OUTPUT_DESCRIPTION = f"""\
Reads the output of a background shell (one started by bash with run_in_background):
what it printed since the last read (stdout and stderr together), and whether it is
still running or has exited (with its exit code), was killed or timed out. A shell
a limit stopped (CPU time, memory, processes, the background time limit) is
reported as an error naming that limit.

- Each read returns only the new output; call it again later for more.
- filter: a regular expression; only the new lines that match are returned, the
  others are skipped for good.
- More than {MAX_OUTPUT_CHARS} characters are cut in the middle; the full output is in
  the file the result names.
"""

KILL_DESCRIPTION = """\
Stops a background shell (one started by bash with run_in_background) and every
process it started. Its output stays readable with bash_output.
"""


def _shells(ctx: ToolContext) -> BackgroundShells:
    if ctx.shells is None:
        raise ToolError("Background shells are not available here (this executor offers none).")
    return ctx.shells


def _command(shell: ShellInfo) -> str:
    command = " ".join(shell.command.split())
    return command if len(command) <= 80 else command[:79] + "…"


def _state_line(shell: ShellInfo) -> str:
    return f"Shell {shell.shell_id} {shell.describe_state()}."


def _read(path: Path, start: int, end: int, keep: re.Pattern[str] | None) -> HeadAndTail:
    """The bytes ``[start, end)`` of ``path`` (UTF-8), the lines ``keep`` matches."""
    kept = HeadAndTail(MAX_OUTPUT_CHARS)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            data = f.read(min(_CHUNK, left))
            if not data:
                break
            left -= len(data)
            text = decoder.decode(data, final=left <= 0)
            if keep is None:
                kept.add(text)
                continue
            lines = (partial + text).split("\n")
            partial = lines.pop()
            for line in lines:
                if keep.search(line):
                    kept.add(line + "\n")
    if keep is not None and partial and keep.search(partial):
        kept.add(partial)
    return kept


class BashOutput:
    name = "bash_output"
    description = OUTPUT_DESCRIPTION
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "shell_id": _SHELL_ID,
            "filter": {
                "type": "string",
                "description": "A regular expression: only the new lines it matches.",
            },
        },
        "required": ["shell_id"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Bash Output"

    def read_only(self, args: Arguments) -> bool:
        return True

    def permissions(self) -> list[str]:
        return ["read"]

    def activity(self, args: Arguments) -> str:
        return f"Reading background shell {args.get('shell_id', '')}"

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        pattern = args.get("filter")
        if pattern is not None:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                return ValidationResult.failed(
                    f"filter is not a valid regular expression: {exc} (filter: {pattern!r})"
                )
        return ValidationResult.passed()

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        pattern = args.get("filter")
        keep = None if pattern is None else re.compile(str(pattern))
        read = _shells(ctx).output(str(args["shell_id"]))
        shell = read.shell
        kept = _read(Path(shell.output_path), read.start, read.end, keep)
        text, cut = kept.text()
        if text.strip():
            lines = [text.rstrip("\n")]
        else:
            lines = ["(no new output matching the filter)" if keep else "(no new output)"]
        lines.append(_state_line(shell))
        where = display(Path(shell.output_path), ctx)
        if shell.truncated:
            lines.append(
                f"Its output file {where} was truncated at {ctx.limits.spill_bytes} bytes "
                "(the spill_bytes limit)."
                if ctx.limits is not None
                else f"Its output file {where} was truncated (the spill_bytes limit)."
            )
        elif cut:
            lines.append(f"Full output ({shell.output_bytes} bytes): {where}")
        if shell.limit:
            # A limit ended it: the result says so as a foreground call's does (X7,
            # L9), so that "killed by cpu_seconds" never reads as "exited with 137".
            details = {"limit": shell.limit, "limit_value": shell.limit_value}
            raise ToolError("\n".join(lines), code="limit_exceeded", details=details)
        return "\n".join(lines)


class KillShell:
    name = "kill_shell"
    description = KILL_DESCRIPTION
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"shell_id": _SHELL_ID},
        "required": ["shell_id"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Kill Shell"

    def read_only(self, args: Arguments) -> bool:
        return False

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior:
        return InterruptBehavior.BLOCK  # a kill half done helps nobody

    def permissions(self) -> list[str]:
        return ["exec"]

    def activity(self, args: Arguments) -> str:
        return f"Stopping background shell {args.get('shell_id', '')}"

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        shell = _shells(ctx).kill(str(args["shell_id"]))
        return f"Killed background shell {shell.shell_id} ({_command(shell)})."


bash_output = BashOutput()
kill_shell = KillShell()
