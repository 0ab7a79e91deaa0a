"""The egress proxy: an HTTP proxy (CONNECT tunnels, absolute-form http:// requests)
and a SOCKS5 proxy (CONNECT, names resolved here) for every policy session, each on
listeners of its own that live in the session's network namespace (SPEC N3).

    proxy = EgressProxy(uplink, pins)
    await proxy.open_session("s1", policy, key, 120.0, http_listener, socks_listener)
    ...
    proxy.answer(ask_id, allow=True, remember=True, by="client")   # an ask's answer
    await proxy.close()

A connection is read (bounded: ``requests.py``), judged by the session's policy
(``rules.py``) — asked about through ``uplink`` when no rule names it and the policy
says ``ask`` — resolved here, refused when every address is this host's
(``addresses.py``; a pinned name goes where it is pinned), connected, and relayed
byte for byte: no TLS is opened, so what goes through a tunnel is not looked at.
Each connection's end is a ``record`` sent up (a refusal's before the refusal is
written: whoever reads the refusal has been recorded). Everything a session holds
is bounded: connections, approvals pending, head bytes and time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolpool.egress.addresses import HostAddresses, Pin
from toolpool.egress.dial import Dialer, Resolver, Unreachable
from toolpool.egress.environment import call_of
from toolpool.egress.relay import flushed, relay
from toolpool.egress.requests import (
    MAX_HEAD_BYTES,
    SOCKS_HOST_UNREACHABLE,
    SOCKS_NOT_ALLOWED,
    SOCKS_REFUSED,
    Refused,
    Target,
    http_refusal,
    read_http,
    read_socks,
    socks_reply,
)
from toolpool.egress.rules import Action, NetworkPolicy, normal_name

log = logging.getLogger("toolpool.egress")

MAX_CONNECTIONS_PER_SESSION = 256  # open at once; more are closed as they come
MAX_CONNECTIONS = 2048  # all sessions together: each may buffer ~300 KB, under 1 GiB
MAX_PENDING_ASKS = 16  # a session's network approvals waiting for an answer
HEAD_SECONDS = 30.0  # a request head (or SOCKS handshake) must come within this
ASK_GRACE = 5.0  # past the approval timeout, the proxy stops waiting on its own


class Uplink(Protocol):
    """Where the proxy's questions and records go (the pool, over the control socket)."""

    def send(self, message: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Answer:
    allow: bool
    by: str  # the rule, or who answered
    reason: str = ""


@dataclass(slots=True)
class Counters:
    """A session's proxy counters (``status``)."""

    connections: int = 0
    active: int = 0
    allowed: int = 0
    denied: int = 0
    asked: int = 0
    dropped: int = 0  # closed at once: past the bounds, or a bad request
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass(eq=False, slots=True)
class SessionProxy:
    """One policy session at the proxy."""

    id: str
    policy: NetworkPolicy
    key: bytes
    approval_seconds: float
    servers: list[asyncio.Server] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    pending: dict[tuple[str, int], asyncio.Future[Answer]] = field(default_factory=dict)
    remembered: dict[tuple[str, int], Answer] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)


