"""What a client of the proxy asks for, read with bounds (SPEC N3, N12): an HTTP
proxy request (``CONNECT host:port`` for a tunnel, or an absolute-form
``GET http://host/path`` to forward) or a SOCKS5 ``CONNECT`` (names resolved by the
proxy). Every read is bounded in bytes; the caller bounds it in time.

Each parser returns a ``Target`` — the host as the client named it, its port, the
call token the client presented (its proxy credentials), and for a forwarded HTTP
request the head to send upstream — or raises ``Refused`` with what to answer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 16 * 1024  # an HTTP request head, request line and headers
MAX_HEADERS = 100
_HOP_BY_HOP = frozenset(
    {b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive", b"host", b"te"}
)


class Refused(Exception):
    """The request cannot be served: ``status`` (HTTP) or ``reply`` (SOCKS) and why."""

    def __init__(self, why: str, *, status: int = 400, reply: int = 1) -> None:
        super().__init__(why)
        self.why = why
        self.status = status
        self.reply = reply


@dataclass(frozen=True, slots=True)
class Target:
    """Where the client wants to go."""

    host: str
    port: int
    user: str = ""  # the proxy credentials' user and password: the call's token
    password: str = ""
    forward: bytes = b""  # a forwarded HTTP request's head, rewritten for the origin
    kind: str = "connect"  # "connect" (HTTP tunnel), "http" (forwarded), "socks"
    body: int = 0  # a forwarded request's body: the bytes that follow it upstream


# --- HTTP -------------------------------------------------------------------------------


async def read_http(reader: asyncio.StreamReader) -> Target:
    """One proxy request's head. The reader's limit must be at least MAX_HEAD_BYTES."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise Refused(f"request head over {MAX_HEAD_BYTES} bytes", status=431) from None
    except asyncio.IncompleteReadError:
        raise Refused("the connection ended inside the request head") from None
    if len(head) > MAX_HEAD_BYTES:
        raise Refused(f"request head over {MAX_HEAD_BYTES} bytes", status=431)
    return parse_http(head)


def parse_http(head: bytes) -> Target:
    lines = head[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise Refused(f"more than {MAX_HEADERS} header lines", status=431)
    words = lines[0].split(b" ")
    if len(words) != 3 or not words[2].startswith(b"HTTP/1."):
        raise Refused("not an HTTP/1 request line")
    method, target, version = words
    headers: list[tuple[bytes, bytes, bytes]] = []  # lower-case name, name, value
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise Refused("a malformed header line")
        headers.append((name.lower(), name, value.strip()))
    user, password = _credentials(headers)
    if method == b"CONNECT":
        host, port = split_authority(target.decode("latin-1"), None)
        return Target(host, port, user, password)
    text = target.decode("latin-1")
    if not text.lower().startswith("http://"):
        # An origin-form request ("GET / HTTP/1.1" with a Host header) is what a
        # transparent proxy takes: this one is asked by name only, in the request.
        raise Refused("expected CONNECT host:port or an absolute http:// URL")
    parts = urlsplit(text)
    host, port = split_authority(parts.netloc.rpartition("@")[2], 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # The origin gets the name the proxy judged as its Host, whatever the client put
    # there, and a request that ends the connection: a second request on it could
    # name another host, which would reach this one's server.
    authority = parts.netloc.rpartition("@")[2]
    out = [method + b" " + path.encode("latin-1") + b" " + version]
    out.append(b"Host: " + authority.encode("latin-1"))
    out += [name + b": " + value for key, name, value in headers if key not in _HOP_BY_HOP]
    out.append(b"Connection: close")
    # Only the request's own body follows it upstream: a request pipelined after it
    # (which may name another host) never reaches this host's server.
    body = 0
    for key, _, value in headers:
        if key == b"transfer-encoding":
            raise Refused(
                "a request body of unknown length over plain http (use https, or a Content-Length)",
                status=411,
            )
        if key == b"content-length":
            if not value.isdigit():
                raise Refused("a bad Content-Length")
            body = int(value)
    head = b"\r\n".join(out) + b"\r\n\r\n"
    return Target(host, port, user, password, head, "http", body)


def split_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as host and port; Refused when it is neither."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise Refused(f"a malformed authority {text[:100]!r}")
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise Refused(f"a malformed IPv6 address {host[:100]!r}") from None
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise Refused(f"expected host:port, not {text[:100]!r}")
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise Refused(f"a bad port in {text[:100]!r}")
    if not host:
        raise Refused(f"no host in {text[:100]!r}")
    return host, int(port_text)


def _credentials(headers: list[tuple[bytes, bytes, bytes]]) -> tuple[str, str]:
    for name, _, value in headers:
        if name == b"proxy-authorization":
            scheme, _, encoded = value.partition(b" ")
            if scheme.lower() != b"basic":
                return "", ""
            try:
                user, _, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return "", ""
            return user.decode("utf-8", "replace"), password.decode("utf-8", "replace")
    return "", ""


def http_refusal(status: int, reason: str, line: str) -> bytes:
    """A refusal an HTTP client shows: ``status`` with ``reason`` as its phrase (what
    a tunnel's client prints) and ``line`` as its one-line body."""
    phrase = " ".join(reason.split())[:200]
    body = (line.replace("\r", " ").replace("\n", " ")[:500] + "\n").encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1", "replace") + body


# --- SOCKS5 ------------------------------------------------------------------------------

SOCKS_NOT_ALLOWED = 2  # "connection not allowed by ruleset"
SOCKS_HOST_UNREACHABLE = 4
SOCKS_REFUSED = 5
SOCKS_COMMAND = 7
SOCKS_ADDRESS_TYPE = 8


async def read_socks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Target:
    """A SOCKS5 greeting, its user/password (RFC 1929) if the client offers one, and a
    CONNECT request. Anything else is Refused (answered by ``socks_reply``, unless
    the greeting itself was bad: then the connection just ends)."""
    try:
        version, count = await reader.readexactly(2)
        if version != 5:
            raise Refused("not SOCKS5", reply=-1)
        methods = await reader.readexactly(count)
        user = password = ""
        if 2 in methods:  # user/password: it carries the call's token
            writer.write(b"\x05\x02")
            sub, length = await reader.readexactly(2)
            name = await reader.readexactly(length)
            (length,) = await reader.readexactly(1)
            secret = await reader.readexactly(length)
            if sub != 1:
                raise Refused("bad user/password negotiation", reply=-1)
            writer.write(b"\x01\x00")
            user = name.decode("utf-8", "replace")
            password = secret.decode("utf-8", "replace")
        elif 0 in methods:
            writer.write(b"\x05\x00")
        else:
            writer.write(b"\x05\xff")
            raise Refused("no acceptable authentication method", reply=-1)
        version, command, _, kind = await reader.readexactly(4)
        if version != 5:
            raise Refused("not a SOCKS5 request")
        if kind == 1:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        elif kind == 4:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        elif kind == 3:
            (length,) = await reader.readexactly(1)
            host = (await reader.readexactly(length)).decode("utf-8", "replace")
        else:
            raise Refused("unknown address type", reply=SOCKS_ADDRESS_TYPE)
        port = int.from_bytes(await reader.readexactly(2), "big")
    except asyncio.IncompleteReadError:
        raise Refused("the connection ended inside the SOCKS request", reply=-1) from None
    if command != 1:
        raise Refused("only CONNECT is offered (no BIND, no UDP)", reply=SOCKS_COMMAND)
    if port == 0:
        raise Refused("port 0", reply=SOCKS_NOT_ALLOWED)
    return Target(host, port, user, password, kind="socks")


def socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])
