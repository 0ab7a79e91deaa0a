"""SPEC X3: a network-allowed command reaches the outside, never this host.

bubblewrap is launched here directly with OutboundNetwork's options; the listeners
are the test's own, on loopback and on this host's addresses.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from toolpool.sandbox import network
from toolpool.sandbox.network import HostNetwork, NetworkSetupError, OutboundNetwork

pytestmark = [
    pytest.mark.spec("X3"),
    pytest.mark.skipif(
        shutil.which("bwrap") is None or shutil.which("pasta") is None,
        reason="needs bwrap and pasta (Debian packages bubblewrap, passt)",
    ),
]

# Runs inside: tries every (address, port) of argv[1] (JSON), resolves argv[2], fetches
# argv[3]; prints one JSON object.
_INNER = r"""
import json, socket, ssl, sys, urllib.request
targets, host, url, cafile = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
out = {"connected": [], "refused": {}}
for addr, port in targets:
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        sockaddr = socket.getaddrinfo(addr, port, fam, socket.SOCK_STREAM)[0][4]
        with socket.socket(fam) as s:
            s.settimeout(3)
            s.connect(sockaddr)
            out["connected"].append([addr, port])
    except OSError as exc:
        out["refused"][f"{addr} {port}"] = str(exc)
try:
    found = socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    out["resolved"] = sorted({a[4][0] for a in found})
except OSError as exc:
    out["resolved"] = str(exc)
if url:
    try:
        ctx = ssl.create_default_context(cafile=cafile or None)
        with urllib.request.urlopen(url, timeout=30, context=ctx) as r:
            out["status"] = r.status
    except Exception as exc:
        out["status"] = repr(exc)
print(json.dumps(out))
"""


def _bwrap(net: OutboundNetwork, command: list[str], mounts: tuple[str, ...] = ()) -> list[str]:
    outer = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--ro-bind", "/", "/", *mounts]
    outer += ["--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--cap-drop", "ALL"]
    return [*outer, *net.bwrap_args(), "--", *command]


def _run(
    command: list[str], host: HostNetwork | None = None, pasta: str | None = None
) -> subprocess.CompletedProcess[str]:
    with OutboundNetwork(pasta=pasta, host=host) as net:
        proc = subprocess.Popen(
            _bwrap(net, command),
            pass_fds=net.pass_fds(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            net.start(timeout=10)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _index_url() -> str:
    """The package index pip uses (its configured index-url, else PyPI)."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in done.stdout.splitlines():
            key, _, value = line.partition("=")
            if key.endswith(".index-url"):
                url = value.strip().strip("'\"")
    url = url or "https://pypi.org/simple"
    return url.rstrip("/") + "/six/"


class _Listeners:
    """TCP listeners on every address given; records whatever connects."""

    def __init__(self, addresses: list[str]) -> None:
        self.sockets: list[socket.socket] = []
        self.accepted: list[str] = []
        self.targets: list[tuple[str, int]] = []
        for addr in addresses:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sock = socket.socket(fam)
            if fam == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sockaddr = socket.getaddrinfo(addr, 0, fam, socket.SOCK_STREAM)[0][4]
            sock.bind(sockaddr)
            sock.listen()
            sock.settimeout(0.2)
            self.sockets.append(sock)
            self.targets.append((addr, sock.getsockname()[1]))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            for sock in self.sockets:
                try:
                    conn, peer = sock.accept()
                except OSError:
                    continue
                self.accepted.append(f"{sock.getsockname()} from {peer}")
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.sockets:
            sock.close()


def _host_addresses() -> list[str]:
    """This host's addresses as a command would dial them (link-local with scope)."""
    found = []
    for net in HostNetwork.read().local:
        addr = net.network_address
        if isinstance(addr, ipaddress.IPv6Address) and addr.is_link_local:
            found.extend(_scoped(str(addr)))
        elif net.prefixlen == net.max_prefixlen:
            found.append(str(addr))
    return found


