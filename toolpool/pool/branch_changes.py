"""A layered session's workspace changes, out (SPEC B8–B10): listed, as a git-format
patch, exported, committed to the host directory it came from.

The trees compared are the session's workspace overlay now and what it started from
— the host directory (a fork's first ancestor's; forks share it) — or, ``since`` a
checkpoint, a read-only view of the overlay's layers then. The paths compared are
those of the layers in between (``changes.touched``): the cost follows what changed,
not the tree. Between turns only (the daemon's queue sees to it), in a branch thread
holding the session's layer lock.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from toolpool.changes import (
    BaseMarks,
    Change,
    Tree,
    candidates,
    commit,
    compare,
    export,
    git_patch,
    touched,
)
from toolpool.pool.branches import Branches, BranchRefused
from toolpool.pool.environments import SessionSandboxes
from toolpool.sandbox.layer_stack import Overlay
from toolpool.sandbox.layers import SessionLayer
from toolpool.sandbox.policy import is_under


class WorkspaceChanges:
    """The changes of the sessions ``branches`` keeps, out of ``sandboxes``' layers."""

    def __init__(self, branches: Branches, sandboxes: SessionSandboxes) -> None:
        self._branches = branches
        self._sandboxes = sandboxes

    async def changes(self, session_id: str, since: str | None) -> list[dict[str, Any]]:
        """The paths that differ, each ``Change.to_dict()``."""

        def work() -> list[dict[str, Any]]:
            with self._compared(session_id, since) as (_, _, found):
                return [change.to_dict() for change in found]

        return await self._branches.run(session_id, work)

    async def diff(self, session_id: str, since: str | None, max_chars: int) -> str:
        """The changes as a git-format patch (PatchTooLarge past ``max_chars``)."""

        def work() -> str:
            with self._compared(session_id, since) as (old, new, found):
                return git_patch(old, new, found, max_chars)

        return await self._branches.run(session_id, work)

    async def export(self, session_id: str, destination: str) -> int:
        """The workspace as the session sees it, written to ``destination`` (a new
        directory, or a tarball: ``.tar``, ``.tar.gz``, ``.tgz``); how many entries."""
        target = self._destination(destination)

        def work() -> int:
            with self._trees(session_id, None) as (_, new, _):
                return export(new, target)

        return await self._branches.run(session_id, work)

    async def commit(self, session_id: str) -> list[str]:
        """The workspace's changes applied to the host directory (CommitConflict,
        nothing written, when the host changed one of their paths since)."""
        branch = self._branches.branch(session_id)

        def work() -> list[str]:
            with self._compared(session_id, None) as (_, new, found):
                if not found:
                    return []
                layer = self._sandboxes.layers.get(session_id)
                assert layer is not None
                overlay = layer.overlays["w"]
                return commit(
                    new, branch.workspace, found, branch.marks, _from_base(layer, overlay)
                )

        return await self._branches.run(session_id, work)

    def _destination(self, destination: str) -> Path:
        target = Path(destination)
        if not target.is_absolute():
            raise BranchRefused(f"export to {destination!r}: the path must be absolute")
        parent = Path(os.path.realpath(target.parent))
        if not parent.is_dir():
            raise BranchRefused(f"export to {destination!r}: {target.parent} is not a directory")
        target = parent / target.name
        if os.path.lexists(target):
            raise BranchRefused(f"export to {destination!r}: it exists (nothing is overwritten)")
        for denied in [*self._sandboxes.layers.denied(), self._sandboxes.runtime_dir]:
            if is_under(str(target), str(denied)) or is_under(str(denied), str(target)):
                raise BranchRefused(f"export to {destination!r}: the daemon writes nothing there")
        return target

    @contextlib.contextmanager
    def _compared(
        self, session_id: str, since: str | None
    ) -> Iterator[tuple[Tree, Tree, list[Change]]]:
        with self._trees(session_id, since) as (old, new, layers):
            namespace = "user" if os.geteuid() != 0 else "trusted"
            paths, subtrees = touched(layers, namespace)
            yield old, new, compare(old, new, candidates(old, new, paths, subtrees))

    @contextlib.contextmanager
    def _trees(self, session_id: str, since: str | None) -> Iterator[tuple[Tree, Tree, list[Path]]]:
        """The tree the session started from (or was at ``since``), the tree it is,
        and the layers in between (seen from here)."""
        branch = self._branches.branch(session_id)
        depth = 0 if since is None else branch.history.find(since).depth("w")
        layer = self._sandboxes.layers.get(session_id)
        overlay = None if layer is None else layer.overlays.get("w")
        if layer is None or overlay is None or layer.workspace_view is None:
            with Tree(branch.workspace) as old, Tree(branch.workspace) as new:
                yield old, new, []  # no overlay yet: nothing written
            return
        layers = [layer.seen(f.path) for f in overlay.frozen[depth:]]
        layers.append(layer.seen(overlay.upper))
        with (
            _view_at(layer, overlay, depth, branch.workspace) as then,
            Tree(then) as old,
            Tree(layer.workspace_view) as new,
        ):
            yield old, new, layers


@contextlib.contextmanager
def _view_at(layer: SessionLayer, overlay: Overlay, depth: int, workspace: Path) -> Iterator[Path]:
    """The workspace as it was with ``depth`` frozen layers: the host directory for
    none, else a read-only overlay of them, mounted for the block."""
    if depth == 0:
        yield workspace
        return
    point = overlay.place / f"at-{secrets.token_hex(4)}"
    layer.seen(point).mkdir(mode=0o700)
    try:
        layer.mount_overlay(point, overlay.lowers(depth), "", "", overlay.view_options())
        try:
            yield layer.seen(point)
        finally:
            layer.unmount(point, lazily=True)
    finally:
        shutil.rmtree(layer.seen(point), ignore_errors=True)


def _from_base(layer: SessionLayer, overlay: Overlay) -> Callable[[str], bool]:
    """Whether the session found ``path`` in the host directory: the first of its
    layers (lowest first) that holds it copied it up (overlayfs's ``origin``)."""
    origin = f"{'user' if 'userxattr' in overlay.options else 'trusted'}.overlay.origin"
    places = [layer.seen(f.path) for f in overlay.frozen] + [layer.seen(overlay.upper)]

    def found(path: str) -> bool:
        for place in places:
            with Tree(place) as tree:
                if tree.stat(path) is not None:
                    return tree.xattr(path, origin) is not None
        return False

    return found


__all__ = ["BaseMarks", "WorkspaceChanges"]
