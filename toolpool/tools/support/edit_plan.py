"""What edit, multi_edit, notebook_edit and Anthropic's editor share: a change to one
existing file worked out in memory (``plan_edit`` for an exact replacement) and
written once, after the read-before-write check (SPEC F3, F5)."""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from toolpool.errors import ToolError
from toolpool.models import ErrorCode
from toolpool.refusals import Reason
from toolpool.sandbox.limits import Limits
from toolpool.tool import Arguments, ToolContext, ValidationResult
from toolpool.tools.support.atomic import write_atomic_at
from toolpool.tools.support.diff import replacement_diff
from toolpool.tools.support.near_miss import not_found_message
from toolpool.tools.support.paths import Access, Resolved, display, open_path, os_reason
from toolpool.tools.support.stamps import (
    Snapshot,
    check_before_write,
    ensure_unchanged_since_read,
    read_snapshot,
    record,
)
from toolpool.tools.support.suggest import missing_file, similar_names
from toolpool.tools.support.text import TextDocument, line_of

_DEFAULT_LIMITS = Limits()
_MAX_LISTED_LINES = 10


def argument_problem(args: Arguments) -> ToolError | None:
    """What is wrong with the arguments themselves, before looking at any file: the
    error to raise (or to refuse with, in ``validate``)."""
    if args["old_string"] == args["new_string"]:
        return ToolError(
            "old_string and new_string are the same: the edit would change nothing.",
            reason=Reason.NO_CHANGE,
        )
    if args["old_string"] == "":
        return ToolError("old_string is empty. To create a file or replace all of it, use write.")
    return None


@dataclass(frozen=True, slots=True)
class EditPlan:
    """An edit worked out against a file's content, not yet written."""

    old_text: str
    new_text: str
    data: bytes  # the new file bytes, BOM and line endings restored
    first: int  # where the first replaced occurrence starts, in old_text
    count: int  # occurrences replaced
    old: str  # old_string and new_string as matched and written (LF in a CRLF file)
    new: str

    def starts(self) -> Iterator[int]:
        """Where each replaced occurrence starts in ``old_text``, left to right (where
        ``str.replace`` replaces): made when the diff needs them, one at a time — a
        replace_all may replace millions."""
        at = self.first
        for _ in range(self.count):
            yield at
            at = self.old_text.find(self.old, at + len(self.old))

    @property
    def first_line(self) -> int:
        """The line of the first replacement, in the new text."""
        return line_of(self.new_text, self.first)

    @property
    def last_line(self) -> int:
        return self.first_line + self.new.count("\n")

    def diff(self, shown: str) -> str:
        """The unified diff of the edit (its preview)."""
        return replacement_diff(
            self.old_text, self.new_text, self.starts(), len(self.old), len(self.new), shown
        )


def edited_size(data: bytes, doc: TextDocument, old: str, new: str, count: int) -> int:
    """The size in bytes of the file ``data`` once ``count`` occurrences of ``old``
    are ``new`` (``len + count × (len(new) − len(old))``, in the file's encoding and
    line endings) — known before the new text is built."""
    growth = len(new.encode("utf-8", "surrogatepass")) - len(old.encode("utf-8", "surrogatepass"))
    if doc.crlf:
        growth += new.count("\n") - old.count("\n")
    return len(data) + count * growth


def too_big(size: int, max_bytes: int, shown: str) -> ToolError:
    return ToolError(
        f"The edit would make {shown} {size:,} bytes, more than the file size limit of "
        f"{max_bytes:,} bytes (file_size_bytes); nothing was changed.",
        code=ErrorCode.LIMIT_EXCEEDED.value,
    )


def plan_edit(data: bytes, args: Arguments, shown: str, max_bytes: int) -> EditPlan:
    """Apply the edit to ``data`` (the file ``shown``) in memory; a ToolError that
    helps when old_string is missing, ambiguous, or the arguments make no sense, or
    when the edited file would be over ``max_bytes`` (refused before it is built:
    a few bytes of arguments can ask for gigabytes, SPEC L11)."""
    problem = argument_problem(args)
    if problem is not None:
        raise problem
    try:
        doc = TextDocument.decode(data)
    except UnicodeDecodeError:
        raise ToolError(
            f"{shown} is not UTF-8 text, and edit only changes UTF-8 files. "
            "Use write to replace it whole."
        ) from None
    old, new = doc.normalise(args["old_string"]), doc.normalise(args["new_string"])
    count = doc.text.count(old)
    if count == 0:
        raise ToolError(not_found_message(doc.text, old, shown), reason=Reason.NOT_FOUND)
    replace_all = bool(args.get("replace_all", False))
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_string occurs {count} times in {shown} (lines "
            f"{_match_lines(doc.text, old)}). Add surrounding lines to old_string to "
            "pick one, or set replace_all to true to replace every one.",
            details={"occurrences": count},
            reason=Reason.AMBIGUOUS,
        )
    size = edited_size(data, doc, old, new, count if replace_all else 1)
    if size > max_bytes:
        raise too_big(size, max_bytes, shown)
    new_text = doc.text.replace(old, new, -1 if replace_all else 1)
    try:
        new_data = doc.encode(new_text)
    except UnicodeEncodeError:
        raise ToolError(
            "new_string is not valid Unicode text (it holds a lone surrogate)."
        ) from None
    return EditPlan(doc.text, new_text, new_data, doc.text.index(old), count, old, new)


