"""The sessions' sandboxes (SPEC V1): one per session, started when its first command
needs it, ended when the session closes; a command is then started inside it
(toolpool.sandbox.spawn) instead of in a sandbox of its own.

A worker asks for its call's session (``ShellRequest`` of action ``environment``,
answered with the sandbox's socket) and starts its command there itself, joined to
its own cgroups and with its own rlimits, as it would have started a child. The pool
owns the sandboxes: a worker that is recycled or lost changes nothing, and any
worker runs any command of the session in the same one.

A session whose calls differ in network (a tool's limits may allow it where the
session does not) has one sandbox for each: offline, open (pasta, X3), or in the
session's own network namespace behind its proxy (a network policy, N3: egress.py).
Starting one takes a few milliseconds (tens with pasta): it runs in a thread of its
own, never on the event loop, one start per session at a time (a second request
waits for the first's). A start that fails is the call's ``sandbox_failed`` error;
the next request tries again.

Sockets live in ``<runtime dir>/s``, which no command sees (X2); a dead
daemon's sandboxes die with it (their helper holds a pipe from this process) and
its sockets are removed with the runtime dir, or at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpool.pool.egress import SessionEgress
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.session_layers import SessionLayers
from toolpool.protocol import CallContext
from toolpool.sandbox import linux
from toolpool.sandbox.layers import remove_layers
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.mounts import HOST_ROOT
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.session_box import SandboxStartError, SessionSandbox
from toolpool.session_options import Root

log = logging.getLogger("toolpool.pool")

Key = tuple[str, str]  # session id, network: "off", "open" or "policy"
# A checkpoint's sandboxes start again this long after it, unless something of the
# session came first (a command starts its own; another checkpoint or a rewind would
# end it at once).
RESTART_SECONDS = 0.05


@dataclass(slots=True)
class _Entry:
    """One session sandbox: starting (``ready`` pending), running, or failed; what
    it was started for (its start again after a checkpoint, B1)."""

    ready: asyncio.Future[SessionSandbox]
    network: str  # "off", "open" or "policy"
    context: CallContext
    limits: Limits


class SessionSandboxes:
    """Every session's sandbox, by session and network."""

    def __init__(self, processes: WorkerProcesses) -> None:
        self._processes = processes  # its runtime dir, sandbox profile and policy, once open
        self._entries: dict[Key, _Entry] = {}
        self.layers = SessionLayers(processes)  # the sessions' layers and images
        # The policy sessions' network namespaces and their proxy (N3).
        self.egress = SessionEgress(processes, processes.config.network_resolve)
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="toolpool-sandboxes")
        self._directory: Path | None = None
        self._profile = SandboxProfile.nothing()
        self._policy: Policy | None = None
        self._open = False
        self._opened = False
        self._closed = False
        self._holders: frozenset[int] = frozenset()  # read from the ZAP thread (confines)
        # Sandboxes to start again after a checkpoint, by session: when, and for what.
        self._restarts: dict[str, tuple[asyncio.TimerHandle, list[tuple[CallContext, Limits]]]] = {}

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
        layer = self.layers.get(context.session_id)
        return socket, "" if layer is None else str(layer.seen(layer.directory))

    async def address(self, context: CallContext, limits: Limits) -> dict[str, Any]:
        """A ``ShellReply``'s fields for the call's sandbox: its socket and its
        layer's mount point (``socket``), and the base an image gives (``base_of``)."""
        socket, layer = await self.socket(context, limits)
        env, working_dir = self.base_of(context.session_id)
        return {"socket": socket, "layer": layer, "env": env, "working_dir": working_dir}

    async def _socket_for(self, context: CallContext, limits: Limits) -> Path:
        network = network_of(context, limits)
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
            netns, sockets = None, None
            if entry.network == "policy":
                netns = self.egress.network(context.session_id).fd
                sockets = self.egress.unix_sockets(context.session_id)
            return SessionSandbox.start(
                roots=roots,
                network=entry.network == "open",
                tmp_bytes=limits.tmp_bytes,
                socket_dir=directory,
                policy=policy,
                profile=profile,
                root=root,
                views=views,
                enter=enter,
                netns=netns,
                unix_sockets=sockets,
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
        directory = self.layers_directory()
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
        layer = self.layers.get(session_id)
        return None if layer is None else layer.workspace_view

    async def workspace_view(self, context: CallContext) -> Path:
        """Where the session's overlay of its workspace is mounted (V14), mounted now
        if nothing of the session mounted it yet. Raises SandboxStartError."""
        layer = self.layers.get(context.session_id)
        if layer is not None and layer.workspace_view is not None:
            return layer.workspace_view
        directory = self.layers_directory()
        loop = asyncio.get_running_loop()
        layer = await loop.run_in_executor(self._threads, self.layers.made, context, directory)
        assert layer.workspace_view is not None
        return layer.workspace_view

    def base_of(self, session_id: str) -> tuple[dict[str, str], str]:
        """The environment and working directory an image gives the session's
        commands (V13); nothing for other roots."""
        image = self.layers.image(session_id)
        return ({}, "") if image is None else (dict(image.env), image.working_dir)

    @property
    def runtime_dir(self) -> Path:
        return self._processes.runtime_dir

    def layers_directory(self) -> Path:
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
        layer = self.layers.made(context, directory)
        root = HOST_ROOT if layer.root_merged is None else layer.root_args()
        views = {}
        if layer.workspace_merged is not None:
            views[os.path.realpath(context.workspace)] = str(layer.workspace_merged)
        if tmp_bytes:
            with self.layers.lock(context.session_id):  # one for its sandboxes, made once
                views["/tmp"] = str(layer.mount_tmp(tmp_bytes))
        return root, views, layer.enter_argv()

    async def stop_sandboxes(self, session_id: str) -> list[tuple[CallContext, Limits]]:
        """End the session's sandboxes (and so every process of them): what they were
        started for, to start them again (``restart``) once its layers changed. A
        start again that was still waiting is dropped (its layers change once more)."""
        waiting = self._restarts.pop(session_id, None)
        again = [] if waiting is None else waiting[1]
        if waiting is not None:
            waiting[0].cancel()
        ending = [self._entries.pop(k) for k in list(self._entries) if k[0] == session_id]
        await asyncio.gather(*(self._end(e) for e in ending))
        return [*again, *((e.context, e.limits) for e in ending)]

    def restart(self, started: Sequence[tuple[CallContext, Limits]]) -> None:
        """Start again, a moment later (``RESTART_SECONDS``) and off the event loop,
        the sandboxes ``stop_sandboxes`` ended: ready before their next command asks
        (which otherwise starts one itself), and not started at all when another
        checkpoint, a rewind or the session's end comes first (it would end it again)."""
        if not started:
            return
        session_id = started[0][0].session_id

        def start_again() -> None:
            self._restarts.pop(session_id, None)
            for context, limits in started:
                network = network_of(context, limits)
                key = (session_id, network)
                if (
                    self._open
                    and key not in self._entries
                    and self.layers.get(session_id) is not None
                ):
                    loop = asyncio.get_running_loop()
                    entry = _Entry(loop.create_future(), network, context, limits)
                    self._entries[key] = entry
                    self._start(entry, context, limits)

        timer = asyncio.get_running_loop().call_later(RESTART_SECONDS, start_again)
        self._restarts[session_id] = (timer, list(started))

    async def end_session(self, session_id: str) -> None:
        """The session closes: its sandboxes end, everything in them with them, and
        then its layer."""
        waiting = self._restarts.pop(session_id, None)
        if waiting is not None:
            waiting[0].cancel()
        ending = [k for k in self._entries if k[0] == session_id]
        await asyncio.gather(*(self._end(self._entries.pop(k)) for k in ending))
        await self.egress.end_session(session_id)
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._threads, self.layers.end, session_id
            )
        except OSError as exc:
            log.error("the layer of session %s stays: %s", session_id, exc)

    async def close(self) -> None:
        """End every sandbox; no new one starts."""
        self._open, self._closed = False, True
        for timer, _ in self._restarts.values():
            timer.cancel()
        self._restarts.clear()
        entries = list(self._entries.values())
        self._entries.clear()
        await asyncio.gather(*(self._end(e) for e in entries))
        self._threads.shutdown(wait=True)
        await self.egress.close()
        # Their holders end with them, where they have one (V17).
        await asyncio.get_running_loop().run_in_executor(None, self.layers.end_all)
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
        layer = self.layers.get(session_id)
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
            layer = self.layers.get(session_id)
            image = self.layers.image(session_id)
            if layer is None or layer.root_merged is None:
                row["root"] = "host"
            else:
                row["root"] = "overlay" if image is None else f"image {image.digest}"
            if layer is not None:
                row["layer_used_bytes"] = layer.used_bytes()
            by_session.setdefault(session_id, []).append(row)
        return by_session


def network_of(context: CallContext, limits: Limits) -> str:
    """Which of a session's sandboxes a call's command starts in: ``"open"`` where
    the session or the call's limits allow the network, ``"policy"`` where the
    session has a network policy (N3), ``"off"`` else."""
    if limits.network or context.allow_network:
        return "open"
    return "policy" if context.egress else "off"
