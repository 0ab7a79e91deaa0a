"""The file tools' side of the file-read register (SPEC F2, F3, F5, F9).

``read`` records a stamp of what it read; ``edit`` and ``write`` check it in
``validate`` and again at execute time, against the bytes they are about to replace,
that those are the bytes the model read (the pipeline's ``validate`` ran earlier, and
the file may have moved since); after writing they record a stamp of what they wrote.
Every whole stamp recorded keeps a copy of its bytes (``read_copies``), so that a
refusal of a file changed since shows what changed (``stale``, F9).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.file_reads import (
    CODE_NOT_READ,
    CODE_STALE,
    READ_AGAIN,
    FileReadStamp,
    content_hash,
    modified_since_read,
    not_read_message,
    unread_details,
)
from toolpool.read_coverage import Part
from toolpool.tool import ToolContext, ValidationResult
from toolpool.tools import read_copies
from toolpool.tools.paths import Resolved, argument_path, display
from toolpool.tools.stale import WhatChanged, what_changed


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


def check_before_write(ctx: ToolContext, target: Resolved) -> ValidationResult:
    """F3 in ``validate``, for the file ``target`` holds; a refusal of a file changed
    since its read (code 3) shows what changed (F9), and when it shows the whole
    file, the register gets the stamp of exactly the bytes shown."""
    path = target.path
    verdict = ctx.files.check_before_write(
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
    return ValidationResult.failed(_refusal(modified_since_read(shown), changed), CODE_STALE)


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
        raise ToolError(_refusal(first, changed), details={"validation_code": CODE_STALE})


def _refusal(first: str, changed: WhatChanged) -> str:
    """A stale refusal: its ``first`` sentence, what changed, and unless the whole
    file was shown, the advice to read it again."""
    if changed.whole:
        return first + changed.text
    # A diff or the content stand apart; a short note stays in the sentence's line.
    gap = "\n\n" if "\n" in changed.text else " "
    return f"{first}{changed.text}{gap}{READ_AGAIN}"