def _match_lines(text: str, old: str) -> str:
    lines: list[str] = []
    at = text.find(old)
    while at != -1 and len(lines) < _MAX_LISTED_LINES:
        lines.append(str(line_of(text, at)))
        at = text.find(old, at + len(old))
    more = text.count(old) - len(lines)
    return ", ".join(lines) + (f" and {more} more" if more > 0 else "")


# --- what edit and multi_edit share: one file changed in memory, written once ---------


class Planned(Protocol):
    """A change worked out in memory: the file's new bytes."""

    @property
    def data(self) -> bytes: ...


P = TypeVar("P", bound=Planned)
Planner = Callable[[bytes, str], P]  # (the file's bytes, its shown name) -> the plan


def max_file_bytes(ctx: ToolContext) -> int:
    """The largest file this call may make: its ``file_size_bytes`` limit."""
    return (ctx.limits or _DEFAULT_LIMITS).file_size_bytes


def refused(error: ToolError) -> ValidationResult:
    """A refusal in ``validate`` that says what ``error`` says, with its reason."""
    return ValidationResult.failed(
        error.message, 1, error.details, reason=error.reason, explanation=error.explanation
    )


def validate_target(
    raw: str, ctx: ToolContext, problem: ToolError | None, tool: str
) -> ValidationResult:
    """Cheap checks only (T4): the path, ``problem`` (what is wrong with the arguments
    themselves), a stat, the register (F3)."""
    try:
        target = open_path(raw, ctx, Access.WRITE)
    except ToolError as exc:
        return refused(exc)
    with target:
        path = target.path
        if problem is not None:
            return refused(problem)
        # The path is shown (display resolves the workspace) only when refused.
        try:
            mode = target.lstat().st_mode
        except FileNotFoundError:
            similar = similar_names(path, ctx)
            hint = f" Did you mean {' or '.join(similar)}?" if similar else ""
            return ValidationResult.failed(
                f"File does not exist: {display(path, ctx)}.{hint} {tool} changes "
                "existing files; to create one, use write.",
                reason=Reason.NO_FILE,
            )
        except OSError as exc:
            return ValidationResult.failed(f"{display(path, ctx)}: {exc.strerror}.")
        if not stat.S_ISREG(mode):
            return ValidationResult.failed(f"{display(path, ctx)} is not a regular file.")
        return check_before_write(ctx, target)  # F3, showing what changed (F9)


def planned(raw: str, ctx: ToolContext, plan: Planner[P], tool: str) -> tuple[P, str]:
    """The plan against the file as it is now (a preview), and the file's shown name."""
    with open_path(raw, ctx, Access.WRITE) as target:
        shown = display(target.path, ctx)
        return plan(_current(target, shown, ctx, tool).data, shown), shown


def write_planned(raw: str, ctx: ToolContext, plan: Planner[P], tool: str) -> tuple[P, str]:
    """Plan against the file as it is now, write the new bytes atomically, renew the
    stamp (F5); the plan and the file's shown name."""
    with open_path(raw, ctx, Access.WRITE) as target:
        path = target.path
        shown = display(path, ctx)
        current = _current(target, shown, ctx, tool)
        # F3 again, against the bytes about to be replaced: validate ran earlier.
        ensure_unchanged_since_read(ctx, path, current)
        done = plan(current.data, shown)
        try:
            written = write_atomic_at(target.dir_fd, target.name, done.data)
        except OSError as exc:
            raise ToolError(
                f"{shown} cannot be written: {exc.strerror or exc}.", reason=os_reason(exc)
            ) from None
    record(ctx, path, Snapshot.written(done.data, written), partial=False)  # F5
    return done, shown


def _current(target: Resolved, shown: str, ctx: ToolContext, tool: str) -> Snapshot:
    """The file as it is now; a ToolError when it cannot be edited at all."""
    try:
        # Checked before opening: opening a named pipe would block.
        if not stat.S_ISREG(target.lstat().st_mode):
            raise ToolError(f"{shown} is not a regular file; {tool} changes files.")
        return read_snapshot(target, shown)
    except FileNotFoundError:
        raise missing_file(target.path, ctx, " To create a file, use write.") from None
    except OSError as exc:
        raise ToolError(f"{shown} cannot be read: {exc.strerror}.") from None