class EgressProxy:
    """The proxy of every policy session of one daemon (see the module)."""

    def __init__(
        self,
        uplink: Uplink,
        pins: dict[str, Pin] | None = None,
        *,
        addresses: HostAddresses | None = None,
        resolver: Resolver | None = None,
        head_seconds: float = HEAD_SECONDS,
        max_per_session: int = MAX_CONNECTIONS_PER_SESSION,
    ) -> None:
        self._uplink = uplink
        self._dialer = Dialer(dict(pins or {}), addresses or HostAddresses(), resolver)
        self._head_seconds = head_seconds
        self._max_per_session = max_per_session
        self.sessions: dict[str, SessionProxy] = {}
        self._asks: dict[int, tuple[SessionProxy, tuple[str, int]]] = {}
        self._ask_ids = itertools.count(1)
        self._active = 0

    def __repr__(self) -> str:
        pending = sum(len(s.pending) for s in self.sessions.values())
        return (
            f"<EgressProxy [{len(self.sessions)} sessions, {self._active} connections, "
            f"{pending} approvals pending]>"
        )

    # -- sessions ----------------------------------------------------------------------------

    async def open_session(
        self,
        session_id: str,
        policy: NetworkPolicy,
        key: bytes,
        approval_seconds: float,
        http_listener: socket.socket,
        socks_listener: socket.socket,
    ) -> None:
        """Serve ``session_id`` on its two listening sockets (made, bound and
        listening in its network namespace); a session served already is served on
        the new ones instead."""
        await self.close_session(session_id)
        session = SessionProxy(session_id, policy, key, approval_seconds)
        self.sessions[session_id] = session
        for listener, kind in ((http_listener, "http"), (socks_listener, "socks")):
            listener.setblocking(False)

            def serve(
                reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: str = kind
            ) -> Awaitable[None]:
                return self._connection(session, kind, reader, writer)

            session.servers.append(
                await asyncio.start_server(serve, sock=listener, limit=MAX_HEAD_BYTES + 1)
            )

    async def close_session(self, session_id: str) -> None:
        """Stop serving the session: its listeners close, its connections end, its
        approvals pending are denied."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        for server in session.servers:
            server.close()
        for future in session.pending.values():
            if not future.done():
                future.set_result(Answer(False, "the session closed"))
        for ask_id in [i for i, (s, _) in self._asks.items() if s is session]:
            del self._asks[ask_id]
        for task in list(session.tasks):
            task.cancel()
        await asyncio.gather(*session.tasks, return_exceptions=True)

    async def close(self) -> None:
        for session_id in list(self.sessions):
            await self.close_session(session_id)

    def answer(self, ask_id: int, *, allow: bool, remember: bool, by: str, reason: str) -> None:
        """The answer to an ask: the connections waiting on it go on or are refused;
        ``remember``: so are the session's later connections to that host and port."""
        asked = self._asks.pop(ask_id, None)
        if asked is None:
            return  # late: its session closed, or the proxy stopped waiting
        session, key = asked
        answer = Answer(allow, by, reason)
        if remember:
            session.remembered[key] = Answer(allow, f"{by}, remembered for the session", reason)
        future = session.pending.pop(key, None)
        if future is not None and not future.done():
            future.set_result(answer)

    def statistics(self) -> dict[str, dict[str, int]]:
        return {sid: dataclasses.asdict(s.counters) for sid, s in self.sessions.items()}

    # -- one connection ------------------------------------------------------------------------

    async def _connection(
        self,
        session: SessionProxy,
        kind: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        counters = session.counters
        if (
            session.id not in self.sessions
            or counters.active >= self._max_per_session
            or self._active >= MAX_CONNECTIONS
        ):
            counters.dropped += 1
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        session.tasks.add(task)
        counters.active += 1
        self._active += 1
        try:
            await self._serve(session, kind, reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Its session closed (close_session cancels it): this task is the
            # connection's alone, and ends here; the server's callback then finds an
            # ended task, not a cancelled one (which it would log as an error).
            pass
        finally:
            counters.active -= 1
            self._active -= 1
            session.tasks.discard(task)
            writer.close()  # what was written goes first: a refusal reaches its reader

    async def _serve(
        self,
        session: SessionProxy,
        kind: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        began = time.monotonic()
        try:
            async with asyncio.timeout(self._head_seconds):
                if kind == "http":
                    target = await read_http(reader)
                else:
                    target = await read_socks(reader, writer)
        except TimeoutError:
            session.counters.dropped += 1
            return
        except Refused as exc:
            session.counters.dropped += 1
            if kind == "http":
                writer.write(http_refusal(exc.status, "Bad Request", f"toolpool: {exc.why}"))
            elif exc.reply >= 0:
                writer.write(socks_reply(exc.reply))
            await flushed(writer)
            return
        session.counters.connections += 1
        call = call_of(session.key, target.user, target.password)
        answer = await self._decide(session, call, target)
        if not answer.allow:
            self._refuse(session, call, target, answer, writer, began)
            await flushed(writer)
            return
        try:
            address, upstream_r, upstream_w = await self._dialer.dial(target.host, target.port)
        except Unreachable as exc:
            if exc.refused:
                self._refuse(session, call, target, Answer(False, exc.why), writer, began)
            else:
                self._unreachable(session, call, target, answer, exc.why, writer, began)
            await flushed(writer)
            return
        session.counters.allowed += 1
        record = self._record_of(session, call, target, answer, began)
        record["address"] = address
        try:
            if target.kind == "connect":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            elif target.kind == "socks":
                writer.write(socks_reply(0))
            else:
                upstream_w.write(target.forward)
                session.counters.bytes_up += len(target.forward)
                record["bytes_up"] += len(target.forward)
            up_to = target.body if target.kind == "http" else None

            counters = session.counters

            def count(up: bool, size: int) -> None:
                if up:
                    counters.bytes_up += size
                    record["bytes_up"] += size
                else:
                    counters.bytes_down += size
                    record["bytes_down"] += size

            await relay(reader, writer, upstream_r, upstream_w, count, up_to)
        finally:
            upstream_w.transport.abort()
            record["duration_ms"] = round((time.monotonic() - began) * 1000, 3)
            self._uplink.send(record)

    async def _decide(self, session: SessionProxy, call: str, target: Target) -> Answer:
        verdict = session.policy.judge(target.host, target.port)
        if verdict.action is Action.ALLOW:
            return Answer(True, verdict.rule)
        if verdict.action is Action.DENY:
            return Answer(False, verdict.rule)
        key = (normal_name(target.host), target.port)  # judge() read it as a name
        remembered = session.remembered.get(key)
        if remembered is not None:
            return remembered
        pending = session.pending.get(key)
        if pending is None:
            if len(session.pending) >= MAX_PENDING_ASKS:
                return Answer(
                    False, f"{MAX_PENDING_ASKS} network approvals pending already, the most"
                )
            pending = asyncio.get_running_loop().create_future()
            session.pending[key] = pending
            ask_id = next(self._ask_ids)
            self._asks[ask_id] = (session, key)
            session.counters.asked += 1
            self._uplink.send(
                {
                    "op": "ask",
                    "id": ask_id,
                    "session": session.id,
                    "call": call,
                    "host": key[0],
                    "port": key[1],
                }
            )
        try:
            async with asyncio.timeout(session.approval_seconds + ASK_GRACE):
                return await asyncio.shield(pending)
        except TimeoutError:
            if session.pending.get(key) is pending:
                del session.pending[key]
            return Answer(False, "no answer in time")

    # -- what is sent up and answered --------------------------------------------------------------

    def _record_of(
        self, session: SessionProxy, call: str, target: Target, answer: Answer, began: float
    ) -> dict[str, Any]:
        return {
            "op": "record",
            "session": session.id,
            "call": call,
            "host": target.host[:300],
            "port": target.port,
            "via": target.kind,
            "decision": "allow" if answer.allow else "deny",
            "by": answer.by,
            "bytes_up": 0,
            "bytes_down": 0,
            "duration_ms": round((time.monotonic() - began) * 1000, 3),
        }

    def _refuse(
        self,
        session: SessionProxy,
        call: str,
        target: Target,
        answer: Answer,
        writer: asyncio.StreamWriter,
        began: float,
    ) -> None:
        session.counters.denied += 1
        self._uplink.send(self._record_of(session, call, target, answer, began))
        why = answer.by if not answer.reason else f"{answer.by}: {answer.reason}"
        line = f"toolpool refused {_where(target)} ({why})"
        if target.kind == "socks":
            writer.write(socks_reply(SOCKS_NOT_ALLOWED))
        else:
            writer.write(http_refusal(403, line, line + " by the session's network policy"))

    def _unreachable(
        self,
        session: SessionProxy,
        call: str,
        target: Target,
        answer: Answer,
        why: str,
        writer: asyncio.StreamWriter,
        began: float,
    ) -> None:
        record = self._record_of(session, call, target, answer, began)
        record["error"] = why[:500]
        self._uplink.send(record)
        line = f"toolpool could not reach {_where(target)}: {why}"
        if target.kind == "socks":
            writer.write(socks_reply(SOCKS_REFUSED if "connect" in why else SOCKS_HOST_UNREACHABLE))
        else:
            writer.write(http_refusal(502, line, line))


def _where(target: Target) -> str:
    host = target.host[:200]
    return f"[{host}]:{target.port}" if ":" in host else f"{host}:{target.port}"
