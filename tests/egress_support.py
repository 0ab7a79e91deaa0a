"""What the network policy tests through a daemon share (SPEC N1–N12): servers and
listeners of the test's own — on loopback and on this host's own address, never
anywhere else — that record whatever reaches them, and a daemon whose proxy pins
test names to them (``network_resolve``)."""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool import ToolCall
from toolpool.models import ToolResult
from toolpool.sandbox.hostnet import HostNetwork
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import Daemon, shared_daemon


def usable() -> bool:
    """Policy sessions need session sandboxes, nsenter and a daemon run as root."""
    return (
        os.geteuid() == 0
        and shutil.which("nsenter") is not None
        and SandboxProfile.probe().active("session")
    )


REASON = "network policies need session sandboxes, nsenter and a daemon run as root"


def host_address() -> str:
    """This host's own IPv4 address (not loopback): where a direct attempt may aim."""
    for network in HostNetwork.read().local:
        if network.version == 4:
            return str(network.network_address)
    return "127.0.0.1"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append({"path": self.path, "host": self.headers.get("Host")})  # type: ignore[attr-defined]
        body = f"{self.server.name} {self.path}\n".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class WebServer(http.server.ThreadingHTTPServer):
    """An HTTP server on loopback that names itself in its answers and records the
    path and Host of every request."""

    daemon_threads = True

    def __init__(self, name: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.name = name
        self.seen: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@dataclass
class Recorder:
    """TCP and UDP listeners on ``addresses``: whatever connects or arrives is kept."""

    addresses: list[str]
    tcp: list[socket.socket] = field(default_factory=list)
    udp: list[socket.socket] = field(default_factory=list)
    got: list[tuple[str, bytes]] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        port = 0
        for address in self.addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            stream = socket.socket(family)
            stream.bind((address, port))
            port = stream.getsockname()[1]
            stream.listen()
            dgram = socket.socket(family, socket.SOCK_DGRAM)
            dgram.bind((address, port))
            self.tcp.append(stream)
            self.udp.append(dgram)
        self.port = port
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import selectors

        with selectors.DefaultSelector() as selector:
            for sock in (*self.tcp, *self.udp):
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(0.1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock.type == socket.SOCK_STREAM:
                        conn, peer = sock.accept()
                        conn.settimeout(2)
                        try:
                            data = conn.recv(65536)
                        except OSError:
                            data = b""
                        self.got.append((f"tcp from {peer[0]}", data))
                        conn.close()
                    else:
                        data, peer = sock.recvfrom(65536)
                        self.got.append((f"udp from {peer[0]}", data))

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        for sock in (*self.tcp, *self.udp):
            sock.close()


@dataclass
class Site:
    """The daemon and what its proxy's pinned names lead to."""

    daemon: Daemon
    allowed: WebServer  # allowed.test, asked.test
    evil: WebServer  # evil.test
    recorder: Recorder  # raw.test (TCP), and the target of every direct attempt
    audit: Path


@contextmanager
def site(tmp: Path, *flags: str) -> Iterator[Site]:
    allowed, evil = WebServer("allowed"), WebServer("evil")
    addresses = ["127.0.0.1", host_address()]
    own6 = [n.network_address for n in HostNetwork.read().local if n.version == 6]
    if socket.has_ipv6 and own6:
        addresses.append("::1")
        addresses += [str(a) for a in own6 if not a.is_link_local][:1]
    recorder = Recorder(sorted(set(addresses), key=addresses.index))
    audit = tmp / "audit.log"
    pins = {
        "allowed.test": allowed.port,
        "asked.test": allowed.port,
        "evil.test": evil.port,
        "raw.test": recorder.port,
    }
    pinned = [f"--network-resolve={name}=127.0.0.1:{port}" for name, port in pins.items()]
    try:
        with shared_daemon(
            tmp,
            *pinned,
            "--tool-modules=tests.network_tools",
            f"--audit-log={audit}",
            *flags,
        ) as daemon:
            yield Site(daemon, allowed, evil, recorder, audit)
    finally:
        allowed.stop()
        evil.stop()
        recorder.stop()


def run(session: Any, command: str, call_id: str = "c1") -> ToolResult:
    (result,) = session.submit([ToolCall(call_id, "bash", {"command": command})]).results()
    return result


def out(result: ToolResult) -> str:
    """A command's output, once it is known to have run to its end."""
    assert not result.is_error, result.text
    return result.text.rsplit("\nExit code:", 1)[0]


def records(audit: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's connection records written so far (the writer batches: a record
    may take half a second to arrive; callers wait for what they need)."""
    if not audit.exists():
        return []
    lines = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]
    return [r for r in lines if r.get("kind") == "connection" and r["session"] == session_id]


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
