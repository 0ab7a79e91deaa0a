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

The parts of a content are bounded: past ``MAX_PARTS`` the oldest are folded into
their union, untagged (no cut takes back a folded part: a cut comes right after its
call, whose part is among the newest).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_PARTS = 64
_KEPT_TAGGED = MAX_PARTS // 2  # the newest parts a fold leaves as they are


@dataclass(frozen=True, slots=True)
class Part:
    """Lines ``first``–``last`` of a content shown by call ``call_id`` at ``read_at``;
    ``last`` None: the whole content."""

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
    if any(p.whole for p in parts):
        return True
    if lines <= 0 or not parts:
        return False
    if len(parts) == 1:  # the usual stamp: one read
        return parts[0].first <= 1 and (parts[0].last or 0) >= lines
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
    """The parts of two stamps of one content, each once, oldest first, bounded."""
    seen = set(old)
    parts = sorted([*old, *(p for p in new if p not in seen)], key=Part.order)
    if len(parts) <= MAX_PARTS:
        return tuple(parts)
    return _folded(parts)


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


def _folded(parts: list[Part]) -> tuple[Part, ...]:
    """The oldest parts as their union (untagged), the newest ``_KEPT_TAGGED`` as
    they are; still over MAX_PARTS, the smallest intervals go (a part forgotten
    only makes a file partly read: never the other way)."""
    old, new = parts[:-_KEPT_TAGGED], parts[-_KEPT_TAGGED:]
    at = old[-1].read_at
    if any(p.whole for p in old):
        folded = [Part(at, 1, None, "")]
    else:
        spans = intervals(old)
        if len(spans) > MAX_PARTS - _KEPT_TAGGED:
            spans = sorted(spans, key=lambda s: s[1] - s[0], reverse=True)
            spans = sorted(spans[: MAX_PARTS - _KEPT_TAGGED])
        folded = [Part(at, first, last, "") for first, last in spans]
    return tuple(sorted([*folded, *new], key=Part.order))
