"""Checkpoints, rewinds and forks of the sessions' layers (SPEC B1–B7): the decisions
of ``history.History`` carried out on ``SessionLayer``s, between turns.

    branches.opened(session_id, workspace, max_checkpoints)     # its start: checkpoint 0
    await branches.checkpoint(session_id, turn_id=..., label=None)
    await branches.rewind(session_id, checkpoint_id)
    await branches.fork(parent_id, [child contexts], at=None)

Layers change only while nothing of the session runs: the daemon asks between turns
(its queue of turns waits for these), background shells make a turn's end skip its
checkpoint (a rewind ends them), and the session's sandboxes are ended first and
started again after (off the event loop, before the next command asks: their /tmp is
kept). A checkpoint of a session whose layers hold nothing new touches no mount. The
work on layers runs in threads of its own, one session's at a time (its layer lock).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from toolpool.changes import BaseMarks
from toolpool.pool.history import Checkpoint, History, Merge, Skipped
from toolpool.pool.shells import ShellSupervisor
from toolpool.protocol import CallContext
from toolpool.sandbox.layer_merge import squash
from toolpool.sandbox.layers import SessionLayer

log = logging.getLogger("toolpool.pool")

T = TypeVar("T")
# The host directory's ctime marks are taken this long before the session's start: a
# change the host made just before it counts as one made after (the safe side, B10).
BASE_SLACK_NS = 50_000_000
PATHS_SHOWN = 1000  # paths listed per checkpoint; past it, ``paths_truncated``


class BranchRefused(Exception):
    """A request about a session's branches refused; the message says why."""


@dataclass(frozen=True, slots=True)
class Rewound:
    """A rewind's outcome: its ``target``, the checkpoints it ``forgot`` and the
    background ``shells`` it stopped."""

    target: Checkpoint
    forgot: tuple[str, ...]
    shells: tuple[str, ...]


@dataclass(slots=True)
class _Branch:
    """What the pool keeps of one session for its branches."""

    history: History
    workspace: Path
    marks: BaseMarks
    forked_from: str | None = None


