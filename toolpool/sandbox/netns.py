"""A policy session's own network namespace (SPEC N3): loopback up and nothing else —
no other device, no route out, no resolver — with the session's proxy listeners bound
on its loopback, made once for the session and held by a descriptor.

    net = SessionNetwork.make(ports=(3128, 1080))   # in a thread; root only
    net.listeners          # listening sockets *in* the namespace, for the proxy
    net.path               # /proc/<pid>/fd/<n>: what a worker or nsenter enters
    net.close()

The session's sandboxes are started in it (nsenter, no ``--unshare-net``), so every
sandbox of the session — and its Python tools' workers — shares one namespace, and
one pair of listeners, whatever restarts (a checkpoint's, B1). A listener made in a
namespace belongs to it: the proxy, which lives in the host's namespace, holds it
and accepts what comes to it, and nothing outside the namespace can reach it.

It is made by a thread of its own that leaves the daemon's namespace for a new one
(unshare CLONE_NEWNET, which a thread may do alone) and ends there: nothing else of
the process ever runs in it. That needs CAP_SYS_ADMIN in the daemon's user
namespace: a daemon not run as root is refused, saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x1, 0x8, 0x40
T = TypeVar("T")


class NetnsError(OSError):
    """The namespace could not be made; the message says why."""


class SessionNetwork:
    """One session's namespace and its listeners (see the module)."""

    def __init__(self, fd: int, listeners: list[socket.socket]) -> None:
        self.fd = fd
        self.listeners = listeners

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    @property
    def inode(self) -> int:
        """The namespace's own number (what the path must still name when used)."""
        return os.fstat(self.fd).st_ino

    @classmethod
    def make(cls, ports: Sequence[int], address: str = "127.0.0.1") -> SessionNetwork:
        """A new namespace with a listener on ``address`` at each of ``ports``.
        Raises NetnsError."""
        if os.geteuid() != 0:
            raise NetnsError(
                "a network policy needs a daemon run as root here (its sessions' "
                "network namespaces are made in the daemon's own user namespace)"
            )

        def made() -> SessionNetwork:
            if _libc().unshare(_CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise NetnsError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _loopback_up()
                return cls(fd, _listeners(ports, address))
            except BaseException:
                os.close(fd)
                raise

        return _in_thread(made)

    def listen_again(self, ports: Sequence[int], address: str = "127.0.0.1") -> None:
        """New listeners in this namespace (the proxy that held them ended)."""
        for listener in self.take_listeners():
            listener.close()

        def made() -> list[socket.socket]:
            if _libc().setns(self.fd, _CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise NetnsError(errno, f"setns(CLONE_NEWNET): {os.strerror(errno)}")
            return _listeners(ports, address)

        self.listeners = _in_thread(made)

    def take_listeners(self) -> list[socket.socket]:
        """The listeners, handed over (to the proxy): they are no longer closed here."""
        listeners, self.listeners = self.listeners, []
        return listeners

    def close(self) -> None:
        for listener in self.take_listeners():
            listener.close()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _in_thread(make: Callable[[], T]) -> T:
    """``make()`` in a thread of its own, which ends in whatever namespace ``make``
    moved it to: nothing else of the process ever runs there."""
    made: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            made.append(make())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="toolpool-netns")
    thread.start()
    thread.join()
    if failed:
        if isinstance(failed[0], NetnsError):
            raise failed[0]
        raise NetnsError(f"cannot make the session's network namespace: {failed[0]}")
    return made[0]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _listeners(ports: Sequence[int], address: str) -> list[socket.socket]:
    listeners: list[socket.socket] = []
    try:
        for port in ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(listener)
            # Listeners made again (the proxy that held them ended) find the port's
            # connections in TIME_WAIT: they must not keep it from being bound.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(512)
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def _loopback_up() -> None:
    """A new namespace's ``lo`` is down: up, as bubblewrap's ``--unshare-net`` does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING)
        fcntl.ioctl(sock, _SIOCSIFFLAGS, request)
