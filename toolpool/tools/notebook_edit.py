"""The ``notebook_edit`` tool: replace, insert or delete one cell of a Jupyter
notebook (SPEC F7), guarded by read-before-write (F3) as edit is, its stamp renewed
after (F5). The notebook side is ``notebook.py``."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.support.diff import unified_diff
from toolpool.tools.support.edit_plan import planned, validate_target, write_planned
from toolpool.tools.support.kinds import FileWritingTool
from toolpool.tools.support.notebook import (
    CELL_TYPES,
    EDIT_MODES,
    arguments_problem,
    plan_notebook_edit,
)

DESCRIPTION = """\
Change one cell of a Jupyter notebook (.ipynb): replace its source, insert a new \
cell, or delete one.

- Read the notebook with read first in this session: it shows every cell with its \
id and type. notebook_edit refuses a notebook not read, or changed since.
- cell_id is the id read shows (cell-<index> in notebooks without cell ids).
- edit_mode "replace" (the default) sets the cell's source to new_source; with \
cell_type it also changes the cell's type. A replaced code cell's outputs and \
execution count are cleared.
- edit_mode "insert" adds a cell of cell_type (required) after cell_id, or at the \
top without cell_id.
- edit_mode "delete" removes the cell (new_source is then ignored).

Use this rather than edit or write for notebooks: their JSON is easy to break."""


class NotebookEditTool(FileWritingTool):
    """Not read-only, not concurrency-safe (SPEC F1, F7); validate enforces F3."""

    name = "notebook_edit"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "The .ipynb file, relative to the workspace.",
            },
            "cell_id": {
                "type": "string",
                "description": "The cell to change, or to insert after (none: insert at the top).",
            },
            "new_source": {"type": "string", "description": "The new source of the cell."},
            "cell_type": {
                "type": "string",
                "enum": list(CELL_TYPES),
                "description": "The cell's type: required to insert, optional to replace.",
            },
            "edit_mode": {
                "type": "string",
                "enum": list(EDIT_MODES),
                "description": "replace (default), insert or delete.",
            },
        },
        "required": ["path", "new_source"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Edit Notebook"

    def activity(self, args: Arguments) -> str:
        return f"Editing notebook {args.get('path', '')}"

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """Cheap checks only (T4): the arguments, the path, a stat, the register (F3)."""
        problem = arguments_problem(args)
        if problem is None and PurePath(args["path"]).suffix != ".ipynb":
            problem = "notebook_edit changes Jupyter notebooks (.ipynb); use edit for other files."
        refusal = None if problem is None else ToolError(problem)
        return validate_target(args["path"], ctx, refusal, self.name)

    def preview(self, args: Arguments, ctx: ToolContext) -> str:
        """The unified diff of the changed cell's source (``path#cell``), not of the
        notebook's JSON: what the edit changes, at a cost of that cell's size."""
        plan, shown = planned(
            args["path"], ctx, lambda data, shown: plan_notebook_edit(data, args, shown), self.name
        )
        return unified_diff(plan.before, plan.after, f"{shown}#{plan.cell}")

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        plan, _ = write_planned(
            args["path"], ctx, lambda data, shown: plan_notebook_edit(data, args, shown), self.name
        )
        return plan.summary


notebook_edit_tool = NotebookEditTool()
