"""A session's overlays as stacks of layers (SPEC B1–B4): what checkpoints, rewinds
and forks are made of.

An ``Overlay`` is one overlay of a session (its workspace's, its root's, or one per
top-level directory of an unprivileged daemon's root): its ``base`` (what lies below
everything: the host's directory, an image's layers, /), the ``frozen`` layers above
it — upper layers frozen at checkpoints, lowest first — and its live upper layer.

    overlay.freeze(store)        # a checkpoint: the upper layer becomes frozen (if it
                                 # holds anything), a fresh one goes on top
    overlay.rewind(depth)        # back to ``depth`` frozen layers, the upper emptied
    child = overlay.branch(...)  # a fork: the same frozen layers, an upper of its own

Nothing is copied: a freeze is an unmount, a rename and a mount, whatever the tree's
size. A ``FrozenLayer`` lies on the tmpfs of the session that wrote it (its
``store``) and is shared by reference with every overlay whose stack holds it — the
session's own, its forks', their forks' — and removed when the last one lets it go;
a frozen layer is never written again (``layer_removal.py`` removes one, its files
emptied first, B13). Only an overlay nothing runs in may be frozen or rewound: the
caller ends the session's sandboxes first (an unmount that is busy fails, and so does
the freeze).
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from toolpool.sandbox.layer_removal import remove_layer

# An unmount that is busy (a process of the session still ending) is tried again for
# up to this long before the freeze or rewind is refused.
BUSY_SECONDS = 2.0
_refs = threading.Lock()  # the frozen layers' counts, changed from any branch thread


class Mounter(Protocol):
    """Where a session's overlays are mounted (``SessionLayer``): the host's
    namespaces, or a user namespace of the daemon's own (V17)."""

    def mount_overlay(
        self, target: Path, lowers: Sequence[str], upper: str, work: str, options: Sequence[str]
    ) -> None: ...

    def unmount(self, target: Path, *, lazily: bool = False) -> None: ...

    def seen(self, path: Path) -> Path: ...


class LayerStore(Protocol):
    """The tmpfs that frozen layers lie on: one session's (``SessionLayer``)."""

    def seen(self, path: Path) -> Path: ...

    def layer_made(self) -> None: ...

    def layer_gone(self) -> None: ...


class FrozenLayer:
    """An upper layer frozen at a checkpoint: ``path`` on its ``store``'s tmpfs,
    read-only from its freeze on. Counted: each overlay stack that holds it (and the
    checkpoint merges that read it) holds one count; the last ``release`` removes it."""

    __slots__ = ("_users", "path", "store")

    def __init__(self, path: Path, store: LayerStore) -> None:
        self.path = path
        self.store = store
        self._users = 1
        store.layer_made()

    def retain(self) -> FrozenLayer:
        with _refs:
            if self._users <= 0:
                raise RuntimeError(f"the frozen layer {self.path} is gone")
            self._users += 1
        return self

    def release(self) -> None:
        with _refs:
            self._users -= 1
            gone = self._users == 0
        if gone:
            remove_layer(self.store.seen(self.path))
            self.store.layer_gone()

    @property
    def users(self) -> int:
        return self._users

    def __repr__(self) -> str:
        return f"<FrozenLayer {self.path} ({self._users} users)>"


