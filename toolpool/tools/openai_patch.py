"""OpenAI's ``apply_patch`` tool (SPEC F15): an ``apply_patch_call``'s ``operation`` —
``create_file`` or ``update_file`` with a V4A ``diff``, or ``delete_file`` — carried
out by the built-in ``apply_patch`` (``apply_patch.py``, Codex's grammar), as the
one-operation patch it is::

    {"type": "update_file", "path": "a.py", "diff": "@@ def f():\\n-    x\\n+    y\\n"}
    → *** Begin Patch / *** Update File: a.py / the diff / *** End Patch

V4A is the grammar of Codex's hunks, so the two agree line for line: a create's
diff is the new file's lines each after a ``+``, an update's diff is hunks (``@@``
lines, context, ``-`` and ``+`` lines, ``*** End of File``). Everything else is the
built-in's: its validate, preview, all-or-none write, register (F3, F5) and matching.
Where they differ, toolpool says so (docs/providers.md): a created file ends with a
newline (the Agents SDK's editor leaves the last line without one), and a diff
holding a line the patch format keeps for itself (``*** Delete File: …``, which
would add an operation the call did not ask for) or a path holding a line break is
refused.

The answer (``apply_patch_call_output``) says ``Created PATH``, ``Updated PATH`` or
``Deleted PATH`` — the Agents SDK's editor's words — or, failed, the built-in's
refusal, its line numbers counted in the diff the model wrote.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolpool.adapter import Adapter, Refusal
from toolpool.declared import OPENAI, OPENAI_APPLY_PATCH
from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.support.patch_grammar import (
    ADD,
    BEGIN,
    DELETE,
    END,
    UPDATE,
    AddFile,
    DeleteFile,
    PatchSyntaxError,
    UpdateFile,
    parse_patch,
)
from toolpool.tools.support.paths import Access, resolve

DESCRIPTION = """\
OpenAI's apply_patch tool (declared to the model as {"type": "apply_patch"}): \
creates, updates or deletes one file per call from a V4A diff, all of it or none, \
confined to the session's roots."""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "operation": {
            "type": "object",
            "properties": {
                "type": {"enum": ["create_file", "update_file", "delete_file"]},
                "path": {"type": "string", "minLength": 1},
                "diff": {"type": ["string", "null"]},
            },
            "required": ["type", "path"],
        }
    },
    "required": ["operation"],
    "additionalProperties": False,
}

_HEADERS = {"create_file": ADD, "update_file": UPDATE, "delete_file": DELETE}
_KINDS = {"create_file": AddFile, "update_file": UpdateFile, "delete_file": DeleteFile}
_DONE = {"create_file": "Created", "update_file": "Updated", "delete_file": "Deleted"}
_FIRST_DIFF_LINE = 3  # the diff's first line in the patch: after Begin and the header
_PATCH_LINE = re.compile(r"\bline (\d+) of the patch\b")
_SYNTAX = re.compile(r"^The patch is not valid: line (\d+):")
_OPERATION_WORDS = (("Add File ", "create_file "), ("Update File ", "update_file "),
                    ("Delete File ", "delete_file "))  # fmt: skip


def operation_problem(operation: Mapping[str, Any]) -> str | None:
    """What keeps ``operation`` from being one file's patch; None when nothing does."""
    kind, path, diff = operation["type"], operation["path"], operation.get("diff")
    if any(c in path for c in "\n\r\0"):
        return f"{kind}: the path holds a line break or a NUL: {path!r}."
    if kind != "delete_file" and diff is None:
        return f"{kind} needs a diff: the {'new file' if kind == 'create_file' else 'change'}."
    if kind == "create_file":
        for number, line in enumerate(_lines(diff), start=1):
            if not line.startswith("+"):
                return (
                    f"create_file {path}: line {number} of the diff does not start with '+' "
                    f"({line[:80]!r}); every line of a new file's diff does."
                )
    try:
        ops = parse_patch(patch_of(operation))
    except PatchSyntaxError:
        return None  # the built-in's refusal, which names the line, says it
    op = ops[0]
    moved = isinstance(op, UpdateFile) and op.move_to is not None
    if len(ops) != 1 or not isinstance(op, _KINDS[kind]) or op.path != path.strip() or moved:
        return (
            f"{kind} {path}: the diff holds a line the patch format keeps for its own "
            f"markers ('*** Add File:', '*** Move to:', '*** Delete File:', '*** End "
            "Patch'…), which would make it more than this one operation."
        )
    return None


