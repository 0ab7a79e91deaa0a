"""L4's cut of a text read: whole numbered lines from the start, and where it stopped.

A result whose details say which numbered lines of a file it shows (``read``'s text:
``path``, ``lines_shown``, ``total_lines``; SPEC F2) is not cut head-and-tail as other
results are (``budget.py``). Lines from the middle of a file would leave it in pieces
the model must put back together and the register cannot count; a head of whole
lines is what a read with a smaller ``limit`` would have shown. So the cut keeps the
first lines that fit the call's share with its note, and the note says which lines
were shown and names the read that shows the rest (SPEC F14, in the session's
profile's spelling); the details say the same for programs (``lines_shown``,
``next_offset``), and the register counts only the lines kept (``narrow``). No spill
file is written: the file is there to read.

The work is done only for a result over its share: ``plan`` decides from the text's
structure (a line per number, none of them holding a newline) and gives None for a
text that is not so — then the usual cut applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolpool.call_forms import quote, read_call
from toolpool.engine.budget import OutputShare, partly_read_note
from toolpool.models import TextBlock, ToolResult


@dataclass(frozen=True, slots=True)
class LineCut:
    """Of lines ``first``–``last`` (of ``total``) a read showed, those up to
    ``kept_last`` fit (``first - 1``: none), and end at ``head_end`` in its text;
    ``path`` as a call names the file."""

    path: str
    first: int
    last: int
    total: int
    kept_last: int
    profile: str
    head_end: int = 0

    @property
    def name(self) -> str:
        """The file as messages name it (SPEC E4)."""
        return quote(self.path)

    @property
    def kept(self) -> tuple[int, int] | None:
        """The lines kept, None when none is."""
        return (self.first, self.kept_last) if self.kept_last >= self.first else None


def plan(result: ToolResult, share: OutputShare, profile: str) -> LineCut | None:
    """How many whole lines of ``result`` (over ``share``) to keep; None when it is no
    text read (an error, other details, another shape) and the usual cut applies."""
    details = result.details
    path = details.get("path")
    numbers = _lines(details.get("lines_shown"), details.get("total_lines"))
    if result.is_error or len(result.content) != 1 or not isinstance(path, str) or not numbers:
        return None
    block = result.content[0]
    if not isinstance(block, TextBlock):
        return None
    first, last, total = numbers
    text = block.text
    # Every numbered line starts with its number, so no two newlines meet among
    # them: a blank line is where read's own note begins, if anywhere.
    end = text.find("\n\n")
    end = len(text) if end == -1 else end
    last_start = text.rfind("\n", 0, end) + 1
    if (
        text.count("\n", 0, end) != last - first
        or not text.startswith(f"{first:>6}\t")
        or not text.startswith(f"{last:>6}\t", last_start)
    ):
        return None  # not the lines it says: not a read's text
    whole = LineCut(path, first, last, total, last, profile, end)
    if end + 2 + len(note(whole, share, [whole.name])) <= share.chars:
        return whole  # every line fits: only the read's own note did not
    room = share.chars - _widest_note(whole, share) - 2
    stop = text.rfind("\n", 0, room + 1) if room > 0 else -1
    if stop <= 0:
        return LineCut(path, first, last, total, first - 1, profile)
    kept = text.count("\n", 0, stop) + 1
    return LineCut(path, first, last, total, first + kept - 1, profile, stop)


def cut(
    result: ToolResult, share: OutputShare, line_cut: LineCut, partly_read: Sequence[str]
) -> ToolResult:
    """``result`` cut as ``line_cut`` planned, its note and details saying where it
    stopped; ``partly_read`` names the files that now count as partly read."""
    text = result.content[0].text if isinstance(result.content[0], TextBlock) else ""
    head = text[: line_cut.head_end] + "\n\n" if line_cut.kept is not None else ""
    message = note(line_cut, share, list(partly_read))
    details: dict[str, Any] = {
        **result.details,
        "output_cut": {
            "share": share.chars,
            "turn_output_chars": share.turn_output_chars,
            "total_chars": len(text),
            "kept_chars": line_cut.head_end if line_cut.kept is not None else 0,
            "spill_file": None,
            "partly_read": list(partly_read),
        },
    }
    kept = line_cut.kept
    if kept is None:
        details.pop("lines_shown", None)
    else:
        details["lines_shown"] = list(kept)
    if line_cut.kept_last < line_cut.total:
        details["next_offset"] = line_cut.kept_last + 1
    return dataclasses.replace(result, content=(TextBlock(head + message),), details=details)


def note(line_cut: LineCut, share: OutputShare, partly: list[str]) -> str:
    """The cut's note: the lines shown, why, and the read that shows the rest."""
    first, kept_last, total = line_cut.first, line_cut.kept_last, line_cut.total
    shown = (
        f"Lines {first}-{kept_last} of {total} shown"
        if kept_last >= first
        else f"No line shown (from line {first} of {total}: the first is longer than the share)"
    )
    text = (
        f"[{shown}: this call's share of the turn's output budget is {share.chars} "
        f"characters (turn_output_chars = {share.turn_output_chars})."
    )
    if kept_last < total:
        rest = total - kept_last
        call = read_call(line_cut.profile, line_cut.path, kept_last + 1, rest)
        text += f" {call or f'offset={kept_last + 1}'} shows the rest."
    return text + partly_read_note(partly) + "]"


def _widest_note(whole: LineCut, share: OutputShare) -> int:
    """The most characters the note can take when the cut keeps a line: its numbers
    (the last line kept, the offset and limit of the rest) are each at most as long
    as ``total`` written out. (Keeping none, it is the note alone.)"""
    one = dataclasses.replace(whole, kept_last=whole.first, head_end=0)
    return len(note(one, share, [whole.name])) + 3 * len(str(whole.total))


def _lines(shown: Any, total: Any) -> tuple[int, int, int] | None:
    """(first, last, total) of ``lines_shown`` and ``total_lines`` as a read gives
    them; None for anything else."""
    if not isinstance(shown, list | tuple) or len(shown) != 2:
        return None
    first, last = shown
    numbers = (first, last, total)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        return None
    return numbers if 1 <= first <= last <= total else None
