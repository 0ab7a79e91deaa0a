"""The sessions' sandboxes (SPEC V1): one per session, started when its first command
needs it, ended when the session closes; a command is then started inside it
(toolpool.sandbox.spawn) instead of in a sandbox of its own.

A worker asks for its call's session (``ShellRequest`` of action ``environment``,
answered with the sandbox's socket) and starts its command there itself, joined to
its own cgroups and with its own rlimits, as it would have started a child. The pool
owns the sandboxes: a worker that is recycled or lost changes nothing, and any
worker runs any command of the session in the same one.

A session whose calls differ in network (a tool's limits may allow it where the
session does not) has one sandbox for each. Starting one takes a few milliseconds
(tens with pasta): it runs in a thread of its own, never on the event loop, one
start per session at a time (a second request waits for the first's). A start that
fails is the call's ``sandbox_failed`` error; the next request tries again.

Sockets live in ``<runtime dir>/s``, which no command sees (X2); a dead
daemon's sandboxes die with it (their helper holds a pipe from this process) and
its sockets are removed with the runtime dir, or at the next start.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpool.images import ImageCache, ImageError, PreparedImage
from toolpool.images.access import admit
from toolpool.pool.processes import WorkerProcesses
from toolpool.protocol import CallContext
from toolpool.sandbox import linux
from toolpool.sandbox.layers import Inherit, SessionLayer, remove_layers
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.mounts import HOST_ROOT
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.session_box import SandboxStartError, SessionSandbox
from toolpool.session_options import Root

log = logging.getLogger("toolpool.pool")

Key = tuple[str, bool]  # session id, network allowed


@dataclass(slots=True)
class _Entry:
    """One session sandbox: starting (``ready`` pending), running, or failed; what
    it was started for (its start again after a checkpoint, B1)."""

    ready: asyncio.Future[SessionSandbox]
    network: bool
    context: CallContext
    limits: Limits


class SessionSandboxes:
    """Every session's sandbox, by session and network."""

    def __init__(self, processes: WorkerProcesses) -> None:
        self._processes = processes  # its runtime dir, sandbox profile and policy, once open
        self._entries: dict[Key, _Entry] = {}
        self._layers: dict[str, SessionLayer] = {}  # the sessions' writable layers (V12–V14)
        self._images: dict[str, PreparedImage] = {}  # their images, leased (V13)
        self._image_cache: ImageCache | None = None  # made on the first image root
        # Layers are made in the start threads, one session at a time: an image's first
        # unpack holds its session's lock, not every session's.
        self._layer_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="toolpool-sandboxes")
        self._directory: Path | None = None
        self._profile = SandboxProfile.nothing()
        self._policy: Policy | None = None
        self._open = False
        self._opened = False
        self._closed = False
        self._names = itertools.count(1)
        self._holders: frozenset[int] = frozenset()  # read from the ZAP thread (confines)

    def _open_once(self) -> None:
        """On the first request (the pool is open by then): sockets and layers go under
        its runtime dir; offered where the profile has the "session" mechanism."""
        if self._opened:
            return
        self._opened = True
        processes = self._processes
        directory = processes.runtime_dir / "s"  # short: a socket's path fits in 108 bytes
        remove_layers(directory)  # a dead daemon's sockets and layers
        directory.mkdir(mode=0o700)
        self._directory = directory
        self._profile, self._policy = processes.profile, processes.policy
        self._open = not self._closed and processes.profile.active("session")

    async def socket(self, context: CallContext, limits: Limits) -> tuple[str, str]:
        """The socket of the sandbox the call's command starts in, started first if
        the session has none yet, and the mount point of its root's layer (empty
        without one); empty both where there are no sandboxes (commands then get a
        sandbox each). Raises SandboxStartError."""
        self._open_once()
        if not self._open:
            return "", ""
        socket = str(await self._socket_for(context, limits))
        layer = self._layers.get(context.session_id)
        return socket, "" if layer is None else str(layer.seen(layer.directory))

    async def address(self, context: CallContext, limits: Limits) -> dict[str, Any]:
        """A ``ShellReply``'s fields for the call's sandbox: its socket and its
        layer's mount point (``socket``), and the base an image gives (``base_of``)."""
        socket, layer = await self.socket(context, limits)
        env, working_dir = self.base_of(context.session_id)
        return {"socket": socket, "layer": layer, "env": env, "working_dir": working_dir}

    async def _socket_for(self, context: CallContext, limits: Limits) -> Path:
        network = limits.network or context.allow_network
        key = (context.session_id, network)
        entry = self._entries.get(key)
        if entry is not None and entry.ready.done():
            failed = entry.ready.exception() is not None
            if failed or not entry.ready.result().alive():
                self._entries.pop(key)
                if not failed:
                    self._in_thread_close(entry.ready.result())
                entry = None
        if entry is None:
            entry = _Entry(asyncio.get_running_loop().create_future(), network, context, limits)
            self._entries[key] = entry
            self._start(entry, context, limits)
        try:
            sandbox = await asyncio.shield(entry.ready)
        except SandboxStartError as exc:
            if self._entries.get(key) is entry:
                self._entries.pop(key)
            raise exc from None
        return sandbox.socket_path

    def _start(self, entry: _Entry, context: CallContext, limits: Limits) -> None:
        assert self._directory is not None and self._policy is not None
        roots = [Path(context.workspace), *(Path(p) for p in context.extra_roots)]
        directory, profile, policy = self._directory, self._profile, self._policy

        def start() -> SessionSandbox:
            root, views, enter = self._placed(context, directory, limits.tmp_bytes)
            return SessionSandbox.start(
                roots=roots,
                network=entry.network,
                tmp_bytes=limits.tmp_bytes,
                socket_dir=directory,
                policy=policy,
                profile=profile,
                root=root,
                views=views,
                enter=enter,
            )

        key = (context.session_id, entry.network)
        loop = asyncio.get_running_loop()
        started = loop.run_in_executor(self._threads, start)

        def settle(done: asyncio.Future[SessionSandbox]) -> None:
            exc = done.exception()
            if exc is not None:
                log.warning("the sandbox of session %s did not start: %s", context.session_id, exc)
                entry.ready.set_exception(
                    exc if isinstance(exc, SandboxStartError) else SandboxStartError(str(exc))
                )
            elif not self._open or self._entries.get(key) is not entry:
                # Its session closed, or its layers are to change (B1), meanwhile: it
                # ends first, and only then is whoever waits for it told.
                def ended(_: object) -> None:
                    entry.ready.set_exception(SandboxStartError("its session closed"))
                    entry.ready.exception()

                try:
                    closing = loop.run_in_executor(self._threads, done.result().close)
                except RuntimeError:  # the pool is closing: its threads are gone
                    done.result().close()
                    ended(None)
                    return
                closing.add_done_callback(ended)
                return
            else:
                entry.ready.set_result(done.result())
                self._holders = self._holders | {done.result().pid}
            entry.ready.exception()  # retrieved: nobody may be waiting any more

        started.add_done_callback(settle)

    async def root_of(self, context: CallContext) -> tuple[Sequence[str], dict[str, str]]:
        """bubblewrap's root arguments for the session's own root (V12, V13) and the
        views bound at its roots (V14): its layers, made now if no sandbox of it made
        them yet. Raises SandboxStartError."""
        if context.root == Root.HOST and not context.workspace_overlay:
            return HOST_ROOT, {}
        directory = self._layers_directory()
        loop = asyncio.get_running_loop()
        root, views, enter = await loop.run_in_executor(
            self._threads, self._placed, context, directory
        )
        if enter:
            raise SandboxStartError(
                "this daemon's layers live in a user namespace of their own, which only "
                "session sandboxes enter (the session mechanism is off here)"
            )
        return root, views

    def mounted_view(self, session_id: str) -> Path | None:
        """The session's workspace overlay, once mounted (V14)."""
        layer = self._layers.get(session_id)
        return None if layer is None else layer.workspace_view

    async def workspace_view(self, context: CallContext) -> Path:
        """Where the session's overlay of its workspace is mounted (V14), mounted now
        if nothing of the session mounted it yet. Raises SandboxStartError."""
        layer = self._layers.get(context.session_id)
        if layer is not None and layer.workspace_view is not None:
            return layer.workspace_view
        directory = self._layers_directory()
        loop = asyncio.get_running_loop()
        layer = await loop.run_in_executor(self._threads, self._layer, context, directory)
        assert layer.workspace_view is not None
        return layer.workspace_view

    def base_of(self, session_id: str) -> tuple[dict[str, str], str]:
        """The environment and working directory an image gives the session's
        commands (V13); nothing for other roots."""
        image = self._images.get(session_id)
        return ({}, "") if image is None else (dict(image.env), image.working_dir)

    def admit_image(self, image: str) -> None:
        """Refuse (ImageError) an image this pool would not use: images off (no
        ``image_dirs``), outside them, or at a denied path. Cheap: no unpack."""
        config = self._processes.config
        admit(Path(image), config.image_dirs, self._denied())

    def _denied(self) -> list[Path]:
        """What an image may not be, hold or lie in: what confined code may not see
        (deny_read, the runtime dir, the key files)."""
        return [Path(p) for p in self._processes.policy.hidden]

    def _layers_directory(self) -> Path:
        self._open_once()
        if self._directory is None:
            raise SandboxStartError("session sandboxes are off here (see toolpool doctor)")
        return self._directory

    def _placed(
        self, context: CallContext, directory: Path, tmp_bytes: int = 0
    ) -> tuple[Sequence[str], dict[str, str], tuple[str, ...]]:
        """The session's root arguments, views and what a sandbox is started under to
        see them (V17), its layers made first (a thread); a session sandbox's /tmp
        (``tmp_bytes``) is on its layers, where it outlives the sandbox (B1)."""
        if context.root == Root.HOST and not context.workspace_overlay:
            return HOST_ROOT, {}, ()
        layer = self._layer(context, directory)
        root = HOST_ROOT if layer.root_merged is None else layer.root_args()
        views = {}
        if layer.workspace_merged is not None:
            views[os.path.realpath(context.workspace)] = str(layer.workspace_merged)
        if tmp_bytes:
            views["/tmp"] = str(layer.mount_tmp(tmp_bytes))
        return root, views, layer.enter_argv()

    def _layer(self, context: CallContext, directory: Path) -> SessionLayer:
        """The session's writable layers, with what its options ask mounted: one
        tmpfs for all its sandboxes (in a start thread). Raises SandboxStartError."""
        with self.layer_lock(context.session_id):
            layer = self._layers.get(context.session_id)
            if layer is None:
                size = context.layer_bytes or self._processes.config.layer_bytes
                layer = SessionLayer.make(directory / f"{next(self._names):x}.l", size)
                self._layers[context.session_id] = layer
            self._mount(context, layer)
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
                Path(context.image), allowed_dirs=config.image_dirs, denied=self._denied()
            )
        except ImageError as exc:
            raise SandboxStartError(f"its image could not be used: {exc}") from exc
        self._images[context.session_id] = image
        return image

    # -- what checkpoints, rewinds and forks ask (pool/branches.py) -------------------

    def layer(self, session_id: str) -> SessionLayer | None:
        """The session's layers, once made."""
        return self._layers.get(session_id)

    def layer_lock(self, session_id: str) -> threading.Lock:
        """What a thread holds while it changes the session's layers."""
        with self._locks_lock:
            return self._layer_locks.setdefault(session_id, threading.Lock())

    async def stop_sandboxes(self, session_id: str) -> list[tuple[CallContext, Limits]]:
        """End the session's sandboxes (and so every process of them): what they were
        started for, to start them again (``restart``) once its layers changed."""
        ending = [self._entries.pop(k) for k in list(self._entries) if k[0] == session_id]
        await asyncio.gather(*(self._end(e) for e in ending))
        return [(e.context, e.limits) for e in ending]

    def restart(self, started: Sequence[tuple[CallContext, Limits]]) -> None:
        """Start again the sandboxes ``stop_sandboxes`` ended, off the event loop and
        before their next command asks (which then waits for the start under way)."""
        for context, limits in started:
            network = limits.network or context.allow_network
            key = (context.session_id, network)
            if self._open and key not in self._entries and context.session_id in self._layers:
                entry = _Entry(asyncio.get_running_loop().create_future(), network, context, limits)
                self._entries[key] = entry
                self._start(entry, context, limits)

    def fork_layer(
        self, context: CallContext, parent: str, depths: Mapping[str, int]
    ) -> SessionLayer | None:
        """Layers for the fork of ``context`` (in a thread): a tmpfs of its own, in
        its parent's namespace, each overlay the parent had at the checkpoint of
        ``depths`` stacked on the parent's frozen layers then, its image leased again;
        None when the parent has no layers yet. Raises SandboxStartError."""
        of = self._layers.get(parent)
        if of is None:
            return None
        size = context.layer_bytes or self._processes.config.layer_bytes
        name = self._layers_directory() / f"{next(self._names):x}.l"
        with self.layer_lock(context.session_id):
            layer = SessionLayer.make(name, size, of.space)
            self._layers[context.session_id] = layer
            image = self._images.get(parent)
            if image is not None:
                self._images[context.session_id] = image.shared()
            with self.layer_lock(parent):
                self._mount(context, layer, of.inherit(depths))
        return layer

    def denied(self) -> list[Path]:
        """What the daemon writes nowhere near (an export's destination, B9)."""
        return [*self._denied(), self._processes.runtime_dir]

    async def end_session(self, session_id: str) -> None:
        """The session closes: its sandboxes end, everything in them with them, and
        then its layer."""
        ending = [k for k in self._entries if k[0] == session_id]
        await asyncio.gather(*(self._end(self._entries.pop(k)) for k in ending))
        self._layer_locks.pop(session_id, None)
        layer = self._layers.pop(session_id, None)
        if layer is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self._threads, layer.remove)
            except OSError as exc:
                log.error("the layer of session %s stays: %s", session_id, exc)
        image = self._images.pop(session_id, None)
        if image is not None:
            image.release()  # its layers may be evicted now

    async def close(self) -> None:
        """End every sandbox; no new one starts."""
        self._open, self._closed = False, True
        entries = list(self._entries.values())
        self._entries.clear()
        await asyncio.gather(*(self._end(e) for e in entries))
        self._threads.shutdown(wait=True)
        layers = list(self._layers.values())
        self._layers.clear()
        for layer in layers:  # its holder ends with it, where it has one (V17)
            try:
                await asyncio.get_running_loop().run_in_executor(None, layer.remove)
            except OSError as exc:
                log.error("a session's layer stays: %s", exc)
        for image in self._images.values():
            image.release()
        self._images.clear()
        if self._directory is not None:
            try:
                remove_layers(self._directory)
            except OSError as exc:
                log.error("the sessions' layers stay: %s", exc)

    async def _end(self, entry: _Entry) -> None:
        try:
            sandbox = await asyncio.shield(entry.ready)
        except SandboxStartError:
            return
        await asyncio.get_running_loop().run_in_executor(self._threads, sandbox.close)
        self._holders = self._holders - {sandbox.pid}

    def confines(self, pid: int) -> bool:
        """Whether ``pid`` runs in a session sandbox: under its holder (X2). Any thread."""
        holders = self._holders
        return bool(holders) and linux.lineage_includes(pid, set(holders))

    def _in_thread_close(self, sandbox: SessionSandbox) -> None:
        self._threads.submit(sandbox.close)

    def layer_used(self, session_id: str) -> int | None:
        """What the session's writable layers hold, once it has them (``status``)."""
        layer = self._layers.get(session_id)
        return None if layer is None else layer.used_bytes()

    def listing(self) -> dict[str, list[dict[str, object]]]:
        """Each session's sandboxes, for ``status``."""
        by_session: dict[str, list[dict[str, object]]] = {}
        for (session_id, network), entry in self._entries.items():
            if not entry.ready.done():
                state = "starting"
            elif entry.ready.exception() is not None:
                state = "failed"
            else:
                state = "running" if entry.ready.result().alive() else "ended"
            row: dict[str, object] = {"network": network, "state": state}
            if state == "running":
                row["pid"] = entry.ready.result().pid
            layer = self._layers.get(session_id)
            image = self._images.get(session_id)
            if layer is None or layer.root_merged is None:
                row["root"] = "host"
            else:
                row["root"] = "overlay" if image is None else f"image {image.digest}"
            if layer is not None:
                row["layer_used_bytes"] = layer.used_bytes()
            by_session.setdefault(session_id, []).append(row)
        return by_session
