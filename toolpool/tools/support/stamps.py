"""The file tools' side of the file-read register (SPEC F2, F3, F5, F9, F14).

``read`` records a stamp of what it read; ``edit`` and ``write`` check it in
``validate`` and again at execute time, against the bytes they are about to replace,
that those are the bytes the model read (the pipeline's ``validate`` ran earlier, and
the file may have moved since); after writing they record a stamp of what they wrote.
Every whole stamp recorded keeps a copy of its bytes (``read_copies``), so that a
refusal of a file changed since shows what changed (``stale``, F9).

F3's refusals are decided and worded here: their codes (2 never or only partly read,
3 changed since), their reasons (``toolpool.refusals``: what a tool profile words its
own refusal from) and toolpool's sentences — a code-2 refusal's from its details,
in ``toolpool.refusals`` too, because a profile words it from them as well (F14).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpool.call_forms import quote
from toolpool.errors import ToolError
from toolpool.file_reads import FileReadRegister, FileReadStamp, Freshness, content_hash
from toolpool.read_coverage import Part
from toolpool.refusals import Reason, not_read_message, unread_reason
from toolpool.tool import ToolContext, ValidationResult
from toolpool.tools.support import read_copies
from toolpool.tools.support.paths import Resolved, argument_path, display
from toolpool.tools.support.stale import WhatChanged, what_changed

# F3's refusal codes (docs/spec.md): 2 never (or only partly) read, 3 changed since.
CODE_NOT_READ = 2
CODE_STALE = 3

READ_AGAIN = "Read it again before writing to it."


def modified_since_read(name: str) -> str:
    """The first sentence of F3's code-3 refusal in ``validate``."""
    return f"File {name} has been modified since it was read, either by the user or by a linter."


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A file's bytes with its mtime and size as they were *before* the bytes were
    read: a change made during the read then shows as a moved mtime, never hidden."""

    data: bytes
    mtime_ns: int
    size: int

    @classmethod
    def take(cls, path: Path) -> Snapshot:
        """Read ``path``. Raises OSError as ``open`` does."""
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return cls(f.read(), st.st_mtime_ns, st.st_size)

    @classmethod
    def written(cls, data: bytes, st: os.stat_result) -> Snapshot:
        """What a write left behind: ``data``, with the stat of the file written."""
        return cls(data, st.st_mtime_ns, st.st_size)

    def stamp(
        self, *, partial: bool, lines: tuple[int, int, int] | None = None, call_id: str = ""
    ) -> FileReadStamp:
        """A stamp of these bytes, read now by ``call_id``: shown whole, or partly
        (``partial``: no line counted), or ``lines`` = (first, last, total) of a
        text read (F13: what the reads of one content showed adds up)."""
        now = time.time()
        if lines is not None:
            first, last, total = lines
            shown: tuple[Part, ...] = (Part(now, first, last, call_id),)
            return FileReadStamp(
                now, self.mtime_ns, self.size, content_hash(self.data), total, shown
            )
        shown = () if partial else (Part(now, 1, None, call_id),)
        return FileReadStamp(now, self.mtime_ns, self.size, content_hash(self.data), shown=shown)


def check_regular(st: os.stat_result, shown: str) -> None:
    """A ToolError unless ``st`` is a regular file's."""
    if stat.S_ISLNK(st.st_mode):
        # Resolution followed every link: one here was swapped in meanwhile.
        raise ToolError(f"{shown} was replaced by a symlink while it was opened; try again.")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{shown} is not a regular file (a device, pipe or socket).")


