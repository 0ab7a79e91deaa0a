"""The ``read`` tool: a file's text with line numbers, an image, a notebook's cells
(F7), a PDF's text by page (F8), or a directory's entries (SPEC F1); every file read
is stamped in the session's register (F2), a text read with the lines it showed
(F13), which its details say too (``lines_shown``, ``next_offset``, ``total_lines``)."""

from __future__ import annotations

import codecs
import stat
from pathlib import Path
from typing import Any, ClassVar

from toolpool.call_forms import quote, read_call
from toolpool.errors import ToolError
from toolpool.models import ContentBlock, TextBlock
from toolpool.refusals import WHOLE_READ_NEEDED, Reason
from toolpool.tool import Arguments, ToolContext, ToolOutput, image_block
from toolpool.tools.support import notebook
from toolpool.tools.support.kinds import ReadingTool
from toolpool.tools.support.paths import Access, Resolved, argument_path, open_path, resolve
from toolpool.tools.support.pdf import is_pdf, pdf_text
from toolpool.tools.support.stamps import Snapshot, record
from toolpool.tools.support.stamps import check_regular as check_regular  # re-exported
from toolpool.tools.support.stamps import read_snapshot as read_snapshot
from toolpool.tools.support.suggest import missing_file
from toolpool.tools.support.text import MAX_LINE_CHARS, cut_line, split_lines
from toolpool.tools.support.tree import list_tree

DEFAULT_LIMIT = 2000
# The whole file is read to hash it (F2), whatever part is shown.
MAX_FILE_BYTES = 32 * 1024 * 1024
# Model APIs take images up to 5 MB of base64, which is 3.75 MB of image.
MAX_IMAGE_BYTES = 3_750_000
MAX_DIRECTORY_ENTRIES = 1000
# A NUL among the first bytes is how git, grep and ripgrep tell binary from text.
_BINARY_SNIFF_BYTES = 8192

DESCRIPTION = """\
Read a file in the workspace. Text comes back with line numbers (cat -n style: the \
number, a tab, the line); the numbers are not part of the file, so never copy them \
into edit's old_string.

- By default up to 2000 lines from the top; page through longer files with offset \
(1-based line to start at) and limit (number of lines). The output says which \
lines it shows and the offset that reads on when the file continues.
- Lines longer than 2000 characters are cut.
- Images (PNG, JPEG, GIF, WebP) come back as images you can look at.
- Jupyter notebooks (.ipynb) come back as their cells, each with its id and type, \
and their outputs (images as images). Change them with notebook_edit.
- PDFs come back as their text, page by page: the first 20 pages, or the pages \
you ask for with pages ("3" or "3-5"; at most 20 at once).
- A directory comes back as a list of its entries (use ls for a tree, glob to find \
files by name).
- Binary files cannot be read.
- edit and write refuse to change an existing file until every line of it was shown \
in this session: in one read, or in several reads of parts of it while it did not \
change (they add up).

Paths are relative to the workspace; absolute paths inside it work too. Prefer this \
tool over cat, head or tail in bash. Several files can be read at once by calling \
read several times in one turn."""


