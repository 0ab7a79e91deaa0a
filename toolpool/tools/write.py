"""The ``write`` tool: create a file or replace a whole file (SPEC F1), guarded by the
read-before-write invariant for existing files (F3) and renewing its stamp (F5)."""

from __future__ import annotations

import stat
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.support.atomic import write_atomic_at
from toolpool.tools.support.diff import unified_diff
from toolpool.tools.support.kinds import FileWritingTool
from toolpool.tools.support.paths import Access, Resolved, display, open_path, os_reason
from toolpool.tools.support.stamps import (
    Snapshot,
    check_before_write,
    ensure_unchanged_since_read,
    read_snapshot,
    record,
)
from toolpool.tools.support.text import split_lines

DESCRIPTION = """\
Write a file: create it, or replace its whole content. Parent directories are \
created as needed.

- An existing file must have been read whole with read in this session first, and \
not changed since; write refuses otherwise. A new file needs no read.
- content is written as given, as UTF-8: exactly the text the file should hold.
- To change part of an existing file, prefer edit: it sends only the change.

Do not create documentation or README files unless asked to. Prefer this tool over \
echo, cat or tee redirections in bash."""


class WriteTool(FileWritingTool):
    """Not read-only, not concurrency-safe (SPEC F1); validate enforces F3."""

    name = "write"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "File to write, relative to the workspace.",
            },
            "content": {"type": "string", "description": "The file's complete new content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Write"

    def activity(self, args: Arguments) -> str:
        return f"Writing {args.get('path', '')}"

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """Cheap checks only (T4): the path, a stat, the register (F3)."""
        try:
            target = open_path(args["path"], ctx, Access.WRITE)
        except ToolError as exc:
            return ValidationResult.failed(exc.message)
        with target:
            # The path is shown (display resolves the workspace) only when refused.
            try:
                mode = target.lstat().st_mode
            except FileNotFoundError:
                return ValidationResult.passed()  # a new file needs no read (F3)
            except OSError as exc:
                return ValidationResult.failed(f"{display(target.path, ctx)}: {exc.strerror}.")
            if not stat.S_ISREG(mode):
                return ValidationResult.failed(
                    f"{display(target.path, ctx)} exists and is not a file."
                )
            return check_before_write(ctx, target)  # F3, showing what changed (F9)

    def preview(self, args: Arguments, ctx: ToolContext) -> str:
        """The unified diff from the current content (or from nothing) to the new."""
        with open_path(args["path"], ctx, Access.WRITE) as target:
            shown = display(target.path, ctx)
            current = _current(target, shown)
        old = "" if current is None else current.data.decode("utf-8", errors="replace")
        return unified_diff(old, args["content"], shown, created=current is None)

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        with open_path(args["path"], ctx, Access.WRITE) as target:
            path = target.path
            shown = display(path, ctx)
            current = _current(target, shown)
            # F3 again, against the bytes about to be replaced: validate ran earlier.
            ensure_unchanged_since_read(ctx, path, current)
            try:
                data = args["content"].encode("utf-8")
            except UnicodeEncodeError:
                raise ToolError(
                    "content is not valid Unicode text (it holds a lone surrogate)."
                ) from None
            try:
                target.make_parents()  # mkdirat, through the fds
                written = write_atomic_at(target.dir_fd, target.name, data)
            except OSError as exc:
                raise ToolError(
                    f"{shown} cannot be written: {exc.strerror or exc}.", reason=os_reason(exc)
                ) from None
        record(ctx, path, Snapshot.written(data, written), partial=False)  # F5
        count = len(split_lines(args["content"]))
        size = f"{count} {'line' if count == 1 else 'lines'}, {len(data):,} bytes"
        if current is None:
            return f"Created {shown} ({size})."
        return f"Replaced the content of {shown} ({size})."


def _current(target: Resolved, shown: str) -> Snapshot | None:
    """The file as it is now, None when it does not exist; a ToolError when the path
    holds something that is not a file."""
    try:
        # Checked before opening: opening a named pipe would block.
        if not stat.S_ISREG(target.lstat().st_mode):
            raise ToolError(f"{shown} exists and is not a file; write replaces files only.")
        return read_snapshot(target, shown)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ToolError(f"{shown} cannot be read: {exc.strerror}.") from None
