"""The changes Anthropic's text editor makes (SPEC F18): ``create``, ``str_replace``,
``insert`` and ``undo_edit``, each planned in memory against the file as it is and
written by ``edit``'s machinery (``edit.write_planned``: F3 checked once more against
the bytes about to be replaced, an atomic write, the register renewed, F5), the
version before kept for ``undo_edit`` (``edit_history.py``). ``anthropic_editor.py``
is the tool; its refusals are worded there.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext
from toolpool.tools.support.atomic import write_atomic_at
from toolpool.tools.support.edit_history import EditHistory
from toolpool.tools.support.edit_plan import (
    EditPlan,
    Planned,
    max_file_bytes,
    plan_edit,
    write_planned,
)
from toolpool.tools.support.near_miss import not_found_message
from toolpool.tools.support.paths import Access, display, open_path, resolve
from toolpool.tools.support.stamps import Snapshot, record
from toolpool.tools.support.text import TextDocument, line_of, split_lines

EDITOR = "str_replace_based_edit_tool"  # the name its model calls it by

# The documentation's words (docs.anthropic.com, "Text editor tool").
MATCHES = (
    "Error: Found {count} matches for replacement text. Please provide more context to "
    "make a unique match."
)
NO_MATCH = "Error: No match found for replacement. Please check your text and try again."
REPLACED = "Successfully replaced text at exactly one location."
# Anthropic's reference implementation's words, where the documentation gives none.
CREATED = "File created successfully at: {path}"
EXISTS = "Error: File already exists at: {path}. Cannot overwrite files using command `create`."
UNDONE = "Last edit to {path} undone successfully."
NO_HISTORY = "Error: No edit history found for {path}."


@dataclass(frozen=True, slots=True)
class Change:
    """A change worked out against a file's text (its text before and after, its
    new bytes), not yet written."""

    old_text: str
    new_text: str
    data: bytes


def scratch(ctx: ToolContext) -> Path:
    """The session's scratch directory, where the editor keeps its history."""
    if ctx.scratch_dir is None:
        raise ToolError("This session has no scratch directory for the editor's history.")
    return ctx.scratch_dir


def create(args: Arguments, ctx: ToolContext) -> str:
    """``create``: a new file holding ``file_text`` (its parents made), linked in so
    that it never replaces one (a file that appeared since validate is refused)."""
    with open_path(args["path"], ctx, Access.WRITE) as target:
        path = target.path
        shown = display(path, ctx)
        try:
            data = args["file_text"].encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError("file_text is not valid Unicode (it holds a lone surrogate).") from None
        try:
            target.make_parents()
            written = write_atomic_at(target.dir_fd, target.name, data, replace=False)
        except FileExistsError:
            raise ToolError(EXISTS.format(path=shown)) from None
        except OSError as exc:
            if isinstance(exc, PermissionError) or exc.errno == errno.EFBIG:
                raise  # in the editor's words; past the call's file size limit: the limit's
            raise ToolError(f"{shown} cannot be written: {exc.strerror or exc}.") from None
    record(ctx, path, Snapshot.written(data, written), partial=False)  # F5: it is known whole
    return CREATED.format(path=shown)


def change(command: str, args: Arguments, ctx: ToolContext) -> str:
    """str_replace, insert or undo_edit: planned against the file as it is, written
    after F3 holds once more (``edit.write_planned``), the version before kept for
    undo (but by undo itself)."""
    raw = args["path"]
    path = resolve(raw, ctx, Access.WRITE)
    history = EditHistory(scratch(ctx), path)
    limit = max_file_bytes(ctx)
    if command == "undo_edit":
        _, shown = write_planned(raw, ctx, restoration(history), EDITOR)
        history.drop_last()
        return UNDONE.format(path=shown)
    planner: Callable[[bytes, str], Planned] = (
        replacement(args, limit) if command == "str_replace" else insertion(args, limit)
    )
    before: list[bytes] = []

    def kept(data: bytes, shown: str) -> Planned:
        before.append(data)
        return planner(data, shown)

    _, shown = write_planned(raw, ctx, kept, EDITOR)
    with contextlib.suppress(OSError):  # the change is made: without its copy, no undo
        history.push(before[0])
    if command == "str_replace":
        return REPLACED
    line = args["insert_line"]
    where = "at the top of the file" if line == 0 else f"after line {line}"
    return f"Successfully inserted text {where} in {shown}."


