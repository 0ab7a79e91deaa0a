"""The pool's side of network policies (SPEC N3–N8): the egress proxy's process, each
policy session's network namespace, and what the proxy sends up.

    egress = SessionEgress(processes)
    key = egress.register(session_id, policy, approval_seconds)   # once per session
    net = egress.network(session_id)       # in a thread: its namespace, served
    egress.on_ask = daemon_asks            # (session, call, host, port) → Answer
    egress.on_record = daemon_records      # every connection's record
    egress.refused(session_id, call_id)    # the hosts refused for a call, at its end
    await egress.end_session(session_id); await egress.close()

The proxy (``python -m toolpool.egress``) starts with the first namespace a policy
session needs, under a cgroup of its own (memory and processes bounded: a flood
there is not the daemon's), and as an unprivileged user when the daemon is root. A
namespace is made once per session (``toolpool.sandbox.netns``) and served until
the session ends; the proxy gets its two listeners. A proxy that dies is started
again at once (in a thread), and every live session's namespace gets new listeners;
meanwhile the sessions' connections are refused (nothing listens): it fails closed.

Everything the proxy sends is read on the event loop (small, bounded messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolpool.egress import control
from toolpool.egress.addresses import Pin
from toolpool.egress.environment import HTTP_PORT, PROXY_ADDRESS, SOCKS_PORT, WORKER_TOKEN
from toolpool.egress.rules import NetworkPolicy
from toolpool.pool.egress_process import end_proxy, start_proxy
from toolpool.pool.processes import WorkerProcesses
from toolpool.sandbox.netns import NetnsError, SessionNetwork
from toolpool.sandbox.session_box import SandboxStartError

log = logging.getLogger("toolpool.pool")

PROXY_MEMORY_BYTES = 1024**3
PROXY_PROCESSES = 64  # its threads (the resolver's) count
MAX_REFUSED_PER_CALL = 32  # hosts a call's result lists as refused
_COUNTERS = [
    "connections",
    "allowed",
    "denied",
    "asked",
    "active",
    "dropped",
    "bytes_up",
    "bytes_down",
]
DEFAULT_APPROVAL_SECONDS = 120.0  # a session no daemon registered (the daemon's default)


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to a network approval (N6): ``by`` is who or what decided."""

    allow: bool
    remember: bool = False
    by: str = "client"
    reason: str = ""


Ask = Callable[[str, str, str, int], Awaitable[Answer]]


@dataclass(slots=True)
class _Session:
    policy: NetworkPolicy
    key: str  # hex: the proxy checks call tokens with it (environment.py)
    approval_seconds: float
    network: SessionNetwork | None = None
    # Counted here from the records (each read before its call's result is made), but
    # what is open now and what the proxy dropped, which it sends now and then.
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTERS, 0))