def _scoped(addr: str) -> list[str]:
    """``addr%iface`` for the interface holding the link-local address."""
    packed = ipaddress.IPv6Address(addr).packed.hex()
    for line in Path("/proc/net/if_inet6").read_text().splitlines():
        words = line.split()
        if words[0] == packed:
            return [f"{addr}%{words[5]}"]
    return []


@pytest.fixture
def listeners() -> Iterator[_Listeners]:
    hosts = _host_addresses()
    wild = ["0.0.0.0"] + (["::"] if socket.has_ipv6 and Path("/proc/net/if_inet6").exists() else [])
    group = _Listeners(["127.0.0.1", *(["::1"] if "::" in wild else []), *wild, *hosts])
    yield group
    group.close()


def test_this_host_is_unreachable_the_outside_is_reachable(listeners: _Listeners) -> None:
    # Every listener dialled at its own address, and the wildcard ones at loopback
    # and at each of this host's addresses.
    targets = [t for t in listeners.targets if t[0] not in ("0.0.0.0", "::")]
    for addr, port in listeners.targets:
        if addr in ("0.0.0.0", "::"):
            v6 = addr == "::"
            dial = ["::1" if v6 else "127.0.0.1"]
            dial += [a for a in _host_addresses() if (":" in a) == v6]
            targets += [(d, port) for d in dial]
    url = _index_url()
    index_host = urlsplit(url).hostname or ""
    outside_ok = _reachable_from_host(index_host)
    cafile = os.environ.get("PIP_CERT", "")
    argv = [sys.executable, "-I", "-S", "-c", _INNER, json.dumps(targets), index_host]
    argv += [url if outside_ok else "", cafile]
    done = _run(argv)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["connected"] == [], out
    assert listeners.accepted == []
    assert len(out["refused"]) == len(targets)
    assert isinstance(out["resolved"], list) and out["resolved"], out["resolved"]
    if not outside_ok:
        print(f"no route from this machine to {index_host}: outbound fetch not asserted")
        return
    assert out["status"] == 200, out["status"]


def _reachable_from_host(hostname: str) -> bool:
    try:
        with socket.create_connection((hostname, 443), timeout=10):
            return True
    except OSError:
        return False


def test_a_resolver_on_loopback_is_reached_through_the_dns_forward(tmp_path: Path) -> None:
    # pasta is shown a resolv.conf naming 127.0.0.53 (a relay to the real resolver);
    # the command's resolv.conf names the forward address, and pasta sends the queries
    # to the resolver on this host's loopback.
    resolv = Path("/etc/resolv.conf").read_text()
    real = [ln.split()[1] for ln in resolv.splitlines() if ln.startswith("nameserver")]
    if not real or shutil.which("unshare") is None:
        pytest.skip("no resolver configured, or no unshare")
    seen = tmp_path / "resolv.conf"
    seen.write_text("nameserver 127.0.0.53\n")
    wrapper = tmp_path / "pasta"
    mount = f'mount --bind {seen} /etc/resolv.conf && exec {shutil.which("pasta")} "$@"'
    wrapper.write_text(f"#!/bin/sh\nexec unshare -m sh -c '{mount}' sh \"$@\"\n")
    wrapper.chmod(0o755)
    relay = _DnsRelay("127.0.0.53", real[0])
    try:
        host = HostNetwork.read()
        fake = HostNetwork(host.local, seen.read_text(), ipaddress.ip_address("127.0.0.53"))
        code = "import socket, sys; print(open('/etc/resolv.conf').read().split()[1]); "
        code += "print(socket.getaddrinfo(sys.argv[1], 443)[0][4][0])"
        name = urlsplit(_index_url()).hostname or ""
        done = _run([sys.executable, "-I", "-S", "-c", code, name], fake, str(wrapper))
    finally:
        relay.close()
    assert done.returncode == 0, done.stderr
    nameserver, address = done.stdout.split()
    assert nameserver == network.DNS_FORWARD_ADDRESS
    ipaddress.ip_address(address)
    assert relay.relayed > 0


