"""Anthropic's text editor, ``text_editor_20250728`` named
``str_replace_based_edit_tool`` (SPEC F18), over toolpool's file tools.

Its commands, as Anthropic's documentation defines them:

- ``view``: a file's lines, numbered (``read``'s text: cat -n numbering, as
  Anthropic's reference implementation gives them), the lines of ``view_range``
  ([first, last], -1 for the end) when given; an image, a notebook or a PDF as
  ``read`` shows them; a directory's files and directories up to 2 levels deep,
  hidden ones left out. A view is a read (F2): the register records the lines shown.
- ``create``: a new file holding ``file_text``; a path that exists is refused (the
  reference implementation's words: create never overwrites).
- ``str_replace``: ``old_str`` replaced by ``new_str``; ``old_str`` must occur
  exactly once, or the call is refused saying how many times it occurs.
- ``insert``: ``insert_text`` (``new_str`` in older versions) as new lines after line
  ``insert_line`` (0: at the top).
- ``undo_edit`` (older versions, ``str_replace_editor``): the content the file had
  before the editor's last change to it in this session (``edit_history.py``).

toolpool's guards stand on top (docs/providers.md says where that is stricter):
``str_replace``, ``insert`` and ``undo_edit`` change only a file viewed whole in this
session and unchanged since (F3, the refusal naming the ``view`` that lifts it, F14;
a change by anyone else since is refused and shown, F9), written atomically, the
register renewed (F5); every path is confined to the session's roots (X4). Errors
begin with the documentation's sentence (``Error: File not found``, ``Error: Found 3
matches for replacement text…``), toolpool's detail after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from toolpool.declared import ANTHROPIC_TEXT_EDITOR
from toolpool.errors import ToolError
from toolpool.models import TextBlock
from toolpool.refusals import Reason
from toolpool.tool import Arguments, ToolContext, ToolOutput, ValidationResult
from toolpool.tools.read import ReadTool
from toolpool.tools.support.diff import unified_diff
from toolpool.tools.support.edit_history import EditHistory
from toolpool.tools.support.edit_plan import max_file_bytes, planned
from toolpool.tools.support.edit_plan import validate_target as validate_existing
from toolpool.tools.support.editor_changes import (
    EDITOR,
    EXISTS,
    NO_HISTORY,
    change,
    create,
    insertion,
    replacement,
    restoration,
    scratch,
)
from toolpool.tools.support.paths import Access, display, open_path, resolve
from toolpool.tools.support.suggest import missing_file_message
from toolpool.tools.support.tree import list_tree

MAX_DIRECTORY_ENTRIES = 1000

# The documentation's words (docs.anthropic.com, "Text editor tool").
FILE_NOT_FOUND = "Error: File not found"
PERMISSION_DENIED = "Error: Permission denied. Cannot write to file."
# Anthropic's reference implementation's words, where the documentation gives none.
DIRECTORY = (
    "Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:"
)
RANGE_ON_DIRECTORY = (
    "Error: The `view_range` parameter is not allowed when `path` points to a directory."
)

DESCRIPTION = """\
Anthropic's text editor (declared to the model as {"type": "text_editor_20250728", \
"name": "str_replace_based_edit_tool"}): view, create, str_replace, insert (and \
undo_edit of older versions) in the session's roots, guarded by the session's \
read-before-write register."""

_REQUIRED = {"create": ("file_text",), "str_replace": ("old_str",), "insert": ("insert_line",)}


def argument_problem(args: Arguments) -> str | None:
    """What is wrong with the arguments themselves, before looking at any file."""
    command = args["command"]
    for name in _REQUIRED.get(command, ()):
        if name not in args:
            return f"Error: Parameter `{name}` is required for command: {command}"
    if command == "insert" and "insert_text" not in args and "new_str" not in args:
        return "Error: Parameter `insert_text` is required for command: insert"
    if command == "str_replace":
        if args["old_str"] == "":
            return "Error: old_str is empty: give the exact text to replace."
        if args["old_str"] == args.get("new_str", ""):
            return "Error: old_str and new_str are the same: the edit would change nothing."
    view_range = args.get("view_range")
    if view_range is not None and command == "view":
        first, last = view_range
        if first < 1 or (last != -1 and last < first):
            return (
                f"Error: Invalid `view_range`: {view_range}. Its first element should be a "
                "line number (1 or more), its second -1 (to the end) or a line at or after "
                "the first."
            )
    return None


@contextlib.contextmanager
def _in_editor_words() -> Iterator[None]:
    """A refusal of the file tools underneath, as the editor says it: ``Error: `` and
    the documentation's sentence first, toolpool's detail after it."""
    try:
        yield
    except ToolError as exc:
        raise ToolError(
            _worded(exc.message, exc.reason), details=exc.details, code=exc.code, reason=exc.reason
        ) from None
    except PermissionError:
        raise ToolError(PERMISSION_DENIED, reason=Reason.PERMISSION_DENIED) from None


# A refusal's reason → the documentation's sentence, toolpool's message after it.
_SENTENCES: dict[str, str] = {
    Reason.NO_FILE: FILE_NOT_FOUND,
    Reason.PERMISSION_DENIED: PERMISSION_DENIED,
}


def _worded(message: str, reason: str) -> str:
    """A message of the file tools underneath in the editor's words: its own
    (``Error: …``) as they are; the documentation's sentence for a reason it has one
    for; ``Error:`` before the others."""
    message = message.replace("use write", "use command `create`")
    if message.startswith("Error:"):
        return message
    if reason in _SENTENCES:
        return f"{_SENTENCES[reason]}\n\n{message}"
    return f"Error: {message}"


