"""The windows where two versions of a file differ, and the pieces of difflib's
answer that ``diff_windows.py`` assembles its matching blocks from: a text's lines,
difflib's popular lines, a window's own matching blocks.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The context lines a unified diff shows: printed outside lines lie this close to a window.
CONTEXT = 3

Block = tuple[int, int, int]  # (line in a, line in b, length), as difflib's Match


def lines_of(text: str) -> list[str]:
    """Lines with their ``\\n`` kept, split on ``\\n`` only (as the tools count lines)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def popular_limit(lines_in_b: int) -> int | None:
    """difflib's autojunk: in a ``b`` of 200 lines or more, a line on more than this
    many of its lines is popular (never starts a match); None: nothing is."""
    return lines_in_b // 100 + 1 if lines_in_b >= 200 else None


@dataclass(slots=True)
class Window:
    """Where the two texts differ: lines ``a_line…`` of a and ``b_line…`` of b, at
    these character offsets (each on a line start or the end of its text)."""

    a_at: int
    a_end: int
    b_at: int
    b_end: int
    a: list[str] = field(default_factory=list)
    b: list[str] = field(default_factory=list)
    a_line: int = 0
    b_line: int = 0


@dataclass(frozen=True, slots=True)
class LineMatch:
    """difflib's matching blocks of two texts (merged, ending with the ``(la, lb, 0)``
    sentinel), with the lines a unified diff of them prints, by line number."""

    blocks: list[Block]
    a_lines: Mapping[int, str]
    b_lines: Mapping[int, str]


def windows_of(
    a_text: str, b_text: str, regions: Sequence[tuple[int, int, int, int]]
) -> tuple[list[Window], int, int]:
    """The regions as trimmed windows with their line numbers; the line counts of
    a and b."""
    windows: list[Window] = []
    line, at, shift = 0, 0, 0
    for a_at, a_end, b_at, b_end in _merged(regions):
        line += a_text.count("\n", at, a_at)
        at = a_at
        a, b = lines_of(a_text[a_at:a_end]), lines_of(b_text[b_at:b_end])
        lead = 0
        while lead < len(a) and lead < len(b) and a[lead] == b[lead]:
            lead += 1
        trail = 0
        while trail < min(len(a), len(b)) - lead and a[-1 - trail] == b[-1 - trail]:
            trail += 1
        head = sum(map(len, a[:lead]))
        tail = sum(map(len, a[len(a) - trail :]))
        window = Window(
            a_at + head,
            a_end - tail,
            b_at + head,
            b_end - tail,
            a[lead : len(a) - trail],
            b[lead : len(b) - trail],
            line + lead,
            line + lead + shift,
        )
        if window.a or window.b:
            windows.append(window)
            shift += len(window.b) - len(window.a)
    line += a_text.count("\n", at)
    if a_text and not a_text.endswith("\n"):
        line += 1
    return windows, line, line + shift


def _merged(regions: Sequence[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Regions that touch or overlap made one, so that no outside segment is empty
    (each region ends no earlier than the one before)."""
    merged: list[tuple[int, int, int, int]] = []
    for region in regions:
        if merged and region[0] <= merged[-1][1]:
            a_at, _, b_at, _ = merged[-1]
            merged[-1] = (a_at, region[1], b_at, region[3])
        else:
            merged.append(region)
    return merged


def count_line(text: str, line: str, limit: int) -> int:
    """How many lines of ``text`` equal ``line`` (newline included), no more than
    ``limit`` counted."""
    if not line.endswith("\n"):  # only a text's last line lacks its newline
        at = len(text) - len(line)
        return int(text.endswith(line) and (at == 0 or text[at - 1] == "\n"))
    found = int(text.startswith(line))
    probe = "\n" + line
    at = text.find(probe)
    while at != -1 and found < limit:
        found += 1
        at = text.find(probe, at + len(line))  # this line's newline may start the next
    return min(found, limit)


def adjacent_merged(blocks: list[Block], la: int, lb: int) -> list[Block]:
    """As ``SequenceMatcher.get_matching_blocks`` ends: sorted, adjacent blocks
    joined, the ``(la, lb, 0)`` sentinel last."""
    blocks.sort()
    merged: list[Block] = []
    i1 = j1 = k1 = 0
    for i2, j2, k2 in blocks:
        if i1 + k1 == i2 and j1 + k1 == j2:
            k1 += k2
        else:
            if k1:
                merged.append((i1, j1, k1))
            i1, j1, k1 = i2, j2, k2
    if k1:
        merged.append((i1, j1, k1))
    merged.append((la, lb, 0))
    return merged


def window_blocks(a: Sequence[str], b: Sequence[str], popular: set[str]) -> list[Block]:
    """``SequenceMatcher(None, a, b).get_matching_blocks()`` (without its end marker)
    with ``popular`` (the whole file's) in place of the autojunk of ``b``: difflib's own
    matcher, its index of ``b`` without the popular lines, as its autojunk leaves them."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for line in popular:
        matcher.b2j.pop(line, None)  # type: ignore[attr-defined]  # (untyped, not private)
    return [(i, j, k) for i, j, k in matcher.get_matching_blocks() if k]
