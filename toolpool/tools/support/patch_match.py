"""How a hunk of ``apply_patch`` finds its place in a file's text (``apply_hunks``).

Matching is Codex's: a hunk's "@@ line" is found first (from where the hunk before
it ended), then its old lines from there — exactly, then ignoring trailing
whitespace, then ignoring leading and trailing whitespace, then also ignoring
typographic dashes, quotes and spaces (Codex's punctuation normalisation). A hunk
marked "*** End of File" must match at the file's end. Context lines keep the
file's own text (a loose match does not rewrite them); an updated file ends with a
newline, CRLF endings and a UTF-8 BOM are kept. Beyond Codex: a hunk of only added
lines goes right below its "@@ line" (Codex appends it to the file's end), at the
end when it has none.
"""

from __future__ import annotations

from collections.abc import Callable

from toolpool.errors import ToolError
from toolpool.tools.support.near_miss import whitespace_match
from toolpool.tools.support.patch_grammar import (
    Hunk,
)
from toolpool.tools.support.text import cut_line

# Typographic characters Codex's matching treats as their ASCII forms (its last pass).
_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a", " "),
        **dict.fromkeys("\u202f\u205f\u3000", " "),
    }
)
_MAX_QUOTED_LINES = 20


def _loosest(line: str) -> str:
    return line.strip().translate(_PUNCTUATION)


def _exact(line: str) -> str:
    return line


# The passes of a search, strictest first: each runs over the whole range before the next.
_PASSES: tuple[Callable[[str], str], ...] = (_exact, str.rstrip, str.strip, _loosest)


def seek(lines: list[str], pattern: list[str], start: int, *, at_end: bool) -> int | None:
    """Where ``pattern`` starts in ``lines`` at or after ``start`` (only at the very
    end when ``at_end``), by the strictest pass that finds it; None when none does."""
    if not pattern:
        return start
    last = len(lines) - len(pattern)
    if last < 0:
        return None
    first = last if at_end else start
    for key in _PASSES:
        wanted = [key(line) for line in pattern]
        head = wanted[0]
        for i in range(first, last + 1):
            if key(lines[i]) == head and all(
                key(lines[i + k]) == wanted[k] for k in range(1, len(wanted))
            ):
                return i
    return None


def apply_hunks(text: str, hunks: tuple[Hunk, ...], shown: str) -> str:
    """``text`` (LF line endings) with ``hunks`` applied, Codex's way (module
    docstring); a ToolError naming the hunk that does not match, and where the file
    comes nearest."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    at = 0
    replacements: list[tuple[int, int, list[str]]] = []
    for index, hunk in enumerate(hunks):
        if hunk.header is not None:
            found = seek(lines, [hunk.header], at, at_end=False)
            if found is None:
                raise _mismatch(lines, hunks, index, at, shown)
            at = found + 1
        changes = hunk.lines
        old = hunk.old
        if not old:  # only added lines: below the header, or at the end
            where = len(lines) if hunk.header is None or hunk.at_end else at
            replacements.append((where, 0, hunk.new))
            continue
        found = seek(lines, old, at, at_end=hunk.at_end)
        if found is None and len(old) > 1 and old[-1] == "":
            # A last empty line often stands for the file's final newline (Codex
            # retries without it): then what is left must end the file.
            found = seek(lines, old[:-1], at, at_end=True)
            if found is not None and found >= at:
                last = max(i for i, change in enumerate(changes) if change.kind != "+")
                changes, old = changes[:last] + changes[last + 1 :], old[:-1]
            else:
                found = None
        if found is None:
            raise _mismatch(lines, hunks, index, at, shown)
        new: list[str] = []
        seen = 0
        for change in changes:
            if change.kind == " ":
                new.append(lines[found + seen])  # the file's own text, however it matched
            if change.kind != "+":
                seen += 1
            if change.kind == "+":
                new.append(change.text)
        replacements.append((found, len(old), new))
        at = found + len(old)
    for start, length, new in sorted(replacements, key=lambda r: r[0], reverse=True):
        lines[start : start + length] = new
    return "".join(f"{line}\n" for line in lines)


def _mismatch(
    lines: list[str], hunks: tuple[Hunk, ...], index: int, at: int, shown: str
) -> ToolError:
    hunk = hunks[index]
    where = f"hunk {index + 1} of {len(hunks)} (line {hunk.line} of the patch)"
    base = f"Update File {shown}: {where} does not match the file."
    again = (
        " Look at the file again (it may have changed) and make the patch from what it holds now."
    )
    if hunk.header is not None and seek(lines, [hunk.header], at, at_end=False) is None:
        above = "" if at == 0 else f" below line {at}, where the hunk before it ended"
        return ToolError(f"{base} Its '@@ {hunk.header}' line is not in the file{above}.{again}")
    old = hunk.old
    anywhere = seek(lines, old, 0, at_end=False)
    if anywhere is not None and anywhere < at:
        return ToolError(
            f"{base} Its lines are at line {anywhere + 1}, above where the hunk before it "
            "ended: give the hunks of a file in the file's order."
        )
    if anywhere is not None and hunk.at_end:
        return ToolError(
            f"{base} It is marked '*** End of File' but its lines are at line "
            f"{anywhere + 1}, not at the end. Drop the marker, or patch the file's end."
        )
    spaced = whitespace_match("\n".join(lines[at:]), "\n".join(old))
    if spaced is not None:
        line, quoted = spaced
        return ToolError(
            f"{base} Its lines are there except for whitespace inside them, at line "
            f"{line + at}; the file has:\n{quoted}\nCopy the lines exactly as the file has them."
        )
    return ToolError(base + _nearest(lines, old) + again)


def _nearest(lines: list[str], old: list[str]) -> str:
    """Where the file comes nearest the hunk's old lines: the window where most of
    them are the file's lines (whitespace and punctuation aside), quoted."""
    wanted = [_loosest(line) for line in old]
    loose = [_loosest(line) for line in lines]
    best, best_at = 0, 0
    for i in range(max(len(lines) - len(old), 0) + 1):
        same = sum(a == b for a, b in zip(loose[i : i + len(old)], wanted, strict=False))
        if same > best:
            best, best_at = same, i
    if best == 0:
        return " None of its context or removed lines is in the file."
    shown = lines[best_at : best_at + min(len(old), _MAX_QUOTED_LINES)]
    quoted = "\n".join(f"{best_at + 1 + n:>6}\t{cut_line(line)}" for n, line in enumerate(shown))
    return (
        f" The nearest place is line {best_at + 1}, where {best} of its {len(old)} context "
        f"and removed lines match; the file has there:\n{quoted}\n"
    )