def replacement(args: Arguments, limit: int) -> Callable[[bytes, str], EditPlan]:
    """str_replace's planner: ``old_str`` must occur exactly once."""

    def plan(data: bytes, shown: str) -> EditPlan:
        old, new = args["old_str"], args.get("new_str", "")
        doc = _decoded(data, shown, "str_replace")
        needle = doc.normalise(old)
        count = doc.text.count(needle)
        if count == 0:
            detail = not_found_message(doc.text, needle, shown).replace("old_string", "old_str")
            raise ToolError(f"{NO_MATCH}\n\n{detail.replace('read shows', 'view shows')}")
        if count > 1:
            lines = _lines_of(doc.text, needle)
            raise ToolError(
                f"{MATCHES.format(count=count)}\n\nold_str occurs {count} times in {shown} "
                f"(lines {lines})."
            )
        return plan_edit(data, {"old_string": old, "new_string": new}, shown, limit)

    return plan


def _lines_of(text: str, needle: str, most: int = 10) -> str:
    found: list[str] = []
    at = text.find(needle)
    while at != -1 and len(found) < most:
        found.append(str(line_of(text, at)))
        at = text.find(needle, at + len(needle))
    return ", ".join(found)


def insertion(args: Arguments, limit: int) -> Callable[[bytes, str], Change]:
    """insert's planner: the text as whole new lines after line ``insert_line``."""

    def plan(data: bytes, shown: str) -> Change:
        doc = _decoded(data, shown, "insert")
        text = doc.text
        line = args["insert_line"]
        count = len(split_lines(text))
        if line > count:
            raise ToolError(
                f"Error: Invalid `insert_line` parameter: {line}. It should be within the "
                f"range of lines of the file: [0, {count}]"
            )
        inserted = doc.normalise(str(args.get("insert_text", args.get("new_str", ""))))
        if not inserted.endswith("\n"):
            inserted += "\n"
        at = _line_end(text, line)
        if at == len(text) and text and not text.endswith("\n"):
            inserted = "\n" + inserted[:-1]  # after a last line without its newline
        new_text = text[:at] + inserted + text[at:]
        try:
            new_data = doc.encode(new_text)
        except UnicodeEncodeError:
            raise ToolError("The text is not valid Unicode (it holds a lone surrogate).") from None
        if len(new_data) > limit:
            raise ToolError(
                f"The insert would make {shown} {len(new_data):,} bytes, more than the file "
                f"size limit of {limit:,} bytes (file_size_bytes); nothing was changed.",
                code="limit_exceeded",
            )
        return Change(text, new_text, new_data)

    return plan


def _line_end(text: str, line: int) -> int:
    """Where line ``line`` (1-based) of ``text`` ends, its newline included; 0 for 0."""
    at = 0
    for _ in range(line):
        newline = text.find("\n", at)
        if newline == -1:
            return len(text)
        at = newline + 1
    return at


def restoration(history: EditHistory) -> Callable[[bytes, str], Change]:
    """undo_edit's planner: the newest version kept (``edit_history.py``)."""

    def plan(data: bytes, shown: str) -> Change:
        previous = history.last()
        if previous is None:
            raise ToolError(NO_HISTORY.format(path=shown))
        old = data.decode("utf-8", errors="replace")
        return Change(old, previous.decode("utf-8", errors="replace"), previous)

    return plan


def _decoded(data: bytes, shown: str, command: str) -> TextDocument:
    try:
        return TextDocument.decode(data)
    except UnicodeDecodeError:
        raise ToolError(f"{shown} is not UTF-8 text; {command} changes UTF-8 files.") from None