def _verdict(verdict: ValidationResult) -> ValidationResult:
    if verdict.ok:
        return verdict
    return dataclasses.replace(verdict, message=_worded(verdict.message, verdict.reason))


class AnthropicTextEditor:
    """Its ``view`` is read-only and may run beside other reads (S1); its other
    commands write the one file ``path`` names (F3 applies)."""

    name = ANTHROPIC_TEXT_EDITOR
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string", "minLength": 1},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
            },
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer", "minimum": 0},
            "insert_text": {"type": "string"},
        },
        "required": ["command", "path"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "TextEditor"

    def activity(self, args: Arguments) -> str:
        return f"{args.get('command')} {str(args.get('path'))[:200]}"

    def permissions(self) -> list[str]:
        return ["read", "write"]

    def read_only(self, args: Arguments) -> bool:
        return args.get("command") == "view"

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        access = Access.READ if args["command"] == "view" else Access.WRITE
        return [resolve(args["path"], ctx, access)]

    # -- P6 ----------------------------------------------------------------------------

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """Cheap checks only (T4): the arguments, the path, a stat, the register (F3)."""
        problem = argument_problem(args)
        if problem is not None:
            return ValidationResult.failed(problem)
        command, raw = args["command"], args["path"]
        if command in ("str_replace", "insert", "undo_edit"):
            verdict = _verdict(validate_existing(raw, ctx, None, EDITOR))
            if verdict.ok and command == "undo_edit":
                path = resolve(raw, ctx, Access.WRITE)
                if EditHistory(scratch(ctx), path).empty():
                    return ValidationResult.failed(NO_HISTORY.format(path=display(path, ctx)))
            return verdict
        try:
            target = open_path(raw, ctx, Access.READ if command == "view" else Access.WRITE)
        except ToolError as exc:
            return ValidationResult.failed(_worded(exc.message, exc.reason), reason=exc.reason)
        with target:
            try:
                mode: int | None = target.lstat().st_mode
            except FileNotFoundError:
                mode = None
            except OSError as exc:
                shown = display(target.path, ctx)
                return ValidationResult.failed(f"Error: {shown}: {exc.strerror}.")
            if command == "create" and mode is not None:
                return ValidationResult.failed(EXISTS.format(path=display(target.path, ctx)))
            ranged = args.get("view_range") is not None
            if command == "view" and ranged and mode is not None and stat.S_ISDIR(mode):
                return ValidationResult.failed(RANGE_ON_DIRECTORY)
        return ValidationResult.passed()

    # -- P7 ----------------------------------------------------------------------------

    def preview(self, args: Arguments, ctx: ToolContext) -> str | None:
        """The unified diff a change would make; a view has none."""
        command, raw = args["command"], args["path"]
        with _in_editor_words():
            if command == "view":
                return None
            if command == "create":
                with open_path(raw, ctx, Access.WRITE) as target:
                    shown = display(target.path, ctx)
                return unified_diff("", args["file_text"], shown, created=True)
            if command == "str_replace":
                plan, shown = planned(raw, ctx, replacement(args, max_file_bytes(ctx)), EDITOR)
                return plan.diff(shown)
            if command == "insert":
                insert, shown = planned(raw, ctx, insertion(args, max_file_bytes(ctx)), EDITOR)
                return unified_diff(insert.old_text, insert.new_text, shown)
            history = EditHistory(scratch(ctx), resolve(raw, ctx, Access.WRITE))
            undo, shown = planned(raw, ctx, restoration(history), EDITOR)
            return unified_diff(undo.old_text, undo.new_text, shown)

    # -- P10 ---------------------------------------------------------------------------

    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        problem = argument_problem(args)
        if problem is not None:
            raise ToolError(problem)
        command = args["command"]
        with _in_editor_words():
            if command == "view":
                return self._view(args, ctx)
            if command == "create":
                return create(args, ctx)
            return change(command, args, ctx)

    def _view(self, args: Arguments, ctx: ToolContext) -> Any:
        raw = args["path"]
        with open_path(raw, ctx, Access.READ) as target:
            shown = display(target.path, ctx)
            try:
                mode = target.lstat().st_mode
            except FileNotFoundError:
                missing = missing_file_message(target.path, ctx)
                raise ToolError(f"{FILE_NOT_FOUND}\n\n{missing}") from None
            if stat.S_ISDIR(mode):
                if args.get("view_range") is not None:
                    raise ToolError(RANGE_ON_DIRECTORY)
                tree = list_tree(target, ctx, max_entries=MAX_DIRECTORY_ENTRIES, max_depth=2)
                lines = [DIRECTORY.format(path=shown), tree.text]
                if tree.shown < tree.total:
                    lines.append(f"[{tree.total - tree.shown} more entries not shown.]")
                return "\n".join(lines)
        read: Arguments = {"path": raw}
        view_range = args.get("view_range")
        if view_range is not None:
            first, last = view_range
            read["offset"] = first
            if last != -1:
                read["limit"] = last - first + 1
        try:
            output = _READ.execute_content(read, ctx)
        except ToolError as exc:
            if view_range is not None and "is past its end" in exc.message:
                message = f"Error: Invalid `view_range`: {view_range}. {exc.message}"
                raise ToolError(message) from None
            raise
        return _in_view_words(output)


def _in_view_words(output: Any) -> Any:
    """read's note on a part of a file, naming the editor's commands that need it all."""
    blocks = output.content if isinstance(output, ToolOutput) else output
    worded = [
        TextBlock(block.text.replace("edit and write need", "str_replace and insert need"))
        if isinstance(block, TextBlock)
        else block
        for block in blocks
    ]
    if isinstance(output, ToolOutput):
        return ToolOutput(worded, output.details)
    return worded


_READ = ReadTool()
