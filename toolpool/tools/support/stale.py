"""What a stale refusal shows (SPEC F9): the refusal of a file that changed since the
model read it (F3, code 3) says what changed, so that the model need not read again
and again.

Two parts, each when it can be had:

- a unified diff from what the model read (the copy ``read_copies`` kept, found by
  the stamp's hash) to what is on disk now, cut at ``MAX_DIFF_LINES`` lines and
  ``MAX_DIFF_CHARS`` characters with a note;
- the whole current content, numbered as ``read`` shows it, when it is small
  (at most ``WHOLE_MAX_LINES`` lines and ``WHOLE_MAX_CHARS`` characters). The model
  has then seen the file as it is, so the caller records that as a whole read of
  exactly those bytes: the corrected retry needs no read (and is refused again if the
  file changes once more).

A notebook is shown as ``read`` shows it (its cells), other files as text; a file
that is not text (a NUL in its first bytes) gets neither part.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path

from toolpool.tools.support import read_copies
from toolpool.tools.support.diff import unified_diff
from toolpool.tools.support.text import split_lines

MAX_DIFF_LINES = 60
MAX_DIFF_CHARS = 4000
WHOLE_MAX_LINES = 200
WHOLE_MAX_CHARS = 8000
_BINARY_SNIFF_BYTES = 8192


@dataclass(frozen=True, slots=True)
class WhatChanged:
    """The text to add to a stale refusal; ``whole`` when it shows the whole file."""

    text: str
    whole: bool


def as_read(path: Path, data: bytes) -> tuple[str, bool] | None:
    """``data`` (the bytes of ``path``) as the text ``read`` shows of it, and whether
    read numbers its lines (a notebook's cells it does not); None when read shows no
    text of it (a binary file)."""
    if path.suffix == ".ipynb":
        from toolpool.tools.support.notebook import notebook_text  # nbformat: only when needed

        cells = notebook_text(data)
        if cells is not None:
            return cells, False
    if b"\0" in data[:_BINARY_SNIFF_BYTES]:
        return None
    return data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace"), True


def what_changed(
    scratch_dir: Path | None,
    path: Path,
    read_hash: str,
    current: bytes,
    shown: str,
    *,
    may_show_whole: bool = True,
) -> WhatChanged:
    """What to tell the model of ``path`` (shown as ``shown``), read when its content
    hashed to ``read_hash`` and now ``current``. ``may_show_whole`` false: the caller
    cannot record the read, so the whole content is never offered as one."""
    current_read = as_read(path, current)
    if current_read is None:
        return WhatChanged(f" It is now a binary file ({len(current):,} bytes).", False)
    now, numbered = current_read
    parts = []
    before = read_copies.load(scratch_dir, read_hash)
    old = None if before is None else as_read(path, before)
    if old is not None:
        diff = unified_diff(old[0], now, shown)
        if diff:
            parts.append(f"What changed since you read it:\n{_cut_diff(diff)}")
    lines = split_lines(now)
    whole = may_show_whole and len(lines) <= WHOLE_MAX_LINES and len(now) <= WHOLE_MAX_CHARS
    if whole:
        if not numbered:
            parts.append(f"It now reads (the whole notebook, images left out):\n{now}")
        elif lines:
            text = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, start=1))
            count = f"{len(lines)} {'line' if len(lines) == 1 else 'lines'}"
            parts.append(f"It now reads (the whole file, {count}):\n{text}")
        else:
            parts.append("It is now empty.")
        parts.append(
            "This counts as a read of the file as it is now: write against this "
            "content, with no need to read it again."
        )
    if not parts:
        return WhatChanged("", False)
    return WhatChanged("\n\n" + "\n\n".join(parts), whole)


def _cut_diff(diff: str) -> str:
    """``diff`` cut at MAX_DIFF_LINES lines and MAX_DIFF_CHARS characters, on a line
    boundary, with a note of what was left out."""
    lines = diff.splitlines(keepends=True)
    kept: list[str] = []
    size = 0
    for line in lines[:MAX_DIFF_LINES]:
        if size + len(line) > MAX_DIFF_CHARS:
            break
        kept.append(line)
        size += len(line)
    text = "".join(kept).rstrip("\n")
    if len(kept) < len(lines):
        text += f"\n[diff cut: {len(lines) - len(kept)} more lines not shown]"
    return text
