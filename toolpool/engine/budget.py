"""A turn's output budget (SPEC L4): how much text the model gets from one turn.

Beside each call's ``output_bytes`` (enforced where the call runs), the text of a
turn's results is bounded by ``turn_output_chars``. Each call's *share* is fixed when
the turn is submitted, never by which call finishes first:

- a turn submitted with its calls (closed): ``turn_output_chars // n`` for each of
  its ``n`` calls;
- an open turn, whose calls keep coming (``Turn.add``): every call, submitted or
  appended, gets ``turn_output_chars // max(n, OPEN_TURN_SHARES)``, ``n`` being the
  number it was submitted with.

A result whose text is over its share is cut before its ``tool_end`` (so every
consumer sees the same result): its head and tail are kept (whole lines where
possible) around a note that says how much was cut and names the spill file holding
the full text, in the session's scratch directory (``output/``, mode 0600, readable
by the session's file tools and no other session's). The note counts toward the
share: a cut result's text fits its share, unless the share is smaller than the note
(then the note alone is left). Only text is counted; images and other blocks stay as
they are (they have their own limits: ``read``'s image size, ``output_bytes``), and
are not in the spill file. A text read is cut otherwise: its first whole lines, no
tail and no spill file (``line_cut.py``). A cut result of a read-only tool takes back
from the register what this call recorded of its files and the model did not see
(F13: edit and write then refuse them until those lines are shown).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpool.models import ContentBlock, TextBlock, ToolResult
from toolpool.refusals import WHOLE_READ_NEEDED
from toolpool.runtime import private_dir, spill_name
from toolpool.sandbox.limits import Limits
from toolpool.spill import spill_text

DEFAULT_TURN_OUTPUT_CHARS = 400_000
# An open turn cannot divide a total it does not know: each of its calls gets a share
# as if the turn had at least this many (400,000 // 4 = 100,000 characters by
# default, about the 25,000 tokens MCP clients take from one result).
OPEN_TURN_SHARES = 4
SPILL_DIR = "output"  # in the session's scratch directory (bash's is "bash")


@dataclass(frozen=True, slots=True)
class OutputShare:
    """How many characters of text one call's result may carry (``chars``), out of
    the turn's ``turn_output_chars``."""

    chars: int
    turn_output_chars: int


def check_turn_output_chars(value: Any) -> int:
    """A valid budget: an int ≥ 0, 0 meaning none."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"turn_output_chars must be an integer >= 0 (0: none), not {value!r}")
    return value


def turn_share(turn_output_chars: int, calls: int, *, open: bool) -> OutputShare | None:
    """The share of each call of a turn submitted with ``calls`` calls; None without
    a budget."""
    if turn_output_chars <= 0:
        return None
    parts = max(calls, OPEN_TURN_SHARES) if open else max(calls, 1)
    return OutputShare(turn_output_chars // parts, turn_output_chars)


def text_chars(result: ToolResult) -> int:
    """The characters of a result's text blocks: what a share counts."""
    return sum(len(b.text) for b in result.content if isinstance(b, TextBlock))


def over_share(result: ToolResult, share: OutputShare | None) -> bool:
    return share is not None and text_chars(result) > share.chars


@dataclass(frozen=True, slots=True)
class Spill:
    """Where a cut result's full text went; ``path`` None when it could not be
    written (``failure`` says why)."""

    path: Path | None
    failure: str | None = None


