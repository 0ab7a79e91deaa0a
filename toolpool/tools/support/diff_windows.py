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
from collections import Counter
from collections.abc import Sequence

from toolpool.tools.support.diff_regions import (
    CONTEXT,
    Block,
    LineMatch,
    Window,
    adjacent_merged,
    count_line,
    popular_limit,
    window_blocks,
    windows_of,
)

# Past this many scans of the text for a line's count, one count of all its lines.
_SCANS = 24
# Lines of an outside segment looked at for a run of lines that are not popular.
_PROBES = 64
# Pairs of equal lines across a window's edge looked at (condition 1), and the
# longest run of equal lines through one that is counted.
_CROSSINGS = 256
_LONGEST = 64


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
    windows, la, lb = windows_of(a_text, b_text, regions)
    if not windows:  # the texts are the same
        return LineMatch(adjacent_merged([(0, 0, la)], la, lb), {}, {})
    return _Proof(a_text, b_text, windows, la, lb).match()


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
        return LineMatch(adjacent_merged(blocks, self.la, self.lb), a_lines, b_lines)

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
