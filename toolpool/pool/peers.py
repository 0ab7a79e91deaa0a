"""Who may speak to a local socket: never a confined process to the daemon (X2).

ZeroMQ asks a ZAP handler about every new connection; for a Unix socket the peer's
address carries its credentials (``localhost:UID:GID:PID``, from SO_PEERCRED). The
daemon's local socket uses the ZAP domain ``LOCAL_DOMAIN``, and the guard refuses a
peer that descends from the pool's zygote or lives in one of the pool's cgroups: a
Python tool's ``execute`` (or anything it starts) that found the socket still cannot
open a session. The pool's workers' socket uses the same guard with its own rule
(a worker, once). Every other request (CURVE on TCP) goes to pyzmq's authenticator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

LOCAL_DOMAIN = "toolpool-local"

log = logging.getLogger(__name__)


def peer_pid(address: bytes) -> int | None:
    """The pid in a ZAP address of a Unix-socket peer, else None."""
    parts = address.decode(errors="replace").split(":")
    if len(parts) == 4 and parts[3].isdigit():
        return int(parts[3])
    return None


class PeerGuard(ThreadAuthenticator):
    """ZAP handler of the daemon's context. ``confined(pid)`` says whether a local
    peer is one of the pool's confined processes."""

    def __init__(
        self,
        context: zmq.Context[Any],
        confined: Callable[[int], bool],
        refusing: str = "a confined process",
    ) -> None:
        super().__init__(context)
        self._confined = confined
        self._refusing = refusing  # what a refused peer is, for the log
        self.refused = 0

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) < 6 or msg[2].decode(errors="replace") != LOCAL_DOMAIN:
            await super().handle_zap_message(msg)
            return
        request_id, address = msg[1], msg[3]
        pid = peer_pid(address)
        if pid is None or self._confined(pid):
            self.refused += 1
            log.warning("refused a local connection from %s (pid %s)", self._refusing, pid)
            self._send_zap_reply(request_id, b"400", b"not allowed to connect")
            return
        self._send_zap_reply(request_id, b"200", b"OK")