class SessionEgress:
    """See the module. ``network`` runs in threads; everything else on the loop."""

    def __init__(self, processes: WorkerProcesses, pins: Mapping[str, Pin] | None = None) -> None:
        self._processes = processes
        self._pins = dict(pins or {})
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()  # the process and the namespaces, from threads
        self._sending = threading.Lock()  # the control socket, from threads and the loop
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._sender: control.Sender | None = None
        self._cgroup: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asking: set[asyncio.Task[None]] = set()
        # A call's refused hosts, until its result takes them (by session, call).
        self._refused: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.on_ask: Ask | None = None
        self.on_record: Callable[[dict[str, Any]], None] | None = None
        self.ending: list[Callable[[str], None]] = []  # told as a policy session ends
        # The call a policy session's worker runs now, by its id (the pool's): what its
        # token means.
        self.call_of_worker: Callable[[str], str] = lambda worker_id: ""
        self.started = 0  # proxy processes started (status)
        self._closed = False

    # -- sessions ----------------------------------------------------------------------------

    def register(
        self, session_id: str, policy: NetworkPolicy, approval_seconds: float | None = None
    ) -> str:
        """A policy session's key (made the first time): what its calls' proxy tokens
        are made with. The daemon registers a session as it opens, with the seconds
        an approval waits; a call's registration after finds it."""
        session = self._sessions.get(session_id)
        if session is not None and session.policy is policy and approval_seconds is None:
            return session.key  # every call of the session after the first
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if session is None or session.policy != policy:
            seconds = DEFAULT_APPROVAL_SECONDS if approval_seconds is None else approval_seconds
            session = _Session(policy, secrets.token_bytes(16).hex(), seconds)
            self._sessions[session_id] = session
        elif approval_seconds is not None:
            session.approval_seconds = approval_seconds
        return session.key

    def unix_sockets(self, session_id: str) -> tuple[str, ...]:
        """The pathname sockets outside its roots the session may reach (N9)."""
        session = self._sessions.get(session_id)
        return () if session is None else session.policy.unix_sockets

    def network(self, session_id: str) -> SessionNetwork:
        """(In a thread.) The session's namespace, made and served first if it is
        not yet. Raises SandboxStartError."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise SandboxStartError(f"session {session_id} has no network policy here")
            if session.network is not None and self._alive():
                return session.network
            try:
                if not self._alive():
                    self._revive()
                if session.network is None:
                    session.network = SessionNetwork.make((HTTP_PORT, SOCKS_PORT), PROXY_ADDRESS)
                    self._serve(session_id, session)
            except (NetnsError, OSError, control.ControlError) as exc:
                raise SandboxStartError(f"the session's network proxy: {exc}") from exc
            return session.network

    def _revive(self) -> None:
        """(Under the lock.) Start the proxy, and serve every session that has a
        namespace again, on new listeners (the old ones ended with the old proxy)."""
        if self._closed:
            raise OSError("the pool is closing")
        self._start_process()
        for session_id, session in self._sessions.items():
            if session.network is not None:
                session.network.listen_again((HTTP_PORT, SOCKS_PORT), PROXY_ADDRESS)
                self._serve(session_id, session)

    def _revived(self) -> None:
        """(In a thread.) The proxy ended: started again at once for the sessions
        it served, whose commands would otherwise find nothing listening until their
        sandbox's next start."""
        with self._lock:
            if self._alive() or self._closed:
                return
            if not any(s.network is not None for s in self._sessions.values()):
                return
            try:
                self._revive()
            except (NetnsError, OSError, control.ControlError) as exc:
                log.error("the egress proxy could not be started again: %s", exc)
                return
        log.warning("the egress proxy was started again (%d starts)", self.started)

    def _serve(self, session_id: str, session: _Session) -> None:
        assert session.network is not None
        listeners = session.network.take_listeners()
        try:
            self._send(
                {
                    "op": "open",
                    "session": session_id,
                    "policy": session.policy.to_wire(),
                    "key": session.key,
                    "approval_seconds": session.approval_seconds,
                },
                [listener.fileno() for listener in listeners],
            )
        finally:
            for listener in listeners:
                listener.close()

    async def end_session(self, session_id: str) -> None:
        """The session closed: the proxy stops serving it; its namespace goes."""
        session = self._sessions.pop(session_id, None)
        for key in [k for k in self._refused if k[0] == session_id]:
            del self._refused[key]
        if session is None:
            return
        for told in self.ending:
            told(session_id)
        if self._alive():
            with contextlib.suppress(OSError, control.ControlError):
                self._send({"op": "close", "session": session_id})
        if session.network is not None:
            session.network.close()

    def refused(self, session_id: str, call_id: str) -> list[dict[str, Any]]:
        """The connections refused for the call so far (each once): what its result
        says (N7). What the proxy sent before is read first."""
        self.drain()
        return self._refused.pop((session_id, call_id), [])

    def statistics(self) -> dict[str, Any]:
        """The proxy's process (``status``): its pid, how often it was started, the
        sessions it serves."""
        process = self._process
        return {
            "pid": process.pid if process is not None and self._alive() else None,
            "started": self.started,
            "sessions": sum(1 for s in self._sessions.values() if s.network is not None),
        }

    def counters(self, session_id: str) -> dict[str, int] | None:
        session = self._sessions.get(session_id)
        return None if session is None or session.network is None else dict(session.counters)

    async def close(self) -> None:
        """Stop the proxy (its control socket closes: it ends; the kill after a
        grace) and let go of every namespace."""
        for task in list(self._asking):
            task.cancel()
        self._closed = True
        with self._lock:
            for session in self._sessions.values():
                if session.network is not None:
                    session.network.close()
            self._sessions.clear()
            process, self._process = self._process, None
            sock, self._sock, self._sender = self._sock, None, None
        if sock is not None:
            _unwatch(asyncio.get_running_loop(), sock)  # the proxy ends on this
        if process is not None:
            await asyncio.get_running_loop().run_in_executor(None, end_proxy, process)
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    # -- the process ----------------------------------------------------------------------------

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None and self._sock is not None

    def _start_process(self) -> None:
        """(Under the lock, in a thread.) Start the proxy and wait for its ``ready``."""
        if self._process is not None:
            end_proxy(self._process)
            self._process = None
        self._close_socket()
        cgroups = self._processes.cgroups
        if cgroups is not None and self._cgroup is None:
            cgroup = cgroups.create("egress")
            cgroup.set_memory(PROXY_MEMORY_BYTES)
            cgroup.set_pids(PROXY_PROCESSES)
            self._cgroup = cgroup
        procs = self._cgroup.procs_files() if self._cgroup is not None else []
        process, sock = start_proxy(self._processes.runtime_dir, self._pins, procs)
        self._process, self._sock, self._sender = process, sock, control.Sender(sock)
        self.started += 1
        loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(self._watch, sock)

    def _watch(self, sock: socket.socket) -> None:
        if self._sock is sock:
            asyncio.get_running_loop().add_reader(sock, self.drain)

    def _close_socket(self) -> None:
        """(In a thread.) Let go of a dead proxy's socket."""
        sock, self._sock, self._sender = self._sock, None, None
        if sock is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_unwatch, self._loop, sock)

    def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        with self._sending:
            sender = self._sender
            if sender is None:
                raise OSError("the proxy is not running")
            sender.send(message, fds)
            if sender.queue:
                # The proxy reads its control socket at once, and the pool sends little
                # (a session's start and end, answers): full means it is stuck.
                sender.queue.clear()
                raise OSError("the proxy does not read its control socket")

    # -- what the proxy says -------------------------------------------------------------------

    def drain(self) -> None:
        """Read everything the proxy has sent so far (on the loop)."""
        sock = self._sock
        while sock is not None:
            try:
                got = control.receive(sock)
            except BlockingIOError:
                return
            except control.ControlError as exc:
                log.error("egress proxy: %s", exc)
                continue
            except OSError:
                got = None
            if got is None:
                log.error("the egress proxy ended; it is started again")
                if self._sock is sock:
                    self._sock = self._sender = None
                loop = asyncio.get_running_loop()
                _unwatch(loop, sock)
                if not self._closed:
                    loop.run_in_executor(None, self._revived)
                return
            message, fds = got
            for fd in fds:
                os.close(fd)
            self._heard(message)

    def _heard(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "record":
            self._recorded(message)
        elif op == "ask":
            task = asyncio.get_running_loop().create_task(self._ask(message))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)
        elif op == "stats":
            sessions = message.get("sessions")
            if isinstance(sessions, dict):
                for session_id, counters in sessions.items():
                    session = self._sessions.get(str(session_id))
                    if session is not None and isinstance(counters, dict):
                        for name in ("active", "dropped"):
                            session.counters[name] = int(counters.get(name, 0))

    def _caller(self, token: str) -> str:
        """The call a token names: itself, or the call a bound worker runs."""
        if token.startswith(WORKER_TOKEN):
            return self.call_of_worker(token.removeprefix(WORKER_TOKEN))
        return token

    def _recorded(self, record: dict[str, Any]) -> None:
        record.pop("op", None)
        record["call"] = self._caller(str(record.get("call", "")))
        session_id, call_id = str(record.get("session", "")), record["call"]
        session = self._sessions.get(session_id)
        if session is None:
            return
        counters = session.counters
        counters["connections"] += 1
        counters["allowed" if record.get("decision") == "allow" else "denied"] += 1
        counters["bytes_up"] += int(record.get("bytes_up") or 0)
        counters["bytes_down"] += int(record.get("bytes_down") or 0)
        if record.get("decision") == "deny" and call_id:
            refused = self._refused.setdefault((session_id, call_id), [])
            if len(refused) < MAX_REFUSED_PER_CALL:
                refused.append({k: record.get(k) for k in ("host", "port", "by")})
        if self.on_record is not None:
            self.on_record(record)

    async def _ask(self, message: dict[str, Any]) -> None:
        session_id = str(message.get("session", ""))
        try:
            ask_id, host, port = int(message["id"]), str(message["host"]), int(message["port"])
        except (KeyError, TypeError, ValueError):
            return
        answer = Answer(False, by="no one to ask", reason="the daemon asks no client here")
        session = self._sessions.get(session_id)
        if session is not None:
            session.counters["asked"] += 1
        if self.on_ask is not None and session is not None:
            try:
                caller = self._caller(str(message.get("call", "")))
                answer = await self.on_ask(session_id, caller, host, port)
            except Exception:  # the daemon's bug must not leave the connection waiting
                log.exception("asking about %s:%d failed", host, port)
                answer = Answer(False, by="error")
        if self._alive():
            with contextlib.suppress(OSError, control.ControlError):
                self._send(
                    {
                        "op": "answer",
                        "id": ask_id,
                        "allow": answer.allow,
                        "remember": answer.remember,
                        "by": answer.by,
                        "reason": answer.reason,
                    }
                )


def _unwatch(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    with contextlib.suppress(Exception):
        loop.remove_reader(sock)
    sock.close()
