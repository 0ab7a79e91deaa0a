"""Bytes both ways between a client of the proxy and where it connected, counted as
they pass (SPEC N3, N8): a tunnel's (CONNECT, SOCKS), or a forwarded request's —
whose client is read no further than the request's own body."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

RELAY_CHUNK = 256 * 1024

Count = Callable[[bool, int], None]  # (up, bytes): what passed, as it passes


async def relay(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_r: asyncio.StreamReader,
    upstream_w: asyncio.StreamWriter,
    count: Count,
    up_to: int | None = None,
) -> None:
    """Until both directions ended; ``up_to``: no more than that many bytes up."""

    async def body() -> None:
        left = up_to or 0
        while left > 0 and (data := await client_r.read(min(left, RELAY_CHUNK))):
            upstream_w.write(data)
            left -= len(data)
            count(True, len(data))
            await upstream_w.drain()

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, up: bool) -> None:
        try:
            while data := await source.read(RELAY_CHUNK):
                sink.write(data)
                count(up, len(data))
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
        except (ConnectionError, OSError):
            sink.transport.abort()

    up = body() if up_to is not None else pipe(client_r, upstream_w, True)
    await asyncio.gather(up, pipe(upstream_r, client_w, False))


async def flushed(writer: asyncio.StreamWriter) -> None:
    """What was written is on its way (or the client is gone), within 5 s."""
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        async with asyncio.timeout(5):
            await writer.drain()
