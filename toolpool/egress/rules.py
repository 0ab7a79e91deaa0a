"""A session's network policy and how a connection is judged by it (SPEC N1, N2).

    policy = NetworkPolicy.parse({"allow": ["pypi.org", "*.github.com:443"],
                                  "deny": ["gist.github.com"], "ask": True})
    policy.judge("api.github.com", 443)   # Verdict(ALLOW, 'allow "*.github.com:443"')
    policy.judge("gist.github.com", 443)  # Verdict(DENY, 'deny "gist.github.com"')
    policy.judge("example.org", 443)      # Verdict(ASK, "no rule names it")

A pattern is a name (``example.com``: that name only), a wildcard (``*.example.com``:
its subdomains at any depth, not the name itself), ``*`` (every name, never an IP
address), or an IP address (``10.0.0.5``, ``[2001:db8::1]``), each with an optional
``:port`` (without one it matches every port). Deny wins over allow; a connection
that matches neither is asked about with ``ask``, else refused. An IP address is
matched only by a pattern naming that address: ``*`` and wildcards never match one.

Names are compared in one form: lower case, the trailing dot dropped, international
names in their ASCII (IDNA) form, at most 253 characters of letters, digits,
hyphens, underscores and dots. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MAX_RULES = 1024  # patterns in allow and deny together
MAX_UNIX_SOCKETS = 256
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


class PolicyError(ValueError):
    """A policy, pattern or name that cannot be used; the message says why."""


class Action(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy says of one connection; ``rule`` names the rule that decided,
    as the refusal and the audit record show it (``deny "evil.com"``), or why none
    did."""

    action: Action
    rule: str


