"""Prohibit rules in a command's network namespace, added over rtnetlink (SPEC X3).

    add_prohibit_rules(netns_fd, host.local)   # before the command starts

Each address gets a ``prohibit`` policy rule of priority ``RULE_PRIORITY``, so the
command (which has no capabilities and cannot remove them) cannot reach this host.
The socket is opened by a short-lived thread that enters the namespace, so the
caller's own threads never change namespace. Used when the namespace belongs to our
own user namespace (or we are root); otherwise network.py runs ``ip`` via nsenter.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from collections.abc import Iterable

from toolpool.errors import ToolpoolError
from toolpool.sandbox.hostnet import IPNetwork

CLONE_NEWNET = 0x40000000
RULE_PRIORITY = 5  # of the prohibit rules; the ip fallback in network.py uses it too


# Here, the lowest module that raises it; network.py re-exports it.
class NetworkSetupError(ToolpoolError):
    """The outbound-only network namespace of a command could not be set up.
    ``again``: another attempt may be made at once (pasta ended early; a setup that
    ran out of time waited its time already)."""

    def __init__(self, message: str, *, again: bool = False) -> None:
        super().__init__(message)
        self.again = again


_RTM_NEWRULE = 32
_NLMSG_ERROR = 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_FRA_DST, _FRA_PRIORITY = 1, 6
_FR_ACT_PROHIBIT = 8


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _rule_message(net: IPNetwork, seq: int) -> bytes:
    family = socket.AF_INET if net.version == 4 else socket.AF_INET6
    header = struct.pack("=BBBBBBBBI", family, net.prefixlen, 0, 0, 0, 0, 0, _FR_ACT_PROHIBIT, 0)
    body = header + _attr(_FRA_DST, net.network_address.packed)
    body += _attr(_FRA_PRIORITY, struct.pack("=I", RULE_PRIORITY))
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL
    return struct.pack("=IHHII", 16 + len(body), _RTM_NEWRULE, flags, seq, 0) + body


def _netlink_in(netns_fd: int) -> socket.socket:
    """An rtnetlink socket of the namespace ``netns_fd``: a thread of its own enters
    it, opens the socket, and ends (only that thread ever changes namespace)."""
    made: list[socket.socket | BaseException] = []

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            if libc.setns(netns_fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns: {os.strerror(err)}")
            made.append(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE))
        except BaseException as exc:
            made.append(exc)

    thread = threading.Thread(target=enter, name="toolpool-netns")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise NetworkSetupError(f"cannot enter the command's network namespace: {made[0]}")
    return made[0]


def add_prohibit_rules(netns_fd: int, nets: Iterable[IPNetwork]) -> None:
    messages = [_rule_message(net, seq) for seq, net in enumerate(nets, start=1)]
    with _netlink_in(netns_fd) as sock:
        sock.sendall(b"".join(messages))
        pending = set(range(1, len(messages) + 1))
        while pending:
            data = sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
                if kind == _NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", data, offset + 16)
                    if error != 0:
                        why = os.strerror(-error)
                        raise NetworkSetupError(
                            f"cannot add a prohibit rule in the namespace: {why}"
                        )
                    pending.discard(seq)
                offset += max(length + (-length % 4), 16)
