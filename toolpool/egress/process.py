"""``python -m toolpool.egress``: the egress proxy's process (SPEC N3).

One per daemon, started by the pool when its first policy session needs it, a
process of its own in a cgroup of its own (``--cgroup-procs``: it joins them before
anything else, so its memory and process limits are its own, not the daemon's). It
lives in the host's network namespace — it must reach the outside — and listens
nowhere there: its only listeners are the sessions', made in their namespaces and
passed to it over the control socket. It dies with the daemon (parent-death signal),
and ends when the control socket closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import resource
import signal
import socket
import sys
from typing import Any

from toolpool.egress.addresses import parse_pins
from toolpool.egress.control import ControlError, Sender, receive
from toolpool.egress.rules import NetworkPolicy
from toolpool.egress.server import EgressProxy
from toolpool.sandbox import linux

log = logging.getLogger("toolpool.egress")

STATS_SECONDS = 1.0  # counters go up at most this often, when they changed


class ControlLink:
    """The proxy's end of the control socket, on the event loop."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._loop = loop
        self._sender = Sender(sock)
        self._writing = False
        self.closed: asyncio.Future[None] = loop.create_future()

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._sender.send(message)
        except (BrokenPipeError, ConnectionError):
            self._end()
            return
        if self._sender.queue and not self._writing:
            self._writing = True
            self._loop.add_writer(self._sock, self._flush)

    def _flush(self) -> None:
        try:
            done = self._sender.flush()
        except (BrokenPipeError, ConnectionError):
            self._end()
            return
        if done:
            self._loop.remove_writer(self._sock)
            self._writing = False

    def _end(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def serve(sock: socket.socket, pins: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    link = ControlLink(sock, loop)
    proxy = EgressProxy(link, parse_pins(pins))
    work: set[asyncio.Task[None]] = set()

    def readable() -> None:
        while True:
            try:
                got = receive(sock)
            except BlockingIOError:
                return
            except ControlError as exc:
                log.error("%s", exc)
                continue
            except OSError:
                got = None
            if got is None:
                link._end()
                return
            message, fds = got
            task = loop.create_task(_handle(proxy, message, fds))
            work.add(task)
            task.add_done_callback(work.discard)

    loop.add_reader(sock, readable)
    link.send({"op": "ready", "pid": os.getpid()})
    last: dict[str, dict[str, int]] = {}
    try:
        while not link.closed.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STATS_SECONDS):
                    await asyncio.shield(link.closed)
            stats = proxy.statistics()
            if stats != last:
                link.send({"op": "stats", "sessions": stats})
                last = stats
    finally:
        loop.remove_reader(sock)
        await proxy.close()


async def _handle(proxy: EgressProxy, message: dict[str, Any], fds: list[int]) -> None:
    op = message.get("op")
    try:
        if op == "open" and len(fds) == 2:
            listeners = [socket.socket(fileno=fd) for fd in fds]
            fds = []
            await proxy.open_session(
                str(message["session"]),
                NetworkPolicy.parse(message["policy"]),
                bytes.fromhex(str(message["key"])),
                float(message["approval_seconds"]),
                listeners[0],
                listeners[1],
            )
        elif op == "close":
            await proxy.close_session(str(message["session"]))
        elif op == "answer":
            proxy.answer(
                int(message["id"]),
                allow=bool(message["allow"]),
                remember=bool(message.get("remember")),
                by=str(message.get("by", "client"))[:200],
                reason=str(message.get("reason", ""))[:500],
            )
        else:
            log.error("ignored a control message %r", op)
    except (KeyError, TypeError, ValueError) as exc:
        log.error("a bad %r control message: %s", op, exc)
    finally:
        for fd in fds:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolpool-egress")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--pins", default="{}", help="network_resolve, as JSON")
    parser.add_argument("--cgroup-procs", action="append", default=[])
    parser.add_argument("--user", type=int, help="the uid (and gid) to serve as")
    args = parser.parse_args(argv)
    for procs in args.cgroup_procs:  # before anything else: our limits are our own
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    if args.user is not None:
        # Nothing the proxy does needs privileges (its listeners come made): a flaw
        # in it then holds no root. What it imports later must be readable by that
        # user: the interpreter may not be (a home of 0700), so it is all imported
        # now. A credential change clears the parent-death signal: it is set after.
        importlib.import_module("encodings.idna")
        os.setgroups([])
        os.setgid(args.user)
        os.setuid(args.user)
    try:
        linux.die_with_parent(signal.SIGKILL)
    except ProcessLookupError:
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the daemon
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    sock = socket.socket(fileno=args.control_fd)
    pins = json.loads(args.pins)
    runner(serve(sock, pins))
    return 0