class Overlay:
    """One overlay of a session, mounted at ``merged``: ``base`` (the topmost first;
    ``own_base`` over it, what the session's own tmpfs adds to its base: apt's
    setting), under ``frozen`` (lowest first), under the live upper layer
    ``place/upper``. ``options`` are overlay's ("redirect_dir=on", or "userxattr" in
    a user namespace). Use from one thread at a time (the session's)."""

    def __init__(
        self,
        mounter: Mounter,
        place: Path,
        merged: Path,
        base: Sequence[str],
        options: Sequence[str],
        frozen: Sequence[FrozenLayer] = (),
        own_base: Sequence[str] = (),
    ) -> None:
        self.mounter = mounter
        self.place = place
        self.merged = merged
        self.base = tuple(base)
        self.own_base = tuple(own_base)
        self.options = tuple(options)
        self.frozen = list(frozen)
        self.mounted = False
        self._names = itertools.count(len(self.frozen))

    @property
    def upper(self) -> Path:
        return self.place / "upper"

    @property
    def depth(self) -> int:
        return len(self.frozen)

    def lowers(self, depth: int | None = None) -> list[str]:
        """The lower layers of a stack of ``depth`` frozen layers (all), topmost first."""
        frozen = self.frozen if depth is None else self.frozen[:depth]
        return [*(str(layer.path) for layer in reversed(frozen)), *self.own_base, *self.base]

    def mount(self) -> None:
        """Mount it (its directories made first). Raises OSError."""
        seen = self.mounter.seen
        for part in (self.upper, self.place / "work", self.merged):
            # exist_ok: a mount that failed may have left them
            seen(part).mkdir(mode=0o755, parents=True, exist_ok=True)
        self.mounter.mount_overlay(
            self.merged, self.lowers(), str(self.upper), str(self.place / "work"), self.options
        )
        self.mounted = True

    def changed(self) -> bool:
        """Whether the live upper layer holds anything (overlayfs writes nothing
        there for a read, so nothing means nothing changed since the last freeze)."""
        try:
            with os.scandir(self.mounter.seen(self.upper)) as entries:
                return any(True for _ in entries)
        except FileNotFoundError:
            return False

    def freeze(self, store: LayerStore) -> bool:
        """A checkpoint: the upper layer, if it holds anything, becomes the topmost
        frozen layer (a rename) and a fresh one is mounted over it; True when it
        did. Raises OSError (the overlay busy: nothing changed)."""
        if not self.changed():
            return False
        self._unmount()
        seen = self.mounter.seen
        name = self.place / f"f{next(self._names)}"
        try:
            seen(self.upper).rename(seen(name))
            self.frozen.append(FrozenLayer(name, store))
            seen(self.upper).mkdir(mode=0o755)
        finally:
            self.mount()
        return True

    def rewind(self, depth: int) -> None:
        """Back to the stack of the first ``depth`` frozen layers: the upper layer
        emptied, the frozen layers above let go. Raises OSError."""
        if depth > len(self.frozen):
            raise ValueError(f"{self.merged} has {len(self.frozen)} frozen layers, not {depth}")
        if depth == len(self.frozen) and not self.changed():
            return
        if self.mounted:
            self._unmount()
        seen = self.mounter.seen
        discarded = self.place / f"discarded-{next(self._names)}"
        try:
            if seen(self.upper).exists():
                seen(self.upper).rename(seen(discarded))
            dropped, self.frozen = self.frozen[depth:], self.frozen[:depth]
            for layer in dropped:
                layer.release()
            seen(self.upper).mkdir(mode=0o755)
        finally:
            self.mount()
        remove_layer(seen(discarded))

    def replace(self, first: int, last: int, merged: FrozenLayer) -> None:
        """The frozen layers ``first`` to ``last`` (inclusive) give way to ``merged``,
        which holds what they held (a checkpoint merge): remounted over the new
        stack, the old layers let go. Raises OSError."""
        if self.mounted:
            self._unmount()
        dropped = self.frozen[first : last + 1]
        self.frozen[first : last + 1] = [merged]
        try:
            for layer in dropped:
                layer.release()
        finally:
            self.mount()

    def branch(
        self, mounter: Mounter, place: Path, merged: Path, depth: int, own_base: Sequence[str]
    ) -> Overlay:
        """A fork's overlay: the same base (``own_base`` its own), the first ``depth``
        frozen layers (shared, counted), an upper layer of its own at ``place``; not
        mounted yet."""
        frozen = [layer.retain() for layer in self.frozen[:depth]]
        return Overlay(mounter, place, merged, self.base, self.options, frozen, own_base)

    def view_options(self) -> list[str]:
        """The options of a read-only view of this stack (no upper layer)."""
        return [o if o != "redirect_dir=on" else "redirect_dir=follow" for o in self.options]

    def close(self) -> None:
        """Unmount it (lazily: a process still inside keeps its view until it ends)
        and let its frozen layers go. Idempotent."""
        if self.mounted:
            self.mounted = False
            try:
                self.mounter.unmount(self.merged, lazily=True)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT):
                    raise
        frozen, self.frozen = self.frozen, []
        for layer in frozen:
            layer.release()

    def _unmount(self) -> None:
        """Unmount it; one that stays busy (past BUSY_SECONDS) is an OSError."""
        deadline = time.monotonic() + BUSY_SECONDS
        while True:
            try:
                self.mounter.unmount(self.merged)
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise OSError(
                        exc.errno, f"{self.merged} is in use (a process of the session runs)"
                    ) from None
                time.sleep(0.01)
        self.mounted = False

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "not mounted"
        return f"<Overlay {self.merged} {state}, {len(self.frozen)} frozen layers>"
