"""The ``multi_edit`` tool: several exact replacements in one file (Claude Code's
MultiEdit), applied in order in memory and written once, all or none.

Each edit is one ``edit`` (``plan_edit``, its messages and its near misses) applied to
the text the edits before it left; the file is written once, atomically, only when
every edit planned. The guard is edit's: validate and execute refuse a file not read
whole, or changed since (F3), and the stamp is renewed after (F5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.edit import EditTool
from toolpool.tools.support.diff import unified_diff
from toolpool.tools.support.edit_plan import (
    EditPlan,
    Planner,
    argument_problem,
    max_file_bytes,
    plan_edit,
    planned,
    validate_target,
    write_planned,
)
from toolpool.tools.support.kinds import FileWritingTool

DESCRIPTION = """\
Make several exact text replacements in one existing file in one call: edits is a \
list of {old_string, new_string, replace_all}, each one like an edit call.

- The edits apply in order, each to the text the edits before it left: a later \
old_string must match the file as the earlier edits changed it.
- All or none: when one edit fails (its old_string is not found, or occurs more \
than once without replace_all), nothing is written, and the error names it by its \
index (edits[2]: ...).
- Read the whole file with read first in this session; multi_edit refuses a file \
that was not read, only partly read, or changed since (read it again then).
- old_string must match exactly, whitespace and indentation included, without \
read's line-number prefix. CRLF line endings and a UTF-8 byte order mark are kept.
- To create a file, use write.

Prefer multi_edit over several edit calls to the same file."""


@dataclass(frozen=True, slots=True)
class MultiEditPlan:
    """Every edit worked out in turn, each on the text the one before it left."""

    steps: tuple[EditPlan, ...]

    @property
    def data(self) -> bytes:
        return self.steps[-1].data

    def diff(self, shown: str) -> str:
        """The unified diff of the whole change (its preview)."""
        return unified_diff(self.steps[0].old_text, self.steps[-1].new_text, shown)


def plan_edits(
    data: bytes, edits: list[dict[str, Any]], shown: str, max_bytes: int
) -> MultiEditPlan:
    """Apply ``edits`` in order to ``data`` (the file ``shown``) in memory; a ToolError
    naming the first edit that fails (``edits[i]: …``), with edit's own message —
    one that would make the file larger than ``max_bytes`` among them, refused
    before its text is built (each step grows the text the next one edits)."""
    steps: list[EditPlan] = []
    for index, edit in enumerate(edits):
        try:
            step = plan_edit(data, edit, shown, max_bytes)
        except ToolError as exc:
            message = f"edits[{index}]: {exc.message}{_changed_by(steps, edit)}"
            raise ToolError(
                message,
                details={**exc.details, "edit_index": index},
                code=exc.code,
                reason=exc.reason,
            ) from None
        steps.append(step)
        data = step.data
    return MultiEditPlan(tuple(steps))


def _changed_by(steps: list[EditPlan], edit: dict[str, Any]) -> str:
    """When an earlier edit took away the text this one looks for: which, and why."""
    old = edit["old_string"]
    for index, step in enumerate(steps):
        if old in step.old_text and old not in step.new_text:
            return (
                f" It was in the file before edits[{index}] changed it: each edit applies "
                "to the text the edits before it left."
            )
    return ""


def _edits_problem(args: Arguments) -> ToolError | None:
    """What is wrong with the edits themselves, before looking at the file."""
    for index, edit in enumerate(args["edits"]):
        problem = argument_problem(edit)
        if problem is not None:
            return ToolError(
                f"edits[{index}]: {problem.message}",
                details={"edit_index": index},
                reason=problem.reason,
            )
    return None


def _summary(plan: MultiEditPlan, shown: str) -> str:
    where = []
    for index, step in enumerate(plan.steps):
        at = f"line {step.first_line}" if step.count == 1 else f"{step.count} places"
        where.append(f"edits[{index}] at {at}")
    count = len(plan.steps)
    return (
        f"Edited {shown}: {count} {'edit' if count == 1 else 'edits'} applied in order "
        f"({', '.join(where)})."
    )


class MultiEditTool(FileWritingTool):
    """Not read-only, not concurrency-safe, like edit (SPEC F1); validate enforces F3."""

    name = "multi_edit"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": EditTool.schema["properties"]["path"],
            "edits": {
                "type": "array",
                "description": "The replacements, applied in order.",
                "minItems": 1,
                # Each edit is edit's arguments but for the path.
                "items": {
                    "type": "object",
                    "properties": {
                        key: value
                        for key, value in EditTool.schema["properties"].items()
                        if key != "path"
                    },
                    "required": ["old_string", "new_string"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["path", "edits"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "MultiEdit"

    def activity(self, args: Arguments) -> str:
        count = len(args.get("edits") or ())
        return f"Editing {args.get('path', '')} ({count} {'edit' if count == 1 else 'edits'})"

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """Cheap checks only (T4): the path, every edit's arguments, a stat, the register."""
        return validate_target(args["path"], ctx, _edits_problem(args), self.name)

    def preview(self, args: Arguments, ctx: ToolContext) -> str:
        """The unified diff of all the edits together."""
        plan, shown = planned(args["path"], ctx, _planner(args, ctx), self.name)
        return plan.diff(shown)

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        plan, shown = write_planned(args["path"], ctx, _planner(args, ctx), self.name)
        return _summary(plan, shown)


def _planner(args: Arguments, ctx: ToolContext) -> Planner[MultiEditPlan]:
    limit = max_file_bytes(ctx)
    return lambda data, shown: plan_edits(data, args["edits"], shown, limit)


multi_edit_tool = MultiEditTool()
