"""The sessions' layers and images (SPEC V12–V17, B3): made in the sandboxes' start
threads and the branches' threads, one session at a time (its lock: an image's first
unpack holds its session's, not every session's), kept until the session closes.

``SessionSandboxes`` (environments.py) asks for them when a sandbox or a file tool
needs them; ``Branches`` (branches.py) freezes, rewinds and forks them.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from toolpool.images import ImageCache, ImageError, PreparedImage
from toolpool.images.access import admit
from toolpool.pool.processes import WorkerProcesses
from toolpool.protocol import CallContext
from toolpool.sandbox.layers import Inherit, SessionLayer
from toolpool.sandbox.session_box import SandboxStartError
from toolpool.session_options import Root

log = logging.getLogger("toolpool.pool")


class SessionLayers:
    """Every session's writable layers and its image's lease, by session id."""

    def __init__(self, processes: WorkerProcesses) -> None:
        self._processes = processes  # its config and policy
        self._layers: dict[str, SessionLayer] = {}  # the sessions' writable layers (V12–V14)
        self._images: dict[str, PreparedImage] = {}  # their images, leased (V13)
        self._image_cache: ImageCache | None = None  # made on the first image root
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._names = itertools.count(1)

    def get(self, session_id: str) -> SessionLayer | None:
        """The session's layers, once made."""
        return self._layers.get(session_id)

    def image(self, session_id: str) -> PreparedImage | None:
        return self._images.get(session_id)

    def lock(self, session_id: str) -> threading.Lock:
        """What a thread holds while it makes or changes the session's layers."""
        with self._locks_lock:
            return self._locks.setdefault(session_id, threading.Lock())

    def made(self, context: CallContext, directory: Path) -> SessionLayer:
        """The session's writable layers, with what its options ask mounted: one
        tmpfs for all its sandboxes (in a thread). Raises SandboxStartError."""
        with self.lock(context.session_id):
            layer = self._layers.get(context.session_id)
            if layer is None:
                size = context.layer_bytes or self._processes.config.layer_bytes
                layer = SessionLayer.make(directory / f"{next(self._names):x}.l", size)
                self._layers[context.session_id] = layer
            self._mount(context, layer)
            return layer

    def forked(
        self, context: CallContext, parent: str, depths: Mapping[str, int], directory: Path
    ) -> SessionLayer | None:
        """Layers for the fork of ``context`` (in a thread): a tmpfs of its own, in
        its parent's namespace, each overlay the parent had at the checkpoint of
        ``depths`` stacked on the parent's frozen layers then, its image leased again;
        None when the parent has no layers yet. Raises SandboxStartError."""
        of = self._layers.get(parent)
        if of is None:
            return None
        size = context.layer_bytes or self._processes.config.layer_bytes
        name = directory / f"{next(self._names):x}.l"
        with self.lock(context.session_id):
            layer = SessionLayer.make(name, size, of.space)
            self._layers[context.session_id] = layer
            image = self._images.get(parent)
            if image is not None:
                self._images[context.session_id] = image.shared()
            with self.lock(parent):
                self._mount(context, layer, of.inherit(depths))
        return layer

    def _mount(
        self, context: CallContext, layer: SessionLayer, inherit: Inherit | None = None
    ) -> None:
        """What the session's options ask mounted on ``layer`` (a fork's stacked on
        its parent's frozen layers, ``inherit``)."""
        if context.root == Root.OVERLAY:
            layer.mount_root(inherit=inherit)
        elif context.root == "image" and layer.root_merged is None:
            image = self._images.get(context.session_id) or self._prepare(context)
            lowers = tuple(reversed(image.layers))  # the topmost first
            layer.mount_root(lowers, userxattr=image.xattr == "user", inherit=inherit)
        if context.workspace_overlay:
            layer.mount_workspace(Path(os.path.realpath(context.workspace)), inherit)

    def _prepare(self, context: CallContext) -> PreparedImage:
        """The session's image, its layers unpacked into the cache (or found there)
        and leased for as long as the session lives."""
        config = self._processes.config
        try:
            with self._locks_lock:  # one cache, made by the first session that needs it
                if self._image_cache is None:
                    self._image_cache = ImageCache(config.image_cache, config.image_cache_bytes)
                    self._image_cache.remove_stale()  # what crashed unpacks left
                cache = self._image_cache
            image = cache.prepare(
                Path(context.image), allowed_dirs=config.image_dirs, denied=self.denied()
            )
        except ImageError as exc:
            raise SandboxStartError(f"its image could not be used: {exc}") from exc
        self._images[context.session_id] = image
        return image

    def admit_image(self, image: str) -> None:
        """Refuse (ImageError) an image this pool would not use: images off (no
        ``image_dirs``), outside them, or at a denied path. Cheap: no unpack."""
        admit(Path(image), self._processes.config.image_dirs, self.denied())

    def denied(self) -> list[Path]:
        """What an image may not be, hold or lie in, and where an export goes nowhere
        near (B9): what confined code may not see (deny_read, the runtime dir, the key
        files)."""
        return [Path(p) for p in self._processes.policy.hidden]

    def end(self, session_id: str) -> None:
        """The session closed (its sandboxes have ended): its layers go, where no fork
        stacks them (in a thread), and its image's lease. Raises OSError."""
        self._locks.pop(session_id, None)
        layer = self._layers.pop(session_id, None)
        image = self._images.pop(session_id, None)
        try:
            if layer is not None:
                layer.remove()
        finally:
            if image is not None:
                image.release()  # its layers may be evicted now

    def end_all(self) -> None:
        """Every session's layers and leases go (in a thread: the pool closes)."""
        for session_id in list(self._layers.keys() | self._images.keys()):
            try:
                self.end(session_id)
            except OSError as exc:
                log.error("the layer of session %s stays: %s", session_id, exc)
