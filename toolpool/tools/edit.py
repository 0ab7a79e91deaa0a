"""The ``edit`` tool: exact string replacement in an existing file (SPEC F1), guarded
by the read-before-write invariant (F3) and renewing its stamp after (F5)."""

from __future__ import annotations

from typing import Any, ClassVar

from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.support.edit_plan import (
    EditPlan,
    argument_problem,
    max_file_bytes,
    plan_edit,
    planned,
    validate_target,
    write_planned,
)
from toolpool.tools.support.kinds import FileWritingTool
from toolpool.tools.support.text import cut_line, split_lines

# Lines of context around the change in the result, so the model can check it.
_SNIPPET_CONTEXT = 3
_MAX_SNIPPET_LINES = 30

DESCRIPTION = """\
Replace exact text in an existing file: old_string becomes new_string.

- Read the whole file with read first in this session; edit refuses a file that \
was not read, only partly read, or changed since (read it again then).
- old_string must match the file exactly, whitespace and indentation included. \
Copy it from read's output without the line-number prefix (the number and the tab).
- old_string must occur exactly once, unless replace_all is true (then every \
occurrence is replaced: handy for renaming). If it occurs more than once, add \
surrounding lines to make it unique.
- Write \\n for line breaks: a file's CRLF line endings and UTF-8 byte order mark are \
kept as they are.
- To create a file, or to rewrite most of one, use write.

Prefer edit over write for changes to existing files, and over sed or echo in bash."""


def _summary(plan: EditPlan, shown: str) -> str:
    if plan.count > 1:
        return f"Edited {shown}: replaced {plan.count} occurrences."
    lines = split_lines(plan.new_text)
    if not lines:
        return f"Edited {shown}; the file is now empty."
    first = max(plan.first_line - _SNIPPET_CONTEXT, 1)
    last = min(plan.last_line + _SNIPPET_CONTEXT, len(lines), first + _MAX_SNIPPET_LINES - 1)
    snippet = "\n".join(f"{n:>6}\t{cut_line(lines[n - 1])}" for n in range(first, last + 1))
    return f"Edited {shown}. Lines {first}-{last} now read:\n{snippet}"


class EditTool(FileWritingTool):
    """Not read-only, not concurrency-safe (SPEC F1); validate enforces F3."""

    name = "edit"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to edit, relative to the workspace."},
            "old_string": {"type": "string", "description": "The exact text to replace."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence of old_string. Default false.",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Edit"

    def activity(self, args: Arguments) -> str:
        return f"Editing {args.get('path', '')}"

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """Cheap checks only (T4): the path, the arguments, a stat, the register (F3)."""
        return validate_target(args["path"], ctx, argument_problem(args), self.name)

    def preview(self, args: Arguments, ctx: ToolContext) -> str:
        """The unified diff the edit would make."""
        limit = max_file_bytes(ctx)
        plan, shown = planned(
            args["path"], ctx, lambda data, shown: plan_edit(data, args, shown, limit), self.name
        )
        return plan.diff(shown)

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        limit = max_file_bytes(ctx)
        plan, shown = write_planned(
            args["path"], ctx, lambda data, shown: plan_edit(data, args, shown, limit), self.name
        )
        return _summary(plan, shown)
