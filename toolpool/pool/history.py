"""A session's checkpoints as decisions, without I/O (SPEC B1, B2, B5): which exist,
which a rewind forgets, which two a bound merges, and what that does to the marks.

A checkpoint marks, for each of the session's overlays, how many frozen layers its
stack held then (its ``depths``; an overlay made since counts 0). The session's start
is the first checkpoint; each turn's end (or ``checkpoint()``) adds one, whose layers
are the ones frozen since the one before: at most one per overlay. Past
``max_checkpoints`` the oldest but the start is merged into the next one — both
layers of an overlay squashed into one (``Merge``) — and the survivor lists the ids
it holds (``merged``): nothing is lost without saying so.

``pool/branches.py`` carries the decisions out on the layers.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

DEFAULT_MAX_CHECKPOINTS = 50
SKIPPED_KEPT = 100  # the turns' ends without a checkpoint a session's list keeps


class UnknownCheckpoint(KeyError):
    """No checkpoint of that id in this session (never one, forgotten, another's)."""

    def __init__(self, checkpoint_id: str, known: list[str]) -> None:
        shown = ", ".join(known[-5:])
        super().__init__(
            f"no checkpoint {checkpoint_id!r} in this session (its checkpoints, the latest "
            f"last: {shown}; a rewind forgets those after its target, a merge says which "
            "it folded in)"
        )
        self.message = str(self.args[0])


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint: ``turn_id`` (None for the session's start or one made on
    demand), ``time`` (seconds since the epoch), ``label``, the overlays' ``depths``
    then, the ids of older checkpoints ``merged`` into it, and how long making it took
    (``duration_ms``: its layers frozen, its sandboxes ended first)."""

    id: str
    turn_id: str | None
    time: float
    label: str | None
    depths: Mapping[str, int]
    merged: tuple[str, ...] = ()
    duration_ms: float = 0.0

    def depth(self, overlay: str) -> int:
        return self.depths.get(overlay, 0)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A turn's end that made no checkpoint: something of the session still ran
    (its background ``shells``), which could write a layer as it froze."""

    turn_id: str | None
    time: float
    shells: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Merge:
    """Merge checkpoint ``dropped`` into ``into``: for each overlay in ``squash``,
    its frozen layers ``first`` and ``first + 1`` become one."""

    dropped: str
    into: str
    squash: tuple[tuple[str, int], ...] = field(default=())


def new_id() -> str:
    """A checkpoint id: random, so that one cannot be guessed (B7)."""
    return f"cp-{secrets.token_hex(8)}"


class History:
    """A session's checkpoints, oldest first; ``limit`` of them at most once merged."""

    def __init__(self, depths: Mapping[str, int], now: float, limit: int) -> None:
        if limit < 2:
            raise ValueError(f"max_checkpoints is at least 2, not {limit}")
        self.limit = limit
        self.items = [Checkpoint(new_id(), None, now, "start", MappingProxyType(dict(depths)))]
        self.skipped: list[Skipped] = []

    @property
    def latest(self) -> Checkpoint:
        return self.items[-1]

    def add(
        self,
        depths: Mapping[str, int],
        now: float,
        turn_id: str | None,
        label: str | None,
        duration_ms: float = 0.0,
    ) -> Checkpoint:
        """A new checkpoint at the overlays' ``depths``."""
        depths = MappingProxyType(dict(depths))
        made = Checkpoint(new_id(), turn_id, now, label, depths, duration_ms=duration_ms)
        self.items.append(made)
        return made

    def took(self, duration_ms: float) -> None:
        """The latest checkpoint took ``duration_ms`` in all (its merges included)."""
        self.items[-1] = replace(self.items[-1], duration_ms=duration_ms)

    def skip(self, turn_id: str | None, now: float, shells: tuple[str, ...]) -> Skipped:
        """A turn's end with no checkpoint, and why (the latest SKIPPED_KEPT are kept:
        a dev server that runs for a thousand turns skips a thousand ends)."""
        skipped = Skipped(turn_id, now, shells)
        self.skipped.append(skipped)
        del self.skipped[:-SKIPPED_KEPT]
        return skipped

    def find(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint of that id; UnknownCheckpoint otherwise."""
        for item in self.items:
            if item.id == checkpoint_id:
                return item
        raise UnknownCheckpoint(checkpoint_id, [i.id for i in self.items])

    def rewind(self, checkpoint_id: str) -> tuple[Checkpoint, list[Checkpoint]]:
        """The target, and the checkpoints after it, which are forgotten."""
        target = self.find(checkpoint_id)
        at = self.items.index(target)
        forgotten, self.items = self.items[at + 1 :], self.items[: at + 1]
        return target, forgotten

    def merge_due(self) -> Merge | None:
        """The merge the bound asks for now (the oldest checkpoint but the start into
        the next), or None."""
        if len(self.items) <= self.limit:
            return None
        before, dropped, into = self.items[0], self.items[1], self.items[2]
        squash = []
        for name in into.depths:
            first, middle, last = before.depth(name), dropped.depth(name), into.depth(name)
            if middle - first == 1 and last - middle == 1:
                squash.append((name, first))
        return Merge(dropped.id, into.id, tuple(squash))

    def merged(self, merge: Merge) -> None:
        """``merge`` was carried out: the dropped checkpoint goes, the one it went
        into says so, and every later mark counts one layer less where two became one."""
        at = next(i for i, item in enumerate(self.items) if item.id == merge.dropped)
        dropped = self.items.pop(at)
        squashed = {name for name, _ in merge.squash}
        for i in range(at, len(self.items)):
            item = self.items[i]
            depths = {n: d - 1 if n in squashed else d for n, d in item.depths.items()}
            merged = (*dropped.merged, dropped.id, *item.merged) if i == at else item.merged
            self.items[i] = replace(item, depths=MappingProxyType(depths), merged=merged)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return (
            f"<History {len(self.items)} checkpoints (at most {self.limit}), "
            f"{len(self.skipped)} turns skipped>"
        )