def _refuse_problem(args: Arguments) -> None:
    problem = operation_problem(args["operation"])
    if problem is not None:
        raise ToolError(problem)


def _lines(diff: str | None) -> list[str]:
    lines = (diff or "").replace("\r\n", "\n").split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def patch_of(operation: Mapping[str, Any]) -> str:
    """The one-operation patch in Codex's grammar that ``operation`` is."""
    kind = operation["type"]
    header = f"{_HEADERS[kind]}{operation['path']}"
    body = [] if kind == "delete_file" else _lines(operation.get("diff"))
    return "\n".join([BEGIN, header, *body, END]) + "\n"


def _in_diff_lines(message: str) -> str:
    """A built-in refusal with its patch line numbers counted in the model's diff (a
    line of the patch's own frame, before or after the diff, keeps its number), and
    its operations named as OpenAI names them."""

    def in_diff(number: str) -> int | None:
        line = int(number) - _FIRST_DIFF_LINE + 1
        return line if line >= 1 else None

    def hunk_line(found: re.Match[str]) -> str:
        line = in_diff(found.group(1))
        return found.group(0) if line is None else f"line {line} of the diff"

    def syntax_line(found: re.Match[str]) -> str:
        line = in_diff(found.group(1))
        return found.group(0) if line is None else f"The diff is not valid: line {line}:"

    message = _SYNTAX.sub(syntax_line, _PATCH_LINE.sub(hunk_line, message))
    for codex, openai in _OPERATION_WORDS:
        if message.startswith(codex):
            message = openai + message[len(codex) :]
    return message


class OpenAIApplyPatch(Adapter):
    """OpenAI's ``apply_patch`` over the built-in: every capability the built-in's."""

    profile = OPENAI

    def __init__(self, apply_patch: Any) -> None:
        super().__init__(
            apply_patch,
            name=OPENAI_APPLY_PATCH,
            description=DESCRIPTION,
            schema=SCHEMA,
            label="ApplyPatch",
        )

    # What the daemon asks at a call's start and planning (P3, S1) is answered here
    # without parsing the diff: its cost must not grow with it (L10).

    def fixed_answers(self) -> dict[str, Any]:
        return {
            "label": "ApplyPatch",
            "read_only": False,
            "concurrency_safe": False,
            "interrupt_behavior": self.target.interrupt_behavior({"input": ""}),
        }

    def activity(self, args: Arguments) -> str:
        operation = args.get("operation") or {}
        return f"Applying a patch: {operation.get('type')} {operation.get('path')}"

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        with contextlib.suppress(ToolError, KeyError, TypeError):
            return [resolve(args["operation"]["path"], ctx, Access.WRITE)]
        return []

    def arguments(self, args: Arguments) -> Arguments:
        return {"input": patch_of(args["operation"])}

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        problem = operation_problem(args["operation"])
        if problem is not None:
            return ValidationResult.failed(problem)
        return super().validate(args, ctx)

    def preview(self, args: Arguments, ctx: ToolContext) -> Any:
        _refuse_problem(args)
        return super().preview(args, ctx)

    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        _refuse_problem(args)
        return super().execute(args, ctx)

    def refused(self, refusal: Refusal, args: Arguments) -> str:
        return _in_diff_lines(refusal.message)

    def result(self, output: Any, args: Arguments) -> str:
        operation = args["operation"]
        return f"{_DONE[operation['type']]} {operation['path']}"
