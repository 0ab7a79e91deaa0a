"""What a command's outbound-only network namespace must not reach: this host's
addresses, read from /proc, and its resolver, read from /etc/resolv.conf (SPEC X3).

    host = HostNetwork.read()
    host.local                  # every address of this host but loopback
    host.resolv_conf_inside()   # the resolv.conf the command sees, or None

A resolver only this host can reach (on loopback or on one of its addresses) is
reached through pasta's DNS forward at ``DNS_FORWARD_ADDRESS``.
"""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

# Queries sent to this address are forwarded by pasta to a resolver of this host that
# the namespace cannot reach directly (loopback, or one of this host's addresses).
DNS_FORWARD_ADDRESS = "169.254.0.53"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class HostNetwork:
    """What the namespace must not reach, and how names are resolved."""

    local: tuple[IPNetwork, ...]  # this host's addresses, loopback excluded
    resolv_conf: str
    dns_host: IPAddress | None  # a resolver only this host can reach, if any

    @classmethod
    def read(cls) -> HostNetwork:
        """The addresses of the calling process's network namespace (the host's)."""
        local = [n for n in (*_local_ipv4(), *_local_ipv6()) if not n.network_address.is_loopback]
        try:
            resolv = Path("/etc/resolv.conf").read_text()
        except OSError:
            resolv = ""
        # pasta forwards the queries to the first nameserver of the host's resolv.conf.
        servers = _nameservers(resolv)[:1]
        dns_host = None
        for server in servers:
            if server.is_loopback or any(
                server.version == n.version and server in n for n in local
            ):
                dns_host = server if server.version == 4 else None
        return cls(tuple(dict.fromkeys(local)), resolv, dns_host)

    def resolv_conf_inside(self) -> str | None:
        """The resolv.conf the command must see, or None to keep the host's."""
        if self.dns_host is None:
            return None
        lines = [ln for ln in self.resolv_conf.splitlines() if ln.split()[:1] != ["nameserver"]]
        return "\n".join([f"nameserver {DNS_FORWARD_ADDRESS}", *lines]) + "\n"


def _local_ipv4() -> list[IPNetwork]:
    """The local routes of /proc/net/fib_trie: one line names an address, the next
    says ``/32 host LOCAL``."""
    found: list[IPNetwork] = []
    try:
        text = Path("/proc/net/fib_trie").read_text()
    except OSError:
        return found
    last = ""
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("|--", "+--"):
            last = words[1]
        elif len(words) == 3 and words[1:] == ["host", "LOCAL"] and words[0].startswith("/"):
            with contextlib.suppress(ValueError):
                found.append(ipaddress.ip_network(f"{last}{words[0]}", strict=False))
    return found


def _local_ipv6() -> list[IPNetwork]:
    found: list[IPNetwork] = []
    try:
        text = Path("/proc/net/if_inet6").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        words = line.split()
        if words and len(words[0]) == 32:
            found.append(ipaddress.ip_network((int(words[0], 16), 128)))
    return found


def _nameservers(resolv: str) -> list[IPAddress]:
    servers: list[IPAddress] = []
    for line in resolv.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            with contextlib.suppress(ValueError):
                servers.append(ipaddress.ip_address(words[1].split("%")[0]))
    return servers