class _DnsRelay:
    def __init__(self, listen: str, upstream: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((listen, 53))
        except OSError as exc:
            self.sock.close()
            pytest.skip(f"cannot listen on {listen}:53: {exc}")
        self.sock.settimeout(0.2)
        self.upstream = upstream
        self.relayed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self.sock.recvfrom(4096)
            except OSError:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as up:
                up.settimeout(5)
                try:
                    up.sendto(query, (self.upstream, 53))
                    answer = up.recv(4096)
                except OSError:
                    continue
            self.sock.sendto(answer, peer)
            self.relayed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_a_failed_setup_never_runs_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with OutboundNetwork(pasta="/bin/false") as net:
        argv = _bwrap(net, ["touch", str(marker)], ("--bind", str(tmp_path), str(tmp_path)))
        proc = subprocess.Popen(argv, pass_fds=net.pass_fds())
        with pytest.raises(NetworkSetupError, match="pasta"):
            net.start(timeout=10)
        proc.wait(timeout=30)
    assert not marker.exists()


def test_probe_says_whether_it_works() -> None:
    ok, detail = network.probe()
    assert ok, detail
    assert "pasta" in detail


def test_resolv_conf_is_rewritten_only_for_a_resolver_of_this_host() -> None:
    loopback = HostNetwork(
        (), "search x\nnameserver 127.0.0.53\noptions edns0\n", ipaddress.ip_address("127.0.0.53")
    )
    assert loopback.resolv_conf_inside() == (
        f"nameserver {network.DNS_FORWARD_ADDRESS}\nsearch x\noptions edns0\n"
    )
    assert HostNetwork((), "nameserver 10.1.1.1\n", None).resolv_conf_inside() is None


# -- end to end: the bash tool, and a real daemon ---------------------------------------


def _bash_in(workspace: Path, command: str, tmp_path: Path) -> str:
    from toolpool.tools.bash import bash

    from .tool_support import tool_context

    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    ctx = tool_context(workspace, scratch_dir=scratch)
    ctx = dataclasses.replace(ctx, allow_network=True)
    return bash.execute({"command": command}, ctx)


def test_a_network_allowed_bash_call_reaches_out_but_not_this_host(
    listeners: _Listeners, workspace: Path, tmp_path: Path
) -> None:
    targets = [t for t in listeners.targets if t[0] not in ("0.0.0.0", "::")]
    url = _index_url()
    index_host = urlsplit(url).hostname or ""
    outside_ok = _reachable_from_host(index_host)
    (workspace / "probe.py").write_text(_INNER)
    (workspace / "targets.json").write_text(json.dumps(targets))
    command = (
        f'{sys.executable} -I -S probe.py "$(cat targets.json)" {index_host} '
        f"'{url if outside_ok else ''}' '{os.environ.get('PIP_CERT', '')}'"
    )
    out = json.loads(_bash_in(workspace, command, tmp_path).splitlines()[0])
    assert out["connected"] == [] and listeners.accepted == []
    assert isinstance(out["resolved"], list) and out["resolved"], out["resolved"]
    if outside_ok:
        assert out["status"] == 200, out["status"]


def test_the_daemons_own_tcp_listener_is_out_of_reach_of_its_commands(
    tmp_path: Path, workspace: Path
) -> None:
    from toolpool import Client, ToolCall

    from .daemon_support import running_daemon

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        running_daemon(tmp_path, "--tcp", f"127.0.0.1:{port}") as daemon,
        Client(runtime_dir=daemon.runtime, timeout=30) as client,
        client.session(workspace, allow_network=True) as session,
    ):
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('IN')"
        (result,) = session.submit(
            [ToolCall("b", "bash", {"command": f'{sys.executable} -I -S -c "{code}" 2>&1'})]
        ).results()
    assert "IN" not in result.text
    assert "refused" in result.text.lower() or "unreachable" in result.text.lower(), result.text