class ReadTool(ReadingTool):
    """Read-only and concurrency-safe (SPEC F1)."""

    name = "read"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "File or directory to read, relative to the workspace.",
            },
            "offset": {
                "type": "integer",
                "minimum": 1,
                "description": "Line number to start at (1-based). Default 1.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": f"Number of lines to read. Default {DEFAULT_LIMIT}.",
            },
            "pages": {
                "type": "string",
                "description": 'PDF only: the page or pages to read, 1-based ("3", "3-5").',
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Read"

    def activity(self, args: Arguments) -> str:
        return f"Reading {args.get('path', '')}"

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        return [resolve(args["path"], ctx, Access.READ)]

    def execute(self, args: Arguments, ctx: ToolContext) -> list[ContentBlock] | ToolOutput:
        return self.execute_content(args, ctx)

    def execute_content(self, args: Arguments, ctx: ToolContext) -> list[ContentBlock] | ToolOutput:
        with open_path(args["path"], ctx, Access.READ) as target:
            path = target.path
            argument = argument_path(path, ctx)
            shown = quote(argument)
            try:
                st = target.lstat()
                if stat.S_ISDIR(st.st_mode):
                    return [TextBlock(_directory(target, shown, ctx))]
                check_regular(st, shown)
                if st.st_size > MAX_FILE_BYTES:
                    raise ToolError(
                        f"{shown} is too large to read ({st.st_size:,} bytes; the limit is "
                        f"{MAX_FILE_BYTES:,}). Search it with grep instead."
                    )
                snapshot = read_snapshot(target, shown)
            except FileNotFoundError:
                raise missing_file(path, ctx) from None
            except PermissionError:
                raise ToolError(
                    f"Permission denied: {shown} cannot be read.", reason=Reason.PERMISSION_DENIED
                ) from None
            except OSError as exc:
                raise ToolError(f"{shown} cannot be read: {exc.strerror or exc}.") from None
        return _file(path, argument, snapshot, args, ctx)


def _directory(target: Resolved, shown: str, ctx: ToolContext) -> str:
    tree = list_tree(target, ctx, max_entries=MAX_DIRECTORY_ENTRIES, max_depth=1)
    if tree.total == 0:
        return f"{shown} is an empty directory."
    text = f"{shown} is a directory with {tree.total} entries:\n{tree.text}"
    if tree.shown < tree.total:
        text += f"\n[{tree.total - tree.shown} more entries not shown. Use glob to narrow.]"
    return text


def _file(
    path: Path, argument: str, snapshot: Snapshot, args: Arguments, ctx: ToolContext
) -> list[ContentBlock] | ToolOutput:
    """``path``'s content as read shows it; ``argument``: the path as a call names it
    (quoted in messages when it must be, SPEC E4)."""
    shown = quote(argument)
    data = snapshot.data
    special = _notebook_or_pdf(path, shown, snapshot, args, ctx)
    if special is not None:
        return special
    if "pages" in args:
        raise ToolError(
            f"pages applies to PDF files only; {shown} is not one. Use offset and limit."
        )
    try:
        image = image_block(data)
    except ValueError:
        image = None
    if image is not None:
        if len(data) > MAX_IMAGE_BYTES:
            raise ToolError(
                f"{shown} is an image too large to show ({len(data):,} bytes; the limit "
                f"is {MAX_IMAGE_BYTES:,})."
            )
        record(ctx, path, snapshot, partial=False)
        return [TextBlock(f"Image {shown} ({image.media_type}, {len(data):,} bytes)"), image]
    if b"\0" in data[:_BINARY_SNIFF_BYTES]:
        raise ToolError(
            f"{shown} is a binary file ({len(data):,} bytes) and cannot be shown as text."
        )
    lines = split_lines(data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace"))
    if not lines:
        record(ctx, path, snapshot, partial=False)
        details = {"path": argument, "total_lines": 0}
        return ToolOutput([TextBlock(f"{shown} is empty.")], details)
    offset = args.get("offset", 1)
    limit = args.get("limit", DEFAULT_LIMIT)
    total = len(lines)
    if offset > total:
        raise ToolError(f"{shown} has {total} lines; offset {offset} is past its end.")
    end = min(offset - 1 + limit, total)
    held = record(ctx, path, snapshot, partial=False, lines=(offset, end, total))
    shown_lines = lines[offset - 1 : end]
    if max(map(len, shown_lines), default=0) > MAX_LINE_CHARS:  # rare: cut only then, line by line
        shown_lines = [cut_line(line) for line in shown_lines]
    # A list, not a generator: str.join makes one of a generator first anyway.
    numbered = "\n".join(
        [f"{number:>6}\t{line}" for number, line in enumerate(shown_lines, start=offset)]
    )
    details = lines_details(argument, offset, end, total)
    if offset == 1 and end == total:
        return ToolOutput([TextBlock(numbered)], details)
    note = f"[{window_note(argument, offset, end, total, ctx.tool_profile)}"
    if held.partial:
        note += f" {WHOLE_READ_NEEDED}]"
    else:
        note += " With the reads before it, every line was shown: edit and write may change it.]"
    return ToolOutput([TextBlock(f"{numbered}\n\n{note}")], details)


def lines_details(path: str, first: int, last: int, total: int) -> dict[str, Any]:
    """A text read's details (SPEC F2): ``path`` (as a call's argument names it: E4's
    form, unquoted), ``lines_shown`` (1-based, inclusive), ``next_offset`` unless the
    last line is the file's, ``total_lines``."""
    details: dict[str, Any] = {"path": path, "lines_shown": [first, last], "total_lines": total}
    if last < total:
        details["next_offset"] = last + 1
    return details


def window_note(path: str, first: int, last: int, total: int, profile: str) -> str:
    """Which lines a read of ``path`` (as a call names it) showed, and the read that
    shows the rest (in ``profile``'s spelling, SPEC F14): the start of its note."""
    note = f"Lines {first}-{last} of {total} shown."
    if last < total:
        call = read_call(profile, path, last + 1, total - last)
        rest = f"offset={last + 1}" if call is None else call
        note += f" {rest} shows the rest."
    return note


def _notebook_or_pdf(
    path: Path, shown: str, snapshot: Snapshot, args: Arguments, ctx: ToolContext
) -> list[ContentBlock] | None:
    """A notebook's cells (F7) or a PDF's pages (F8); None for any other file (a
    ``.ipynb`` that is no notebook is read as text)."""
    data = snapshot.data
    lines = [key for key in ("offset", "limit") if key in args]
    ignored = f"[{' and '.join(lines)} do not apply to this file: see pages.]" if lines else ""
    if is_pdf(data):
        done = pdf_text(data, shown, args.get("pages"))
        record(ctx, path, snapshot, partial=done.partial)
        return [TextBlock(f"{done.text}\n{ignored}" if ignored else done.text)]
    if path.suffix != ".ipynb":
        return None
    try:
        nb = notebook.parse(data)
    except ValueError:
        return None
    if "pages" in args:
        raise ToolError(f"pages applies to PDF files only; {shown} is a notebook.")
    # Sources are always shown whole (outputs may be cut): a whole read (F2).
    record(ctx, path, snapshot, partial=False)
    blocks = notebook.notebook_content(nb, shown)
    if lines:
        note = f"[{' and '.join(lines)} do not apply to notebooks: every cell is shown.]"
        blocks.append(TextBlock(note))
    return blocks