def write_spill(scratch_dir: Path, call_id: str, text: str, limit_bytes: int) -> Spill:
    """Write ``text`` to a new spill file (0600) in ``scratch_dir/output`` (0700), cut at
    ``limit_bytes`` as every spill file is (``toolpool.spill``); never raises."""
    name = spill_name(call_id, ".txt")
    try:
        directory = private_dir(scratch_dir / SPILL_DIR)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            spill_text(directory / name, text, limit_bytes, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except Exception as exc:  # a full disk, a closed session: the cut goes on
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Spill(None, reason or type(exc).__name__)
    return Spill(directory / name)


def spill_limit(session_limits: Any) -> int:
    """The session's ``spill_bytes`` (or the default): the most a spill file holds."""
    try:
        return Limits().merged(session_limits).spill_bytes
    except (TypeError, ValueError):
        return Limits().spill_bytes


def cut_to_share(
    result: ToolResult,
    share: OutputShare,
    spill: Spill,
    *,
    partly_read: Iterable[str] = (),
) -> ToolResult:
    """``result`` with its text cut to ``share`` around a note naming ``spill``;
    ``partly_read`` names the files that now count as partly read."""
    texts = [b.text for b in result.content if isinstance(b, TextBlock)]
    joined = "".join(texts)
    total = len(joined)
    if total <= share.chars:
        return result
    partly = list(partly_read)

    def marker(left_out: int, lead: str = "\n\n", trail: str = "\n\n") -> str:
        return f"{lead}{_note(left_out, total, share, spill, partly)}{trail}"

    # Numbers in the note and the blank lines around it only shrink from here:
    # measure it at its largest.
    room = max(0, share.chars - len(marker(total)))
    head_end = _head_end(joined, room - room // 2)
    tail_start = _tail_start(joined, room // 2)
    lead = "" if head_end == 0 else "\n" if joined[head_end - 1] == "\n" else "\n\n"
    trail = "" if tail_start == total else "\n\n"
    cut_here = marker(tail_start - head_end, lead, trail)

    content: list[ContentBlock] = []
    position = 0
    for block in result.content:
        if not isinstance(block, TextBlock):
            content.append(block)  # images are not counted, and stay
            continue
        start, end = position, position + len(block.text)
        position = end
        head = block.text[: max(0, min(end, head_end) - start)]
        tail = block.text[max(0, tail_start - start) :] if end > tail_start else ""
        text = head + cut_here + tail if start <= head_end < end else head + tail
        if text:
            content.append(TextBlock(text))
    kept = head_end + total - tail_start
    details = {
        **result.details,
        "output_cut": {
            "share": share.chars,
            "turn_output_chars": share.turn_output_chars,
            "total_chars": total,
            "kept_chars": kept,
            "spill_file": None if spill.path is None else str(spill.path),
            "partly_read": partly,
        },
    }
    return dataclasses.replace(result, content=tuple(content), details=details)


def _note(left_out: int, total: int, share: OutputShare, spill: Spill, partly: list[str]) -> str:
    note = (
        f"[{left_out} of {total} characters cut here: this call's share of the turn's output "
        f"budget is {share.chars} characters (turn_output_chars = {share.turn_output_chars})."
    )
    if spill.path is not None:
        note += f" Full output: {spill.path} (read it with offset and limit)."
    else:
        note += f" The full output could not be saved: {spill.failure}."
    return note + partly_read_note(partly) + "]"


def partly_read_note(partly: list[str]) -> str:
    """What a cut note says of the files the cut left partly read (F3 then refuses to
    change them), or nothing."""
    if not partly:
        return ""
    counts = "counts" if len(partly) == 1 else "count"
    return f" {', '.join(partly)} now {counts} as partly read: {WHOLE_READ_NEEDED}"


def _head_end(text: str, room: int) -> int:
    """Where a head of at most ``room`` characters ends: after a newline when one is
    in its second half, so that lines stay whole."""
    if room <= 0:
        return 0
    newline = text.rfind("\n", 0, room)
    return newline + 1 if newline >= room // 2 else room


def _tail_start(text: str, room: int) -> int:
    """Where a tail of at most ``room`` characters starts: at a line's start when one
    is in its first half."""
    if room <= 0:
        return len(text)
    start = len(text) - room
    newline = text.find("\n", start, start + room // 2)
    return newline + 1 if newline >= 0 else start
