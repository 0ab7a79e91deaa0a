"""Where the proxy connects for a connection it allowed (SPEC N4, N10): the address
the operator pinned the name to, else the name's addresses — resolved here — that are
not this host's, in the resolver's order.

    dialer = Dialer(pins, HostAddresses())
    address, reader, writer = await dialer.dial("pypi.org", 443)   # or Unreachable
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from toolpool.egress.addresses import HostAddresses, Pin
from toolpool.egress.rules import PolicyError, ip_literal, normal_name

RESOLVE_SECONDS = 15.0
CONNECT_SECONDS = 30.0

Resolver = Callable[[str, int], Awaitable[list[str]]]


class Unreachable(Exception):
    """No connection: ``refused`` when the address guard said no (every address is
    this host's), else the network (no address, nothing answered)."""

    def __init__(self, why: str, *, refused: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.refused = refused


async def resolve(host: str, port: int) -> list[str]:
    """The host's addresses, by the resolver of this host (getaddrinfo, in a thread)."""
    found = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in found))


class Dialer:
    def __init__(
        self, pins: dict[str, Pin], addresses: HostAddresses, resolver: Resolver | None = None
    ) -> None:
        self._pins = pins
        self._addresses = addresses
        self._resolve = resolver or resolve

    async def dial(self, host: str, port: int) -> tuple[str, asyncio.StreamReader, Any]:
        """A connection to ``host`` (as the client named it) at ``port``: the address
        it connected to, and its streams. Raises Unreachable."""
        last = "no address"
        for address, to_port in await self._candidates(host, port):
            try:
                async with asyncio.timeout(CONNECT_SECONDS):
                    reader, writer = await asyncio.open_connection(address, to_port)
            except TimeoutError:
                last = f"{address} port {to_port}: timed out"
                continue
            except OSError as exc:
                last = f"{address} port {to_port}: {exc.strerror or exc}"
                continue
            return f"{address}:{to_port}", reader, writer
        raise Unreachable(f"cannot connect ({last})")

    async def _candidates(self, host: str, port: int) -> list[tuple[str, int]]:
        literal = ip_literal(host)
        if literal is None:
            with contextlib.suppress(PolicyError):
                pinned = self._pins.get(normal_name(host))
                if pinned is not None:  # the operator's word: even this host's address
                    return [(pinned[0], pinned[1] or port)]
            try:
                async with asyncio.timeout(RESOLVE_SECONDS):
                    found = await self._resolve(host, port)
            except (OSError, TimeoutError, UnicodeError) as exc:
                raise Unreachable(f"{host} does not resolve ({exc})") from None
        else:
            found = [str(literal)]
        candidates, refusals = [], []
        for text in found:
            address = ip_literal(text)
            why = "not an address" if address is None else self._addresses.refusal(address)
            if why is None:
                candidates.append((text, port))
            else:
                refusals.append(f"{text} is {why}")
        if not candidates:
            shown = "; ".join(refusals[:3]) or "no address"
            if literal is not None:  # an address a rule named: it is this host's
                raise Unreachable(f"{shown}, this host's", refused=True)
            raise Unreachable(f"it resolves to this host only ({shown})", refused=True)
        return candidates
