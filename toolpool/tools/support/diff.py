"""Unified diffs: the preview (SPEC P7) of edit and write, for UIs and gates.

The text is ``difflib.unified_diff``'s (3 lines of context), byte for byte, cut at
``MAX_DIFF_CHARS`` with ``preflight.cut_note``. The call's worker computes it for
every edit and write, before the gate, so it is not computed the way difflib does,
over the whole file: a new file is all
added lines, and otherwise ``diff_windows`` finds difflib's matching lines from the
windows that changed (an edit knows its replacements; a write finds the common
start and end) and falls back to difflib only when it cannot prove the result.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator

from toolpool.preflight import PREVIEW_CHARS, cut_note
from toolpool.tools.support.diff_regions import CONTEXT, LineMatch, lines_of
from toolpool.tools.support.diff_windows import match_lines

# A preview travels as an event to every client; past this size it says so and stops.
MAX_DIFF_CHARS = PREVIEW_CHARS
_NO_NEWLINE = "\\ No newline at end of file\n"


def _header(side: str, name: str) -> str:
    """The name of one side (``a`` or ``b``) of a diff's header, as git writes it: a
    workspace-relative ``name`` under ``a/`` or ``b/``, a quoted one with the prefix
    inside its quotes (``"a/we\\nird.txt"``), an absolute one (a file in an extra root)
    as it is."""
    if name.startswith(("/", '"/')):
        return name
    if name.startswith('"'):
        return f'"{side}/{name[1:]}'
    return f"{side}/{name}"


def unified_diff(old: str, new: str, name: str, *, created: bool = False) -> str:
    """The unified diff from ``old`` to ``new`` of the file ``name`` (3 lines of
    context; ``name`` as paths.display writes it); ``created`` diffs from
    ``/dev/null``. Empty when nothing changes."""
    fromfile = "/dev/null" if created else _header("a", name)
    if old == new:
        return ""
    if not old:
        return _all_added(new, fromfile, _header("b", name))
    # One region: from the line of the first difference to the identical end.
    start = old.rfind("\n", 0, _first_difference(old, new)) + 1
    a_end, b_end = _common_end(old, new, start)
    return _diff(old, new, [(start, a_end, start, b_end)], fromfile, name)


def replacement_diff(
    old: str, new: str, starts: Iterable[int], removed: int, added: int, name: str
) -> str:
    """The same as ``unified_diff(old, new, name)`` when ``new`` is ``old`` with the
    ``removed`` characters at each of ``starts`` (increasing) replaced by ``added``
    characters (an edit), in time that grows with the replaced lines rather than the
    file: replacements in a line already taken cost no search."""
    regions: list[tuple[int, int, int, int]] = []
    shift = 0
    for start in starts:
        grown = shift + added - removed
        if regions:
            a_at, a_end, b_at, _ = regions[-1]
            # Its line's end is the last region's: the newline that ends that region
            # comes after this replacement (or the text has no newline after either).
            if start + removed < a_end or a_end == len(old):
                regions[-1] = (a_at, a_end, b_at, a_end + grown)
                shift = grown
                continue
        # From the line the replacement starts in to the first newline after it: a
        # line start in both texts (a replaced newline may join the next line).
        a_at = old.rfind("\n", 0, start) + 1
        newline = old.find("\n", start + removed)
        a_end = len(old) if newline == -1 else newline + 1
        regions.append((a_at, a_end, a_at + shift, a_end + grown))
        shift = grown
    return _diff(old, new, regions, _header("a", name), name)


def _diff(
    old: str, new: str, regions: list[tuple[int, int, int, int]], fromfile: str, name: str
) -> str:
    match = match_lines(old, new, regions)
    if match is None:  # not proven the same as difflib's: difflib itself
        return _cut(
            difflib.unified_diff(
                lines_of(old), lines_of(new), fromfile=fromfile, tofile=_header("b", name)
            )
        )
    return _cut(_formatted(match, fromfile, _header("b", name)))


def _common_end(old: str, new: str, start: int) -> tuple[int, int]:
    """Where the identical end of both texts begins, after ``start`` and on a line
    start of both: ``(a_end, b_end)``."""
    same = _first_difference(old[::-1], new[::-1])
    same = min(same, len(old) - start, len(new) - start)
    newline = old.find("\n", len(old) - same)
    a_end = len(old) if newline == -1 else newline + 1
    return a_end, a_end - len(old) + len(new)


def _first_difference(a: str, b: str) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter's length when one
    starts the other), by slice comparisons rather than a loop over characters."""
    end = min(len(a), len(b))
    lo, step = 0, 4096
    while lo < end and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    hi = min(lo + step, end)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return min(lo, end)


