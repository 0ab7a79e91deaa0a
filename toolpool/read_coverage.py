"""Which lines of one content of a file the session was shown (SPEC F2, F13).

A stamp of the file-read register (``file_reads.py``) holds, for the content it
names (its hash), the *parts* that reads showed of it: lines ``first``–``last`` of a
text read (1-based, inclusive, numbered as ``read`` numbers them), or the whole
content (``last`` None: an image, a notebook, a write whose content the model wrote).
Parts of one content add up, over as many reads as it takes: lines 1–1800 and
1801–3400 of a 3,400-line file are the whole file, as one read of it is. A read of
another content (the file changed between them) starts over.

Each part keeps the call that showed it and when, because a part can be taken back:
a read whose result the turn's output budget cut (SPEC L4) showed fewer lines than
it recorded, and only that call's part shrinks — another read's lines stay shown.

Once a turn has ended no cut can come for its calls, and the register *settles*
(``settled``): the parts of each content it touched become their union, untagged. A
file read whole every turn keeps one part, not one a turn. Within one turn the parts
of a content are bounded too (``MAX_PARTS``): past it, the tagged parts that show
fewest lines are dropped, which can only make a file partly read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

MAX_PARTS = 64


class Part(NamedTuple):
    """Lines ``first``–``last`` of a content shown by call ``call_id`` at ``read_at``;
    ``last`` None: the whole content. (A tuple: made, compared and hashed on every
    read's way, as cheaply as Python makes anything.)"""

    read_at: float
    first: int
    last: int | None
    call_id: str

    @property
    def whole(self) -> bool:
        return self.last is None

    def order(self) -> tuple[float, int, int, str]:
        """Oldest first (then by line): how a stamp's parts are kept."""
        return (self.read_at, self.first, -1 if self.last is None else self.last, self.call_id)

    def to_list(self) -> list[Any]:
        return [self.first, self.last, self.call_id, self.read_at]

    @classmethod
    def from_list(cls, data: Sequence[Any]) -> Part:
        first, last, call_id, read_at = data
        return cls(float(read_at), int(first), None if last is None else int(last), str(call_id))


def intervals(parts: Iterable[Part]) -> list[tuple[int, int]]:
    """The line intervals the parts of lines show, merged, in order (whole parts aside)."""
    spans = sorted((p.first, p.last) for p in parts if p.last is not None and p.last >= p.first)
    merged: list[tuple[int, int]] = []
    for first, last in spans:
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def covers(parts: Sequence[Part], lines: int) -> bool:
    """Whether ``parts`` show the whole content, of ``lines`` lines (0: not counted)."""
    if len(parts) == 1:  # the usual stamp: one read (every stamp is made through here)
        last = parts[0].last
        return last is None or (lines > 0 and parts[0].first <= 1 and last >= lines)
    for part in parts:  # one part that shows it all: the usual stamp of a file read whole
        last = part.last
        if last is None or (lines > 0 and part.first <= 1 and last >= lines):
            return True
    if lines <= 0 or not parts:
        return False
    if len(parts) == 2:  # what the held parts and one more read make: no sort needed
        a, b = parts if parts[0].first <= parts[1].first else (parts[1], parts[0])
        a_last, b_last = a.last or 0, b.last or 0  # never None here: no whole part
        return a.first <= 1 and b.first <= a_last + 1 and max(a_last, b_last) >= lines
    merged = intervals(parts)
    return merged[0][0] <= 1 and merged[0][1] >= lines


def missing(parts: Sequence[Part], lines: int) -> list[tuple[int, int]]:
    """The line intervals of a content of ``lines`` lines that ``parts`` do not show."""
    if covers(parts, lines) or lines <= 0:
        return []
    gaps: list[tuple[int, int]] = []
    at = 1
    for first, last in intervals(parts):
        if first > at:
            gaps.append((at, min(first - 1, lines)))
        at = max(at, last + 1)
        if at > lines:
            break
    if at <= lines:
        gaps.append((at, lines))
    return gaps


def combined(old: Sequence[Part], new: Sequence[Part]) -> tuple[Part, ...]:
    """The parts of two stamps of one content, each once, oldest first, bounded: past
    ``MAX_PARTS`` the settled parts are joined into their union (exact: no cut takes
    them back), then the tagged parts that show fewest lines are dropped (a part
    forgotten only makes a file partly read: never the other way)."""
    if len(new) > len(old) and tuple(new[: len(old)]) == tuple(old) and len(new) <= MAX_PARTS:
        return tuple(new)  # what a worker sends back: the parts it was given, and its own
    if len(new) == 1:  # one read's part: the usual merge
        part = new[0]
        if part in old:  # applied twice (a worker's, then the session's)
            return tuple(old)
        if len(old) < MAX_PARTS and (not old or old[-1].order() <= part.order()):
            return (*old, part)
    seen = set(old)
    parts = sorted([*old, *(p for p in new if p not in seen)], key=Part.order)
    if len(parts) <= MAX_PARTS:
        return tuple(parts)
    tagged = [p for p in parts if p.call_id]
    parts = [*settled([p for p in parts if not p.call_id]), *tagged]
    if len(parts) > MAX_PARTS:
        drop = sorted(tagged, key=_shown_lines)[: len(parts) - MAX_PARTS]
        parts = [p for p in parts if p not in drop]
    return tuple(sorted(parts, key=Part.order))


def settled(parts: Sequence[Part]) -> tuple[Part, ...]:
    """``parts`` as their union, untagged: what they show once no cut can take any of
    them back (their calls have ended: the register settles at each turn's end)."""
    if len(parts) == 1:
        part = parts[0]
        return (Part(part.read_at, part.first, part.last, ""),)
    if not parts:
        return ()
    at = max(p.read_at for p in parts)
    if any(p.whole for p in parts):
        return (Part(at, 1, None, ""),)
    return tuple(Part(at, first, last, "") for first, last in intervals(parts))


def narrowed(
    parts: Sequence[Part], call_id: str, since: float, kept: tuple[int, int] | None
) -> tuple[tuple[Part, ...], bool]:
    """``parts`` with those of ``call_id`` recorded at or after ``since`` cut to the
    lines ``kept`` (None: taken back whole), and whether any was."""
    out: list[Part] = []
    changed = False
    for part in parts:
        if part.call_id != call_id or part.read_at < since or not call_id:
            out.append(part)
            continue
        changed = True
        if kept is None or part.last is None:
            continue  # a whole part cut, or no line kept: nothing of it was shown
        first, last = max(part.first, kept[0]), min(part.last, kept[1])
        if first <= last:
            out.append(Part(part.read_at, first, last, part.call_id))
    return tuple(out), changed


def _shown_lines(part: Part) -> float:
    return float("inf") if part.last is None else part.last - part.first + 1
