"""difflib's matching lines of two versions of a file, found from the windows where
they differ rather than from the whole file.

``difflib.SequenceMatcher`` costs time in proportion to the file (a 2,000-line file:
milliseconds) even when one line changed. An edit knows where it changed the text, a
write finds it; this module runs difflib's own matcher (``SequenceMatcher`` with the
whole file's popular lines out of its index) on those *windows* only, and returns the same
matching blocks the whole-file run returns — or None when it cannot prove that, and
the caller runs difflib.

Why it is the same. Between the windows the texts are identical: the *outside
segments*. A window is trimmed: its first lines differ, and so do its last (or one
side is empty). difflib picks the longest run of equal lines that are not *popular*
(in a ``b`` of 200 lines or more, on more than 1 % + 1 of its lines: see
``popular_limit``), first in a then in b, extends it over equal neighbours, and
recurses left and right of it; a range without such a run is matched only from its
first corner. A run on an outside segment's own diagonal is extended to the whole
segment and no further, and wins over any copy of itself elsewhere (it comes first,
in a or in b). With the conditions below, difflib never picks a run that crosses
from a window to something else, so no range it recurses into cuts a segment: it
matches every outside segment whole and, in each window, exactly what its recursion
on the window alone (with the whole file's popular lines) matches, in whatever order
it picks them:

1. A window's line that is not popular may occur elsewhere (outside, or in another
   window), but each run of equal lines through such a pair is shorter than a run
   of lines that are not popular in an outside segment that every range holding the
   pair holds whole (the segment of the line outside; one between the two windows):
   that run wins first, and the pair can no longer match.
2. No block of a window's own would be extended over the window's edge (checked on
   the blocks); when one side is empty, the lines around the window are not the
   first and the last line of its other side.
3. No run of outside lines straddles a window with an empty side: one of the two
   lines around it is popular, or occurs once.
4. Each outside segment after the first holds a line that is not popular, so that
   difflib matches it through a run (the first is matched from its corner anyway).

Lines are counted and found in the text itself (``str.find`` runs), not in lists of
every line, so the cost is that of the windows and a few scans of the text.
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The context lines a unified diff shows: printed outside lines lie this close to a window.
CONTEXT = 3
# Past this many scans of the text for a line's count, one count of all its lines.
_SCANS = 24
# Lines of an outside segment looked at for a run of lines that are not popular.
_PROBES = 64
# Pairs of equal lines across a window's edge looked at (condition 1), and the
# longest run of equal lines through one that is counted.
_CROSSINGS = 256
_LONGEST = 64

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


def match_lines(
    a_text: str, b_text: str, regions: Sequence[tuple[int, int, int, int]]
) -> LineMatch | None:
    """The matching blocks of ``lines_of(a_text)`` and ``lines_of(b_text)`` as
    ``difflib.SequenceMatcher`` finds them, or None when the conditions of the module
    docstring do not hold.

    ``regions`` are ``(a_at, a_end, b_at, b_end)`` character ranges in increasing
    order, each starting on a line start and ending after a ``\\n`` (or at the end of
    its text), outside which the texts are identical.
    """
    windows, la, lb = _windows(a_text, b_text, regions)
    if not windows:  # the texts are the same
        return LineMatch(_adjacent_merged([(0, 0, la)], la, lb), {}, {})
    return _Proof(a_text, b_text, windows, la, lb).match()


def _windows(
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


class _Proof:
    """Checks the module's conditions for the windows of ``a_text`` and ``b_text``,
    then assembles difflib's blocks from the outside segments and each window's own
    run. Segment ``m`` is the one before window ``m`` (the last one after the last)."""

    def __init__(self, a_text: str, b_text: str, windows: list[Window], la: int, lb: int) -> None:
        self.text, self.b_text = a_text, b_text
        self.windows = windows
        self.la, self.lb = la, lb
        self.limit = popular_limit(lb)
        self.in_a: Counter[str] = Counter()
        self.in_b: Counter[str] = Counter()
        for window in windows:
            self.in_a.update(window.a)
            self.in_b.update(window.b)
        self._outside: dict[str, tuple[int, int]] = {}  # line → (count, counted up to)
        self._scans = 0
        self._parts: Counter[str] = Counter()  # every line of a, once scans cost more
        self._starts = [window.a_at for window in windows]

    def _count(self, line: str, limit: int) -> int:
        """``count_line`` in a; past ``_SCANS`` scans of the text, one count of all
        its lines answers the rest."""
        self._scans += 1
        if self._scans <= _SCANS:
            return count_line(self.text, line, limit)
        if self._scans == _SCANS + 1:
            self._parts = Counter(self.text.split("\n"))
        last = self.text[self.text.rfind("\n") + 1 :]  # no line: what follows the last \n
        if not line.endswith("\n"):
            return int(line == last)
        return min(self._parts[line[:-1]] - (line[:-1] == last), limit)

    def outside(self, line: str, need: int = 1) -> int:
        """The line's occurrences outside the windows, counted up to ``need`` at
        least, and as far as its popularity needs."""
        if self.limit is not None:
            need = max(need, self.limit + 1 - self.in_b[line])
        found, upto = self._outside.get(line, (0, 0))
        if upto < need and found == upto:  # not counted yet, or not far enough
            found = self._count(line, self.in_a[line] + need) - self.in_a[line]
            self._outside[line] = found, need
        return found

    def popular(self, line: str) -> bool:
        if self.limit is None:
            return False
        return self.in_b[line] > self.limit or self.in_b[line] + self.outside(line) > self.limit

    def match(self) -> LineMatch | None:
        popular = self._separated()
        if popular is None:
            return None
        blocks: list[Block] = []
        a_lines: dict[int, str] = {}
        b_lines: dict[int, str] = {}
        a_next = b_next = 0
        for index, window in enumerate(self.windows):
            own = window_blocks(window.a, window.b, popular)
            if not self._fenced(index, own):
                return None
            if window.a_line > a_next:  # the outside segment before it
                blocks.append((a_next, b_next, window.a_line - a_next))
            blocks += [(window.a_line + i, window.b_line + j, k) for i, j, k in own]
            a_lines.update(enumerate(window.a, window.a_line))
            b_lines.update(enumerate(window.b, window.b_line))
            a_next, b_next = window.a_line + len(window.a), window.b_line + len(window.b)
        if self.la > a_next:
            blocks.append((a_next, b_next, self.la - a_next))
        self._context(a_lines)
        return LineMatch(_adjacent_merged(blocks, self.la, self.lb), a_lines, b_lines)

    def _separated(self) -> set[str] | None:
        """Condition 1; the windows' popular lines when it holds."""
        popular: set[str] = set()
        # Where each line that is not popular occurs in the windows: (window, side,
        # offset in its text); a line in a only (not in b) matches nothing.
        places: dict[str, list[tuple[int, str, int]]] = {}
        for index, window in enumerate(self.windows):
            for side, lines, at in (("a", window.a, window.a_at), ("b", window.b, window.b_at)):
                for line in lines:
                    if line in popular or (line not in places and self.popular(line)):
                        popular.add(line)
                    elif self.in_b[line] or self.outside(line):
                        places.setdefault(line, []).append((index, side, at))
                    at += len(line)
        need: dict[int, int] = {}  # segment → the run it must hold, longer than any crossing
        crossings: list[tuple[int, int, int]] = []
        for line, where in places.items():
            crossings += self._crossings(line, where)
            if len(crossings) > _CROSSINGS:
                return None
        for segment, x, y in crossings:
            run = self._run_through(x, y)
            if run >= _LONGEST:
                return None
            need[segment] = max(need.get(segment, 0), run + 1)
        if not all(self._holds_run(m, n) for m, n in need.items()):
            return None
        return popular

    def _crossings(
        self, line: str, where: list[tuple[int, str, int]]
    ) -> list[tuple[int, int, int]]:
        """The pairs of a window's ``line`` with the same line elsewhere, as
        ``(segment, offset in a, offset in b)``: the segment that a range holding
        the pair holds whole, so that its own run, if longer, is matched first.
        No more than ``_CROSSINGS`` and one."""
        crossings = []
        for k, side, at in where:
            for m, other, elsewhere in where:
                if side == "a" and other == "b" and k != m:
                    crossings.append((min(k, m) + 1, at, elsewhere))
            if len(crossings) > _CROSSINGS:
                return crossings
        if self.outside(line):
            for z in self._outside_offsets(line):
                segment = bisect.bisect_right(self._starts, z)
                if segment:  # the offset in b: shifted by the windows before
                    before = self.windows[segment - 1]
                    z_b = z - before.a_end + before.b_end
                else:
                    z_b = z
                for _, side, at in where:
                    crossings.append((segment, *((at, z_b) if side == "a" else (z, at))))
                if len(crossings) > _CROSSINGS:
                    return crossings
        return crossings

    def _outside_offsets(self, line: str) -> list[int]:
        """Where ``line`` starts in a, outside the windows."""
        text = self.text
        if not line.endswith("\n"):  # only the last line can be it
            starts = [len(text) - len(line)] if count_line(text, line, 1) else []
        else:
            starts = [0] if text.startswith(line) else []
            hit = text.find("\n" + line)
            while hit != -1:
                starts.append(hit + 1)
                hit = text.find("\n" + line, hit + len(line))
        return [at for at in starts if not any(w.a_at <= at < w.a_end for w in self.windows)]

    def _run_through(self, x: int, y: int) -> int:
        """How many equal lines run through the line at ``x`` in a and the one at
        ``y`` in b (their diagonal), counted up to ``_LONGEST``: no run of lines
        that are not popular through them is longer."""
        a, b = self.text, self.b_text
        run = 1
        i, j = x, y
        while i and j and run < _LONGEST:
            i0, j0 = a.rfind("\n", 0, i - 1) + 1, b.rfind("\n", 0, j - 1) + 1
            if a[i0:i] != b[j0:j]:
                break
            i, j, run = i0, j0, run + 1
        i, j = _next_line(a, x), _next_line(b, y)
        while i < len(a) and j < len(b) and run < _LONGEST:
            i1, j1 = _next_line(a, i), _next_line(b, j)
            if a[i:i1] != b[j:j1]:
                break
            i, j, run = i1, j1, run + 1
        return run

    def _holds_run(self, segment: int, run: int) -> bool:
        """Whether the outside segment holds ``run`` lines in a row that are not
        popular (a run difflib may match), found among its first ``_PROBES`` lines."""
        windows = self.windows
        before = windows[segment - 1] if segment else None
        start = before.a_end if before else 0
        first = before.a_line + len(before.a) if before else 0
        last = windows[segment].a_line if segment < len(windows) else self.la
        if self.limit is None:  # nothing is popular: the segment is one run
            return last - first >= run
        at, found = start, 0
        for _ in range(min(last - first, _PROBES)):
            line = self.text[at : _next_line(self.text, at)]
            found = 0 if self.popular(line) else found + 1
            if found >= run:
                return True
            at += len(line)
        return False

    def _fenced(self, index: int, own: list[Block]) -> bool:
        """Conditions 2, 3 and 4 for the window ``index``, whose own blocks are
        ``own``, and the segment after it."""
        window = self.windows[index]
        a, b = window.a, window.b
        before = self._line_before(window.a_at) if window.a_at else None
        after = self._line_at(window.a_end) if window.a_end < len(self.text) else None
        if _leaks(own, a, b, before, after):
            return False
        if not (a and b):
            # One side is empty: the segments' runs around it must stop at it ...
            side = a or b
            if side[0] == after or side[-1] == before:
                return False
            # ... and no run may straddle it.
            if (
                before is not None
                and after is not None
                and not any(
                    self.popular(x) or self.outside(x, need=2) == 1 for x in (before, after)
                )
            ):
                return False
        return after is None or self._holds_run(index + 1, 1)

    def _line_at(self, at: int) -> str:
        return self.text[at : _next_line(self.text, at)]

    def _line_before(self, at: int) -> str:
        return self.text[self.text.rfind("\n", 0, at - 1) + 1 : at]

    def _context(self, a_lines: dict[int, str]) -> None:
        """The outside lines a diff may print: ``CONTEXT`` around each window."""
        for index, window in enumerate(self.windows):
            start = self.windows[index - 1].a_end if index else 0
            at, line = window.a_at, window.a_line
            for _ in range(CONTEXT):
                if at <= start:
                    break
                text = self._line_before(at)
                at, line = at - len(text), line - 1
                a_lines[line] = text
            end = self.windows[index + 1].a_at if index + 1 < len(self.windows) else len(self.text)
            at, line = window.a_end, window.a_line + len(window.a)
            for _ in range(CONTEXT):
                if at >= end:
                    break
                text = self._line_at(at)
                a_lines[line] = text
                at, line = at + len(text), line + 1


def _leaks(
    own: list[Block], a: list[str], b: list[str], before: str | None, after: str | None
) -> bool:
    """Whether difflib would extend one of a window's blocks over its edge: the
    block ends there on one side, and the line outside (None: there is none) is the
    next one on the other."""
    for i, j, k in own:
        if (i == 0 < j and b[j - 1] == before) or (j == 0 < i and a[i - 1] == before):
            return True
        i, j = i + k, j + k
        if (i == len(a) and j < len(b) and b[j] == after) or (
            j == len(b) and i < len(a) and a[i] == after
        ):
            return True
    return False


def _next_line(text: str, at: int) -> int:
    """Where the line after the one starting at ``at`` starts (or the text's end)."""
    end = text.find("\n", at)
    return len(text) if end == -1 else end + 1


def _adjacent_merged(blocks: list[Block], la: int, lb: int) -> list[Block]:
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