def read_snapshot(target: Resolved, shown: str) -> Snapshot:
    """The target's bytes, read through its directory's fd (``O_NOFOLLOW``, and
    ``O_NONBLOCK`` so that a pipe swapped in cannot block), with the stat taken before
    reading. Raises OSError as ``open`` does, a ToolError for a non-file."""
    fd = target.open(os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        check_regular(st, shown)
        return Snapshot(f.read(), st.st_mtime_ns, st.st_size)


def record(
    ctx: ToolContext,
    path: Path,
    snapshot: Snapshot,
    *,
    partial: bool,
    lines: tuple[int, int, int] | None = None,
) -> FileReadStamp:
    """F2/F5: remember in the session's register what the model now knows of ``path``
    — all of it, part of it, or (``lines``) lines first–last of its total — and, when
    it now knows the whole content (this read, or the reads of it together: F13),
    keep a copy of it to diff against (F9). The stamp now held."""
    held = ctx.files.record(path, snapshot.stamp(partial=partial, lines=lines, call_id=ctx.call_id))
    if not held.partial:
        read_copies.keep(ctx.scratch_dir, snapshot.data)
    return held


def register_verdict(
    register: FileReadRegister,
    path: str | os.PathLike[str],
    *,
    shown: Callable[[], str] | None = None,
    at: str | os.PathLike[str] | None = None,
    profile: str = "toolpool",
) -> ValidationResult:
    """F3 against ``register``: the check edit and write run in ``validate``.

    A file that does not exist needs no read. Otherwise: never or partly read →
    code 2, naming the read that lifts it (F14) in ``profile``'s spelling;
    changed since → code 3; read and unchanged → passes. A refusal names the
    file as ``shown()`` gives it, as a call's argument names it (the tools give
    its workspace-relative form, SPEC E4; called only for a refusal; quoted in
    the message when it must be), else as ``path``. ``at``: where the file is
    looked at when not at ``path`` (in a session's overlay of its workspace, V14).
    """
    if not os.path.lexists(path if at is None else at):
        return ValidationResult.passed()
    freshness = register.freshness(path, at)
    if freshness is Freshness.FRESH:
        return ValidationResult.passed()
    name = os.fspath(path) if shown is None else shown()
    if freshness is Freshness.CHANGED:
        message = f"{modified_since_read(quote(name))} {READ_AGAIN}"
        return ValidationResult.failed(message, CODE_STALE, reason=Reason.CHANGED)
    details = unread_details(name, register.get(path))
    return ValidationResult.failed(
        not_read_message(details, profile), CODE_NOT_READ, details, reason=unread_reason(details)
    )


def check_before_write(ctx: ToolContext, target: Resolved) -> ValidationResult:
    """F3 in ``validate``, for the file ``target`` holds; a refusal of a file changed
    since its read (code 3) shows what changed (F9), and when it shows the whole
    file, the register gets the stamp of exactly the bytes shown."""
    path = target.path
    verdict = register_verdict(
        ctx.files,
        path,
        shown=lambda: argument_path(path, ctx),
        at=target.seen_at(),
        profile=ctx.tool_profile,
    )
    stamp = ctx.files.get(path)
    if verdict.code != CODE_STALE or stamp is None:
        return verdict
    shown = display(path, ctx)
    try:
        current = read_snapshot(target, shown)
    except (OSError, ToolError):  # gone or swapped meanwhile: the plain refusal
        return verdict
    changed = what_changed(ctx.scratch_dir, path, stamp.content_hash, current.data, shown)
    if changed.whole:
        record(ctx, path, current, partial=False)
    first = modified_since_read(shown)
    return ValidationResult.failed(
        _refusal(first, changed),
        CODE_STALE,
        reason=Reason.CHANGED_SHOWN if changed.whole else Reason.CHANGED,
        explanation=changed.text,
    )


def ensure_unchanged_since_read(
    ctx: ToolContext, path: Path, current: Snapshot | bytes | None
) -> None:
    """F3 once more, at execute time, against ``current`` (the bytes about to be
    replaced, with their stat when a Snapshot; None when the file does not exist,
    which needs no read).

    Raises a ToolError whose details carry the F3 code: 2 when the file was never
    read or only partly, 3 when its content is not what was read. A code 3 shows what
    changed (F9); given a Snapshot whose whole content it shows, it records that as a
    whole read, so that the retry needs no read.
    """
    if current is None:
        return
    data = current.data if isinstance(current, Snapshot) else current
    shown = display(path, ctx)
    stamp = ctx.files.get(path)
    if stamp is None or stamp.partial:
        unread = unread_details(argument_path(path, ctx), stamp)
        raise ToolError(
            not_read_message(unread, ctx.tool_profile),
            details={**unread, "validation_code": CODE_NOT_READ},
            reason=unread_reason(unread),
        )
    if content_hash(data) != stamp.content_hash:
        changed = what_changed(
            ctx.scratch_dir,
            path,
            stamp.content_hash,
            data,
            shown,
            may_show_whole=isinstance(current, Snapshot),
        )
        if changed.whole and isinstance(current, Snapshot):
            record(ctx, path, current, partial=False)
        first = (
            f"File {shown} changed since it was read (by the user, a linter or another "
            "program); nothing was written."
        )
        message = _refusal(first, changed)
        raise ToolError(
            message,
            details={"validation_code": CODE_STALE},
            reason=Reason.CHANGED_BEFORE_WRITE,
            explanation=message.removeprefix(first),
        )


def _refusal(first: str, changed: WhatChanged) -> str:
    """A stale refusal: its ``first`` sentence, what changed, and unless the whole
    file was shown, the advice to read it again."""
    if changed.whole:
        return first + changed.text
    # A diff or the content stand apart; a short note stays in the sentence's line.
    gap = "\n\n" if "\n" in changed.text else " "
    return f"{first}{changed.text}{gap}{READ_AGAIN}"


# --- F3's code-2 refusal, and the read that lifts it (F14) -----------------------------


def unread_details(path: str, stamp: FileReadStamp | None) -> dict[str, Any]:
    """What a code-2 refusal of the file ``path`` (as a call's argument names it:
    workspace-relative, unquoted) tells programs: ``partly_read`` (false: never
    read), ``read_first``, the one read that lifts it (its arguments in toolpool's
    names: ``path``, and for a file whose lines were counted the ``offset`` — left
    out when it is 1 — and ``limit`` from the first line never shown to the last),
    and then ``missing_lines`` (their intervals, 1-based, inclusive) and
    ``total_lines``."""
    if stamp is None:
        return {"partly_read": False, "read_first": {"path": path}}
    gaps = stamp.missing_lines()
    if not gaps:  # its lines were never counted (a PDF's pages, a cut notebook)
        return {"partly_read": True, "read_first": {"path": path}}
    first, last = gaps[0][0], gaps[-1][1]
    fix: dict[str, Any] = {"path": path, "offset": first, "limit": last - first + 1}
    if first == 1:
        del fix["offset"]
    return {
        "partly_read": True,
        "read_first": fix,
        "missing_lines": [list(gap) for gap in gaps],
        "total_lines": stamp.lines,
    }
