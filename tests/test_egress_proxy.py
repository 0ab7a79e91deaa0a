"""The egress proxy itself (SPEC N2–N6, N12), on real sockets: what it lets through,
what it refuses and how, where it never connects whatever a name resolves to, and
the floods it bounds. It runs here in the test's event loop with an uplink that
records what it sends up (the pool's side is tried through a daemon in
test_egress_sessions.py); every listener and upstream is the test's own, on loopback
or this host's own address, and pinned names lead there."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from toolpool.egress.environment import call_mac, token_user
from toolpool.egress.requests import MAX_HEAD_BYTES
from toolpool.egress.rules import NetworkPolicy
from toolpool.egress.server import MAX_PENDING_ASKS, EgressProxy
from toolpool.sandbox.hostnet import HostNetwork

KEY = bytes(range(16))


class Uplink:
    """What the proxy sends up, kept; ``asked`` is set at each ask."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.asked = asyncio.Event()

    def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message["op"] == "ask":
            self.asked.set()

    def of(self, op: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["op"] == op]


@dataclass
class Upstream:
    """A server of the test's: it records what arrives and answers with it in
    upper case (a line at a time), or with an HTTP response to a request."""

    server: asyncio.Server
    received: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])


async def upstream(host: str = "127.0.0.1") -> Upstream:
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            data = await reader.read(65536)
            seen.append(data)
            if data.startswith(b"GET "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            else:
                while data:
                    writer.write(data.upper())
                    await writer.drain()
                    data = await reader.read(65536)
                    if data:
                        seen.append(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, host, 0)
    return Upstream(server, seen)


@dataclass
class Served:
    proxy: EgressProxy
    uplink: Uplink
    http: int  # the listeners' ports
    socks: int
    up: Upstream
    other: Upstream  # a second server, where an attacker would rather go


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


async def serve(
    policy: dict[str, Any],
    *,
    resolver: Callable[[str, int], Awaitable[list[str]]] | None = None,
    session: str = "s1",
    proxy: EgressProxy | None = None,
    uplink: Uplink | None = None,
    **options: Any,
) -> Served:
    up, other = await upstream(), await upstream()
    uplink = uplink or Uplink()
    pins = {"up.test": ("127.0.0.1", up.port), "other.test": ("127.0.0.1", other.port)}
    proxy = proxy or EgressProxy(uplink, pins, resolver=resolver, **options)
    http, socks = _listener(), _listener()
    ports = http.getsockname()[1], socks.getsockname()[1]
    await proxy.open_session(session, NetworkPolicy.parse(policy), KEY, 30.0, http, socks)
    return Served(proxy, uplink, ports[0], ports[1], up, other)


@pytest.fixture
async def served() -> AsyncIterator[list[Served]]:
    made: list[Served] = []
    yield made
    for each in made:
        await each.proxy.close()
        each.up.server.close()
        each.other.server.close()


async def request(port: int, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    return reader, writer


def connect_head(target: str, call: str = "", extra: bytes = b"") -> bytes:
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n".encode()
    if call:
        token = base64.b64encode(f"{token_user(call)}:{call_mac(KEY, call)}".encode())
        head += b"Proxy-Authorization: Basic " + token + b"\r\n"
    return head + extra + b"\r\n"


async def status_line(reader: asyncio.StreamReader) -> str:
    return (await reader.readline()).decode().strip()


async def unanswered(reader: asyncio.StreamReader) -> bool:
    """Whether the proxy ended the connection without a word (closed or reset)."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


# --- what goes through (N3) ---


@pytest.mark.spec("N3", "N8")
async def test_N3_a_tunnel_to_an_allowed_name_relays_both_ways_and_is_recorded(
    served: list[Served],
) -> None:
    s = await serve({"allow": ["up.test"]})
    served.append(s)
    reader, writer = await request(s.http, connect_head("up.test:443", call="c7"))
    assert await status_line(reader) == "HTTP/1.1 200 Connection established"
    await reader.readline()
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"PING"
    writer.close()
    await writer.wait_closed()
    while not s.uplink.of("record"):
        await asyncio.sleep(0.01)
    (record,) = s.uplink.of("record")
    assert record["call"] == "c7" and record["host"] == "up.test" and record["port"] == 443
    assert record["decision"] == "allow" and record["by"] == 'allow "up.test"'
    assert record["bytes_up"] == 4 and record["bytes_down"] == 4
    assert record["address"] == f"127.0.0.1:{s.up.port}"  # the pin: every port goes there


@pytest.mark.spec("N3", "N2")
async def test_N3_a_forwarded_request_reaches_the_name_judged_with_that_name_as_host(
    served: list[Served],
) -> None:
    s = await serve({"allow": ["up.test"]})
    served.append(s)
    # Given a request for an allowed name whose Host header names another, with
    # the proxy's credentials and a second request queued behind it
    head = (
        b"GET http://up.test/p?q=1 HTTP/1.1\r\nHost: other.test\r\n"
        b"Proxy-Authorization: Basic eDp5\r\nConnection: keep-alive\r\nX-Kept: 1\r\n\r\n"
        b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"
    )
    reader, writer = await request(s.http, head)
    assert await status_line(reader) == "HTTP/1.1 200 OK"
    writer.close()
    # Then the allowed server got the request with its own name, no credentials and
    # a close; and the other server got nothing at all
    first = s.up.received[0]
    assert first.startswith(b"GET /p?q=1 HTTP/1.1\r\nHost: up.test\r\n")
    assert b"Proxy-Authorization" not in first and b"keep-alive" not in first
    assert b"X-Kept: 1" in first and b"Connection: close" in first
    assert s.other.received == []


# --- what is refused, and how (N2, N5) ---


@pytest.mark.spec("N5", "N2")
@pytest.mark.parametrize(
    ("policy", "target", "rule"),
    [
        ({"allow": ["up.test"]}, "other.test:443", "no rule allows it"),
        ({"allow": ["up.test:443"]}, "up.test:22", "no rule allows it"),  # a denied port
        ({"allow": ["*"], "deny": ["*.test"]}, "up.test:443", 'deny "*.test"'),
        ({"allow": ["*"]}, "127.0.0.1:443", "an IP address that no rule names"),
        ({"allow": ["*"]}, "[::1]:443", "an IP address that no rule names"),
    ],
)
async def test_N5_a_refusal_is_a_403_naming_the_host_and_the_rule_recorded_first(
    served: list[Served], policy: dict[str, Any], target: str, rule: str
) -> None:
    s = await serve(policy)
    served.append(s)
    reader, writer = await request(s.http, connect_head(target, call="c1"))
    line = await status_line(reader)
    rest = (await reader.read()).decode()
    writer.close()
    host = target.rsplit(":", 1)[0]
    assert line.startswith("HTTP/1.1 403 toolpool refused ")
    assert host in line and rule in line  # what a tunnel's client prints
    assert rest.strip().endswith("by the session's network policy") and rule in rest
    assert rest.count("\n") == 5  # the head's lines and one line of body
    (record,) = s.uplink.of("record")
    assert record["decision"] == "deny" and record["by"] == rule and record["call"] == "c1"
    assert s.up.received == [] and s.other.received == []


@pytest.mark.spec("N4")
@pytest.mark.parametrize(
    "answer",
    [
        ["127.0.0.1"],
        ["127.0.0.53"],
        ["::1"],
        ["::ffff:127.0.0.1"],
        ["0.0.0.0"],
        ["169.254.169.254"],
        ["fe80::1"],
        ["224.0.0.1"],
        ["host"],  # this host's own address
        ["127.0.0.1", "host", "::1"],
    ],
)
async def test_N4_a_name_that_resolves_to_this_host_is_never_connected_to(
    served: list[Served], answer: list[str]
) -> None:
    own = [str(n.network_address) for n in HostNetwork.read().local] or ["127.0.0.1"]
    addresses = [own[0] if a == "host" else a for a in answer]
    # Given an allowed name whose DNS answers this host (a rebinding attacker's)
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1]

    async def rebinding(host: str, port: int) -> list[str]:
        return addresses

    s = await serve({"allow": ["rebind.test"]}, resolver=rebinding)
    served.append(s)
    try:
        reader, writer = await request(s.http, connect_head(f"rebind.test:{port}"))
        line = await status_line(reader)
        writer.close()
        # Then it is refused, saying why, and nothing connected to the listener
        assert line.startswith("HTTP/1.1 403 ") and "resolves to this host only" in line
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.spec("N4", "N10")
async def test_N4_a_pinned_name_goes_where_it_is_pinned_even_to_loopback(
    served: list[Served],
) -> None:
    async def never(host: str, port: int) -> list[str]:
        raise AssertionError("a pinned name is not resolved")

    s = await serve({"allow": ["up.test"]}, resolver=never)
    served.append(s)
    reader, writer = await request(s.http, connect_head("up.test:8443"))
    assert await status_line(reader) == "HTTP/1.1 200 Connection established"
    writer.close()


# --- SOCKS5 (N3, N5) ---


async def socks(
    port: int, host: bytes, dport: int, *, kind: int = 3, command: int = 1, call: str = ""
) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x02\x00\x02" if call else b"\x05\x01\x00")
    method = await reader.readexactly(2)
    if call:
        assert method == b"\x05\x02"
        user, password = token_user(call).encode(), call_mac(KEY, call).encode()
        writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
        assert await reader.readexactly(2) == b"\x01\x00"
    address = bytes([len(host)]) + host if kind == 3 else host
    writer.write(bytes([5, command, 0, kind]) + address + dport.to_bytes(2, "big"))
    reply = await reader.readexactly(10)
    return reply[1], reader, writer


async def socks_code(port: int, host: bytes, dport: int, **options: Any) -> int:
    code, _, writer = await socks(port, host, dport, **options)
    writer.close()
    return code


@pytest.mark.spec("N3", "N5")
async def test_N3_socks5_resolves_names_here_and_refuses_what_the_policy_refuses(
    served: list[Served],
) -> None:
    s = await serve({"allow": ["up.test"]})
    served.append(s)
    code, reader, writer = await socks(s.socks, b"up.test", 443, call="c3")
    assert code == 0
    writer.write(b"hello")
    assert await reader.readexactly(5) == b"HELLO"
    writer.close()
    # A name no rule allows, an address, a BIND: refused with their SOCKS codes.
    assert await socks_code(s.socks, b"other.test", 443) == 2  # not allowed by ruleset
    assert await socks_code(s.socks, socket.inet_aton("127.0.0.1"), 443, kind=1) == 2
    assert await socks_code(s.socks, b"up.test", 443, command=2) == 7  # no BIND
    assert await socks_code(s.socks, b"up.test", 443, command=3) == 7  # no UDP
    while len(s.uplink.of("record")) < 3:
        await asyncio.sleep(0.01)
    kinds = {(r["host"], r["decision"], r["call"]) for r in s.uplink.of("record")}
    assert kinds == {
        ("up.test", "allow", "c3"),
        ("other.test", "deny", ""),
        ("127.0.0.1", "deny", ""),
    }
    assert s.other.received == []


# --- bounds (N12) ---


@pytest.mark.spec("N12")
@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"CONNECT up.test:443 HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", "431"),
        (b"CONNECT up.test:443 HTTP/1.1\r\n" + b"X: 1\r\n" * 101 + b"\r\n", "431"),
        (b"\x16\x03\x01 not http\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nHost: up.test\r\n\r\n", "400"),  # no transparent proxying
        (b"GET https://up.test/ HTTP/1.1\r\n\r\n", "400"),
        (b"CONNECT up.test HTTP/1.1\r\n\r\n", "400"),
    ],
)
async def test_N12_a_head_too_large_or_not_a_proxy_request_is_refused(
    served: list[Served], head: bytes, status: str
) -> None:
    s = await serve({"allow": ["up.test"]})
    served.append(s)
    reader, writer = await request(s.http, head)
    assert (await status_line(reader)).split(" ")[1] == status
    writer.close()
    assert s.up.received == []


@pytest.mark.spec("N12")
async def test_N12_a_head_that_never_ends_is_dropped(served: list[Served]) -> None:
    s = await serve({"allow": ["up.test"]}, head_seconds=0.2)
    served.append(s)
    reader, writer = await request(s.http, b"CONNECT up.test:443 HTTP/1.1\r\nX: ")
    assert await unanswered(reader)
    writer.close()
    assert s.proxy.statistics()["s1"]["dropped"] == 1


@pytest.mark.spec("N12")
async def test_N12_one_sessions_flood_is_bounded_and_others_are_served(
    served: list[Served],
) -> None:
    # Given two sessions at one proxy, each allowed 8 connections at once
    first = await serve({"allow": ["up.test"]}, max_per_session=8)
    served.append(first)
    second = await serve({"allow": ["up.test"]}, session="s2", proxy=first.proxy)
    served.append(second)
    # When the first holds 8 tunnels open and asks for 20 more
    held = []
    for _ in range(8):
        reader, writer = await request(first.http, connect_head("up.test:443"))
        assert await status_line(reader) == "HTTP/1.1 200 Connection established"
        held.append(writer)
    flood = [await request(first.http, connect_head("up.test:443")) for _ in range(20)]
    # Then the 20 are closed unanswered, while the second session is served
    for reader, writer in flood:
        assert await unanswered(reader)
        writer.close()
    reader, writer = await request(second.http, connect_head("up.test:443"))
    assert await status_line(reader) == "HTTP/1.1 200 Connection established"
    writer.close()
    assert first.proxy.statistics()["s1"]["dropped"] == 20
    # And once the first lets go, it is served again
    for writer in held:
        writer.close()
    while first.proxy.statistics()["s1"]["active"]:
        await asyncio.sleep(0.01)
    reader, writer = await request(first.http, connect_head("up.test:443"))
    assert await status_line(reader) == "HTTP/1.1 200 Connection established"
    writer.close()


# --- asking (N6) ---


@pytest.mark.spec("N6")
async def test_N6_connections_to_one_name_share_one_question_and_a_remembered_answer(
    served: list[Served],
) -> None:
    s = await serve({"allow": [], "ask": True})
    served.append(s)
    # Given three connections to a name no rule names
    pending = [await request(s.http, connect_head("up.test:443", call="c2")) for _ in range(3)]
    await s.uplink.asked.wait()
    await asyncio.sleep(0.05)  # the other two reach the proxy too
    # Then one question went up, naming the host, the port and the call
    (ask,) = s.uplink.of("ask")
    assert (ask["host"], ask["port"], ask["call"], ask["session"]) == ("up.test", 443, "c2", "s1")
    # When it is allowed for the session: all three go through, and a fourth is not asked
    s.proxy.answer(ask["id"], allow=True, remember=True, by="client", reason="")
    for reader, writer in pending:
        assert await status_line(reader) == "HTTP/1.1 200 Connection established"
        writer.close()
    reader, writer = await request(s.http, connect_head("up.test:443"))
    assert await status_line(reader) == "HTTP/1.1 200 Connection established"
    writer.close()
    assert len(s.uplink.of("ask")) == 1
    # But another port of it is another question, and a denial without scope holds once
    reader, writer = await request(s.http, connect_head("up.test:8443"))
    while len(s.uplink.of("ask")) < 2:
        await asyncio.sleep(0.01)
    s.proxy.answer(
        s.uplink.of("ask")[1]["id"], allow=False, remember=False, by="client", reason="no"
    )
    assert "(client: no)" in await status_line(reader)
    writer.close()
    reader, writer = await request(s.http, connect_head("up.test:8443"))
    while len(s.uplink.of("ask")) < 3:
        await asyncio.sleep(0.01)
    writer.close()


@pytest.mark.spec("N6", "N12")
async def test_N6_past_16_questions_pending_a_connection_is_refused_at_once(
    served: list[Served],
) -> None:
    s = await serve({"allow": [], "ask": True})
    served.append(s)
    waiting = [
        await request(s.http, connect_head(f"h{i}.test:443")) for i in range(MAX_PENDING_ASKS)
    ]
    while len(s.uplink.of("ask")) < MAX_PENDING_ASKS:
        await asyncio.sleep(0.01)
    # The 17th name is refused without a question
    reader, writer = await request(s.http, connect_head("h99.test:443"))
    assert "16 network approvals pending already" in await status_line(reader)
    writer.close()
    assert len(s.uplink.of("ask")) == MAX_PENDING_ASKS
    # The session closing answers the rest: refused, nothing left waiting
    await s.proxy.close_session("s1")
    for reader, writer in waiting:
        assert await unanswered(reader)
        writer.close()
    assert repr(s.proxy) == "<EgressProxy [0 sessions, 0 connections, 0 approvals pending]>"