def normal_name(name: str) -> str:
    """``name`` in the one form names are compared in; PolicyError when it is none."""
    if not isinstance(name, str) or not name:
        raise PolicyError("expected a host name")
    text = name.strip()
    text = text[:-1] if text.endswith(".") else text
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise PolicyError(f"{name[:80]!r} is not a valid international name") from None
    text = text.lower()
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in text.split(".")):
        raise PolicyError(f"{name[:80]!r} is not a host name")
    return text


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` spells (``1.2.3.4``, ``::1``, ``[::1]``), else None. Forms
    a resolver would read as an address (``127.1``, ``0x7f.1``, ``2130706433``) count
    as one too: a name of digits alone is never a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        pass
    # inet_aton's forms: one to four parts, decimal, octal or hex.
    parts = text.rstrip(".").split(".")
    if 1 <= len(parts) <= 4 and all(re.fullmatch(r"(0x[0-9a-f]*|[0-9]+)", p, re.I) for p in parts):
        try:
            values = [int(p, 0) if not re.fullmatch(r"0[0-7]+", p) else int(p, 8) for p in parts]
        except ValueError:
            return ipaddress.IPv4Address(0)  # nonsense digits: an address all the same
        *head, last = values
        number = 0
        for value in head:
            number = number * 256 + (value & 0xFF)
        number = (number << (8 * (4 - len(head)))) + last if head else last
        return ipaddress.IPv4Address(number & 0xFFFFFFFF)
    return None


@dataclass(frozen=True, slots=True)
class Pattern:
    """One rule's pattern: ``host`` is a name, ``*.suffix``, ``*`` or an address in
    its normal form; ``port`` None for every port."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, text: Any) -> Pattern:
        if not isinstance(text, str) or not text.strip():
            raise PolicyError(f"expected a pattern such as 'example.com', not {text!r}")
        raw = text.strip()
        host, port = raw, None
        if raw.startswith("["):  # [v6] or [v6]:port
            end = raw.find("]")
            if end < 0:
                raise PolicyError(f"{raw!r}: an IPv6 address in [] has no closing ]")
            host, rest = raw[: end + 1], raw[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise PolicyError(f"{raw!r}: expected :PORT after the ]")
                port = _port(rest[1:], raw)
        elif raw.count(":") == 1:
            host, _, port_text = raw.partition(":")
            port = _port(port_text, raw)
        address = ip_literal(host)
        if address is not None:
            return cls(str(address), port)
        if host == "*":
            return cls("*", port)
        if host.startswith("*."):
            return cls("*." + normal_name(host[2:]), port)
        if "*" in host:
            raise PolicyError(f"{raw!r}: a wildcard goes first and alone ('*.example.com')")
        return cls(normal_name(host), port)

    def matches(self, host: str, port: int, is_address: bool) -> bool:
        """Whether this pattern covers ``host`` (normal form) at ``port``."""
        if self.port is not None and self.port != port:
            return False
        if is_address:
            return self.host == host
        if self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return self.host == host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def _port(text: str, raw: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise PolicyError(f"{raw!r}: the port must be a number from 1 to 65535")
    return int(text)


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """``network = {"allow": [...], "deny": [...], "ask": bool, "unix_sockets": [...]}``:
    what a policy session's commands may reach through its proxy (SPEC N1), and the
    pathname Unix sockets outside its roots they may still connect to (N9)."""

    allow: tuple[Pattern, ...] = ()
    deny: tuple[Pattern, ...] = ()
    ask: bool = False
    unix_sockets: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, value: Any) -> NetworkPolicy:
        if not isinstance(value, Mapping):
            raise PolicyError("expected {'allow': [...], 'deny': [...], 'ask': true|false}")
        unknown = sorted(set(value) - {"allow", "deny", "ask", "unix_sockets"})
        if unknown:
            raise PolicyError(f"unknown key {unknown[0]!r} (known: allow, deny, ask, unix_sockets)")
        allow = _patterns(value.get("allow", ()), "allow")
        deny = _patterns(value.get("deny", ()), "deny")
        if len(allow) + len(deny) > MAX_RULES:
            raise PolicyError(f"at most {MAX_RULES} patterns in allow and deny together")
        ask = value.get("ask", False)
        if not isinstance(ask, bool):
            raise PolicyError(f"ask = {ask!r}: expected true or false")
        return cls(allow, deny, ask, _socket_paths(value.get("unix_sockets", ())))

    def judge(self, host: str, port: int) -> Verdict:
        """The verdict on a connection to ``host`` (a name as the client asked for it,
        or an address) at ``port``. A host that is neither a name nor an address is
        refused."""
        address = ip_literal(host)
        if address is not None:
            key, is_address = str(address), True
        else:
            try:
                key, is_address = normal_name(host), False
            except PolicyError:
                return Verdict(Action.DENY, "not a host name")
        for pattern in self.deny:
            if pattern.matches(key, port, is_address):
                return Verdict(Action.DENY, f'deny "{pattern}"')
        for pattern in self.allow:
            if pattern.matches(key, port, is_address):
                return Verdict(Action.ALLOW, f'allow "{pattern}"')
        if is_address:
            # An address is never asked about: a rule names it or it is refused.
            return Verdict(Action.DENY, "an IP address that no rule names")
        if self.ask:
            return Verdict(Action.ASK, "no rule names it")
        return Verdict(Action.DENY, "no rule allows it")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "allow": [str(p) for p in self.allow],
            "deny": [str(p) for p in self.deny],
            "ask": self.ask,
        }
        if self.unix_sockets:
            wire["unix_sockets"] = list(self.unix_sockets)
        return wire


def _patterns(value: Any, key: str) -> tuple[Pattern, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise PolicyError(f"{key}: expected a list of patterns ('example.com', '*.example.com')")
    try:
        return tuple(dict.fromkeys(Pattern.parse(p) for p in value))
    except PolicyError as exc:
        raise PolicyError(f"{key}: {exc}") from None


def _socket_paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise PolicyError("unix_sockets: expected a list of absolute paths")
    if len(value) > MAX_UNIX_SOCKETS:
        raise PolicyError(f"unix_sockets: at most {MAX_UNIX_SOCKETS} paths")
    for path in value:
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise PolicyError(f"unix_sockets: {path!r} is not an absolute path")
    return tuple(dict.fromkeys(value))