class Branches:
    """Every layered session's checkpoints; its layers are its sandboxes' (``shells``
    ends its background shells, ``shells.sandboxes`` holds its layers)."""

    def __init__(self, shells: ShellSupervisor) -> None:
        self._shells = shells
        self._sandboxes = shells.sandboxes
        self._sessions: dict[str, _Branch] = {}
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="toolpool-branches")

    # -- sessions ------------------------------------------------------------------

    def opened(
        self,
        session_id: str,
        workspace: Path,
        max_checkpoints: int,
        *,
        parent: str | None = None,
        depths: dict[str, int] | None = None,
    ) -> None:
        """A layered session began (its start is checkpoint 0); a fork's marks of the
        host directory are its parent's."""
        marks = (
            BaseMarks(time.time_ns() - BASE_SLACK_NS)
            if parent is None
            else self.branch(parent).marks.copy()
        )
        history = History(depths or {}, time.time(), max_checkpoints)
        self._sessions[session_id] = _Branch(history, workspace, marks, parent)

    def closed(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def tracks(self, session_id: str) -> bool:
        return session_id in self._sessions

    def history(self, session_id: str) -> History:
        return self.branch(session_id).history

    def forked_from(self, session_id: str) -> str | None:
        branch = self._sessions.get(session_id)
        return None if branch is None else branch.forked_from

    def branch(self, session_id: str) -> _Branch:
        branch = self._sessions.get(session_id)
        if branch is None:
            raise BranchRefused(
                'this session has no checkpoints: they need workspace_mode = "overlay" '
                "and the daemon's worker pool"
            )
        return branch

    async def run(self, session_id: str, work: Callable[[], T]) -> T:
        """``work`` in a branch thread, holding the session's layer lock."""

        def locked() -> T:
            with self._sandboxes.layers.lock(session_id):
                return work()

        return await asyncio.get_running_loop().run_in_executor(self._threads, locked)

    # -- checkpoints -------------------------------------------------------------------

    async def checkpoint(
        self, session_id: str, *, turn_id: str | None, label: str | None, demand: bool = False
    ) -> Checkpoint | Skipped:
        """A checkpoint of the session's layers now: the turn's end (``turn_id``) or
        one asked for (``demand``, refused while a background shell runs; a turn's end
        then is skipped, and says which shells ran)."""
        history = self.history(session_id)
        running = tuple(s.id for s in self._shells.running(session_id))
        if running:
            if demand:
                raise BranchRefused(
                    f"background shells of the session run ({', '.join(running)}): a "
                    "checkpoint freezes only layers no process can write; stop them first"
                )
            return history.skip(turn_id, time.time(), running)
        layer = self._sandboxes.layers.get(session_id)
        stopped = None
        began = time.perf_counter()
        try:
            if layer is not None and await self.run(session_id, layer.changed):
                stopped = await self._sandboxes.stop_sandboxes(session_id)
                await self.run(session_id, layer.freeze)
            history.add({} if layer is None else layer.depths(), time.time(), turn_id, label)
            while (merge := history.merge_due()) is not None:
                if merge.squash:
                    assert layer is not None
                    if stopped is None:
                        stopped = await self._sandboxes.stop_sandboxes(session_id)
                    squash = functools.partial(_squash, layer, merge, session_id)
                    merge = await self.run(session_id, squash)
                history.merged(merge)
        finally:
            if stopped:
                self._sandboxes.restart(stopped)
        history.took((time.perf_counter() - began) * 1000)
        return history.latest

    async def rewind(self, session_id: str, checkpoint_id: str) -> Rewound:
        """Workspace and root as they were at ``checkpoint_id``; later checkpoints
        forgotten, background shells ended (they saw a state that is gone)."""
        history = self.history(session_id)
        target = history.find(checkpoint_id)
        shells = await self._shells.stop(session_id, "the session was rewound")
        layer = self._sandboxes.layers.get(session_id)
        if layer is not None:
            stopped = await self._sandboxes.stop_sandboxes(session_id)
            try:
                await self.run(session_id, functools.partial(layer.rewind, target.depths))
            finally:
                self._sandboxes.restart(stopped)
        _, forgotten = history.rewind(checkpoint_id)
        return Rewound(target, tuple(c.id for c in forgotten), tuple(shells))

    async def fork(
        self, parent_id: str, children: Sequence[CallContext], at: str | None, limit: int
    ) -> Checkpoint:
        """Layers for each of ``children`` (forks of ``parent_id``) stacked on the
        parent's at ``at`` (a checkpoint id; now by default, which is a checkpoint:
        refused while a background shell of the parent runs); the checkpoint used."""
        history = self.history(parent_id)
        if at is None:
            running = [s.id for s in self._shells.running(parent_id)]
            if running:
                raise BranchRefused(
                    f"background shells of the session run ({', '.join(running)}), and a "
                    "fork of now freezes its layers: stop them, or fork at a checkpoint"
                )
            point = history.latest
            layer = self._sandboxes.layers.get(parent_id)
            if layer is not None and await self.run(parent_id, layer.changed):
                made = await self.checkpoint(parent_id, turn_id=None, label="fork")
                assert isinstance(made, Checkpoint)
                point = made
        else:
            point = history.find(at)
        workspace = self.branch(parent_id).workspace
        loop = asyncio.get_running_loop()
        layers = self._sandboxes.layers
        # A parent without layers yet (nothing ran) gives its forks nothing to stack.
        directory = None if layers.get(parent_id) is None else self._sandboxes.layers_directory()
        for child in children:
            made_layer = None
            if directory is not None:
                made_layer = await loop.run_in_executor(
                    self._threads, layers.forked, child, parent_id, point.depths, directory
                )
            depths = {} if made_layer is None else made_layer.depths()
            self.opened(child.session_id, workspace, limit, parent=parent_id, depths=depths)
        return point

    async def listing(self, session_id: str) -> dict[str, Any]:
        """The checkpoints, oldest first, each with the paths its layers changed, and
        the turns' ends that made none."""
        branch = self.branch(session_id)
        layer = self._sandboxes.layers.get(session_id)
        history = branch.history
        items = list(history.items)

        def paths() -> list[tuple[list[str], bool]]:
            found: list[tuple[list[str], bool]] = [([], False)]
            for before, item in itertools.pairwise(items):
                found.append(_changed_paths(layer, branch.workspace, before, item))
            return found

        listed = await self.run(session_id, paths)
        return {
            "checkpoints": [
                {
                    "id": item.id,
                    "turn_id": item.turn_id,
                    "time": item.time,
                    "label": item.label,
                    "paths": shown,
                    "paths_truncated": cut,
                    "merged": list(item.merged),
                    "duration_ms": round(item.duration_ms, 3),
                }
                for item, (shown, cut) in zip(items, listed, strict=True)
            ],
            "skipped": [
                {"turn_id": s.turn_id, "time": s.time, "shells": list(s.shells)}
                for s in history.skipped
            ],
            "max_checkpoints": history.limit,
        }

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        self._sessions.clear()


def _squash(layer: SessionLayer, merge: Merge, session_id: str) -> Merge:
    """The layers ``merge`` squashes, squashed and swapped in (nothing runs); the
    merge as it was carried out. Two layers that cannot be squashed (their tmpfs
    too full for the copy) stay apart: the checkpoint is merged all the same, its
    overlay stacking one layer more."""
    done = []
    for name, first in merge.squash:
        overlay = layer.overlays[name]
        try:
            merged = squash(overlay, first, layer, f"m{secrets.token_hex(4)}")
        except OSError as exc:
            log.warning(
                "two layers of %s stay apart in the merge of checkpoint %s: %s",
                name,
                merge.dropped,
                exc,
                extra={"session": session_id},
            )
            continue
        overlay.replace(first, first + 1, merged)
        done.append((name, first))
    return Merge(merge.dropped, merge.into, tuple(done))


def _changed_paths(
    layer: SessionLayer | None, workspace: Path, before: Checkpoint, item: Checkpoint
) -> tuple[list[str], bool]:
    """The paths the layers frozen at ``item`` (since ``before``) hold, as the session
    names them (the workspace's, the root's absolute), at most PATHS_SHOWN."""
    if layer is None:
        return [], False
    found: list[str] = []
    for name, overlay in layer.overlays.items():
        first, last = before.depth(name), item.depth(name)
        if last <= first or last > len(overlay.frozen):
            continue
        prefix = str(workspace) if name == "w" else "/" + name.removeprefix("root").strip("/")
        for frozen in overlay.frozen[first:last]:
            top = layer.seen(frozen.path)
            for directory, dirs, files in os.walk(top):
                dirs.sort()
                for entry in sorted(files) + [
                    d for d in dirs if os.path.islink(Path(directory, d))
                ]:
                    relative = os.path.relpath(os.path.join(directory, entry), top)
                    found.append(os.path.join(prefix, relative))
                    if len(found) >= PATHS_SHOWN:
                        return found, True
    return found, False