def _all_added(new: str, fromfile: str, tofile: str) -> str:
    """The diff from nothing: one hunk of added lines, made by ``str.replace``
    rather than line by line (a new file can be long)."""
    count = new.count("\n") + (not new.endswith("\n"))
    # "+" after every newline but the last one's (which ends the last line).
    added = "+" + new.replace("\n", "\n+", count - 1)
    if not new.endswith("\n"):
        added += "\n" + _NO_NEWLINE
    text = f"--- {fromfile}\n+++ {tofile}\n@@ -0,0 +{_range(0, count)} @@\n{added}"
    if len(text) <= MAX_DIFF_CHARS:
        return text
    head = [f"--- {fromfile}\n", f"+++ {tofile}\n", f"@@ -0,0 +{_range(0, count)} @@\n"]
    return _cut([*head, *("+" + line for line in lines_of(new))])


def _formatted(match: LineMatch, fromfile: str, tofile: str) -> Iterator[str]:
    """``difflib.unified_diff``'s lines, from matching blocks already found."""
    a, b = match.a_lines, match.b_lines
    for index, group in enumerate(_groups(_opcodes(match.blocks))):
        if not index:
            yield f"--- {fromfile}\n"
            yield f"+++ {tofile}\n"
        first, last = group[0], group[-1]
        yield f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for i in range(i1, i2):
                    yield " " + a[i]
                continue
            if tag in ("replace", "delete"):
                for i in range(i1, i2):
                    yield "-" + a[i]
            if tag in ("replace", "insert"):
                for j in range(j1, j2):
                    yield "+" + b[j]


Opcode = tuple[str, int, int, int, int]


def _opcodes(blocks: Iterable[tuple[int, int, int]]) -> list[Opcode]:
    """``SequenceMatcher.get_opcodes`` from its matching blocks."""
    i = j = 0
    codes: list[Opcode] = []
    for ai, bj, size in blocks:
        tag = ""
        if i < ai and j < bj:
            tag = "replace"
        elif i < ai:
            tag = "delete"
        elif j < bj:
            tag = "insert"
        if tag:
            codes.append((tag, i, ai, j, bj))
        i, j = ai + size, bj + size
        if size:
            codes.append(("equal", ai, i, bj, j))
    return codes


def _groups(codes: list[Opcode], n: int = CONTEXT) -> Iterator[list[Opcode]]:
    """``SequenceMatcher.get_grouped_opcodes(n)``: the hunks, ``n`` lines of context."""
    if not codes:
        codes = [("equal", 0, 1, 0, 1)]
    if codes[0][0] == "equal":
        tag, i1, i2, j1, j2 = codes[0]
        codes[0] = tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2
    if codes[-1][0] == "equal":
        tag, i1, i2, j1, j2 = codes[-1]
        codes[-1] = tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        # A long run of unchanged lines ends a hunk and starts the next.
        if tag == "equal" and i2 - i1 > n + n:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _range(start: int, stop: int) -> str:
    """A hunk header's range, as difflib writes it (``3``, ``3,4``, ``2,0``)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def _cut(lines: Iterable[str]) -> str:
    out: list[str] = []
    size = 0
    for line in lines:
        # difflib leaves a last line without its newline as it is; say so as diff does.
        text = line if line.endswith("\n") else f"{line}\n{_NO_NEWLINE}"
        if size + len(text) > MAX_DIFF_CHARS:
            out.append(cut_note(MAX_DIFF_CHARS))
            break
        out.append(text)
        size += len(text)
    return "".join(out)
