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
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from toolpool.pool.processes import WorkerProcesses
from toolpool.protocol import CallContext
from toolpool.sandbox import linux
from toolpool.sandbox.layers import RootLayer, remove_layers
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.mounts import HOST_ROOT
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.session_box import SandboxStartError, SessionSandbox
from toolpool.session_options import DEFAULT_LAYER_BYTES, Root

log = logging.getLogger("toolpool.pool")

Key = tuple[str, bool]  # session id, network allowed


@dataclass(slots=True)
class _Entry:
    """One session sandbox: starting (``ready`` pending), running, or failed."""

    ready: asyncio.Future[SessionSandbox]
    network: bool


class SessionSandboxes:
    """Every session's sandbox, by session and network."""

    def __init__(self, processes: WorkerProcesses) -> None:
        self._processes = processes  # its runtime dir, sandbox profile and policy, once open
        self._entries: dict[Key, _Entry] = {}
        self._layers: dict[str, RootLayer] = {}  # the sessions' copy-on-write roots (V12)
        self._layers_lock = threading.Lock()  # made in the start threads
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
        return socket, "" if layer is None else str(layer.directory)

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
            entry = _Entry(asyncio.get_running_loop().create_future(), network)
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
            root: Sequence[str] = HOST_ROOT
            if context.root == Root.OVERLAY:
                root = self._layer(context, directory).root_args()
            return SessionSandbox.start(
                roots=roots,
                network=entry.network,
                tmp_bytes=limits.tmp_bytes,
                socket_dir=directory,
                policy=policy,
                profile=profile,
                root=root,
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
                self._in_thread_close(done.result())  # its session closed meanwhile
                entry.ready.set_exception(SandboxStartError("its session closed"))
            else:
                entry.ready.set_result(done.result())
                self._holders = self._holders | {done.result().pid}
            entry.ready.exception()  # retrieved: nobody may be waiting any more

        started.add_done_callback(settle)

    async def root_of(self, context: CallContext) -> Sequence[str]:
        """bubblewrap's root arguments for the session's own root (V12): its layer,
        made now if no sandbox of it made it yet. Raises SandboxStartError."""
        if context.root == Root.HOST:
            return HOST_ROOT
        self._open_once()
        directory = self._directory
        if directory is None:
            raise SandboxStartError("session sandboxes are off here (see toolpool doctor)")
        loop = asyncio.get_running_loop()
        layer = await loop.run_in_executor(self._threads, self._layer, context, directory)
        return layer.root_args()

    def _layer(self, context: CallContext, directory: Path) -> RootLayer:
        """The session's copy-on-write root, made on its first sandbox's start (in a
        start thread); one for all its sandboxes."""
        with self._layers_lock:
            layer = self._layers.get(context.session_id)
            if layer is None:
                size = context.layer_bytes or DEFAULT_LAYER_BYTES
                layer = RootLayer.make(directory / f"{next(self._names):x}.l", size)
                self._layers[context.session_id] = layer
            return layer

    async def end_session(self, session_id: str) -> None:
        """The session closes: its sandboxes end, everything in them with them, and
        then its layer."""
        ending = [k for k in self._entries if k[0] == session_id]
        await asyncio.gather(*(self._end(self._entries.pop(k)) for k in ending))
        layer = self._layers.pop(session_id, None)
        if layer is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self._threads, layer.remove)
            except OSError as exc:
                log.error("the layer of session %s stays: %s", session_id, exc)

    async def close(self) -> None:
        """End every sandbox; no new one starts."""
        self._open, self._closed = False, True
        entries = list(self._entries.values())
        self._entries.clear()
        await asyncio.gather(*(self._end(e) for e in entries))
        self._threads.shutdown(wait=True)
        self._layers.clear()  # each is under the directory: removed with it
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
            row["root"] = "host" if layer is None else "overlay"
            if layer is not None:
                row["layer_used_bytes"] = layer.used_bytes()
            by_session.setdefault(session_id, []).append(row)
        return by_session
