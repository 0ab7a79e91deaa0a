"""Where the proxy may connect: anywhere but this host (SPEC N4), and the names the
operator pinned (``network_resolve``, SPEC N10).

Whatever a name resolves to — an attacker's DNS may answer 127.0.0.1 for the name an
allow rule names (rebinding) — the proxy never connects to a loopback, link-local,
unspecified, multicast or broadcast address, nor to an address of this host, in
either family and in IPv4-mapped form. The one exception is an address the operator
pinned a name to: ``network_resolve`` is the operator's word, never a model's.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Mapping
from typing import Any

from toolpool.egress.rules import PolicyError, normal_name
from toolpool.sandbox.hostnet import HostNetwork, IPAddress, IPNetwork

HOST_ADDRESSES_SECONDS = 2.0  # this host's addresses are read again after this long
_ZERO_NET = ipaddress.ip_network("0.0.0.0/8")
_BROADCAST = ipaddress.ip_address("255.255.255.255")

Pin = tuple[str, int | None]  # address, and the port every connection goes to (or None)


class PinError(ValueError):
    """A ``network_resolve`` entry that cannot be used; the message says why."""


def parse_pin(name: Any, target: Any) -> tuple[str, Pin]:
    """One ``NAME = "IP[:PORT]"`` entry: the name in its normal form, and the pin."""
    if not isinstance(target, str):
        raise PinError(f"{name!r}: expected 'IP' or 'IP:PORT', not {target!r}")
    try:
        key = normal_name(str(name))
    except PolicyError as exc:
        raise PinError(f"{name!r}: {exc}") from None
    text, port = target.strip(), None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = _port(rest.removeprefix(":"), name, target)
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(port_text, name, target)
    else:
        host = text
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None:
        raise PinError(f"{name!r} = {target!r}: expected an IP address, as 'IP' or 'IP:PORT'")
    return key, (str(address), port)


def pin_text(pin: Pin) -> str:
    """A pin as ``parse_pin`` reads it: ``IP``, ``IP:PORT`` or ``[IPv6]:PORT``."""
    address, port = pin
    if port is None:
        return address
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def parse_pins(table: Mapping[Any, Any]) -> dict[str, Pin]:
    return dict(parse_pin(name, target) for name, target in table.items())


def _port(text: str, name: Any, target: Any) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise PinError(f"{name!r} = {target!r}: the port must be a number from 1 to 65535")
    return int(text)


def unmapped(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (``::ffff:a.b.c.d``, ``::a.b.c.d``)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if int(address) >> 32 == 0 and int(address) > 1:  # IPv4-compatible (deprecated)
            return ipaddress.IPv4Address(int(address))
    return address


class HostAddresses:
    """Why an address is this host's (or no place to connect to), or None. This
    host's own addresses are read again every ``HOST_ADDRESSES_SECONDS``."""

    def __init__(self, extra: tuple[IPNetwork, ...] = ()) -> None:
        self._extra = extra  # tests add addresses of their own
        self._local: tuple[IPNetwork, ...] = ()
        self._read_at = -HOST_ADDRESSES_SECONDS

    def refusal(self, address: IPAddress) -> str | None:
        plain = unmapped(address)
        if plain.is_loopback or address.is_loopback:
            return "a loopback address"
        if plain.is_link_local or address.is_link_local:
            return "a link-local address"
        if plain.is_unspecified or (plain.version == 4 and plain in _ZERO_NET):
            return "an unspecified address"
        if plain.is_multicast or plain == _BROADCAST:
            return "a multicast or broadcast address"
        for network in (*self._host(), *self._extra):
            if plain.version == network.version and plain in network:
                return "an address of this host"
        return None

    def _host(self) -> tuple[IPNetwork, ...]:
        now = time.monotonic()
        if now - self._read_at >= HOST_ADDRESSES_SECONDS:
            self._local = HostNetwork.read().local
            self._read_at = now
        return self._local
