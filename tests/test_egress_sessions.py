"""A policy session through a real daemon (SPEC N3–N5, N7, N9, N11): its commands and
Python tools reach the names its policy allows through its proxy, with the tools
everyone uses, and nothing else — not by address, not by DNS, not through another
session's proxy, not with Host or SNI games, not through a host's Unix socket.

Every attempt aims at the test's own servers and listeners, on loopback and on this
host's own address (egress_support.py); the names the policy judges are pinned there
(network_resolve)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpool import Client, ToolCall

from .daemon_support import running
from .egress_support import REASON, Site, host_address, out, records, run, site, usable
from .shell_support import call, start, wait_state, wait_until

pytestmark = pytest.mark.skipif(not usable(), reason=REASON)
POLICY = {"allow": ["allowed.test", "raw.test"]}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with site(tmp_path_factory.mktemp("egress")) as made:
        yield made


@pytest.fixture(autouse=True)
def fresh(net: Site) -> None:
    """Each test judges what reached the servers and listeners in its own time."""
    net.recorder.got.clear()
    net.allowed.seen.clear()
    net.evil.seen.clear()


@pytest.fixture
def client(net: Site) -> Iterator[Client]:
    with Client(runtime_dir=net.daemon.runtime, timeout=120) as connected:
        yield connected


# --- what works, unchanged (N3) ---


@pytest.mark.spec("N3", "N8")
def test_N3_curl_urllib_socks_and_git_reach_an_allowed_name_through_the_proxy(
    client: Client, net: Site, workspace: Path
) -> None:
    script = "\n".join(
        [
            "curl -sS http://allowed.test/forwarded",  # absolute-form, forwarded
            "curl -sS -p http://allowed.test/tunnel",  # CONNECT
            'curl -sS -x "$ALL_PROXY" http://allowed.test/socks',  # SOCKS5, name remote
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://allowed.test/py')"
            '.read().decode().strip())"',
            "git ls-remote http://allowed.test/repo.git 2>/dev/null; echo git=$?",
        ]
    )
    with client.session(workspace, network=POLICY) as session:
        text = out(run(session, script, "fetch-1"))
        assert text.splitlines()[:4] == [
            "allowed /forwarded",
            "allowed /tunnel",
            "allowed /socks",
            "allowed /py",
        ]
        # git asked for the repository's refs (the test's server is no git server)
        assert any(s["path"].startswith("/repo.git/info/refs") for s in net.allowed.seen)
        assert {s["host"] for s in net.allowed.seen} == {"allowed.test"}
        wait_until(lambda: len(records(net.audit, session.id)) >= 5, "five records")
        seen = records(net.audit, session.id)
        # Every connection is on the record, of the call whose command made it:
        # curl, urllib and git all sent the call's token.
        assert {r["call"] for r in seen} == {"fetch-1"}
        assert {r["decision"] for r in seen} == {"allow"}
        assert {r["via"] for r in seen} == {"http", "connect", "socks"}
        assert all(r["bytes_down"] > 0 and r["by"] == 'allow "allowed.test"' for r in seen)


@pytest.mark.spec("N3")
def test_N3_a_command_has_no_route_no_dns_and_no_way_past_the_proxy(
    client: Client, net: Site, workspace: Path
) -> None:
    # Given the test's TCP and UDP listeners on loopback and this host's own address
    targets = [[a, net.recorder.port] for a in net.recorder.addresses]
    nameservers = [
        line.split()[1]
        for line in Path("/etc/resolv.conf").read_text().splitlines()
        if line.startswith("nameserver")
    ]
    probe = rf"""
import json, socket, sys
targets, servers = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {{}}
def attempt(label, fn):
    try:
        fn(); out[label] = "ok"
    except OSError as exc:
        out[label] = type(exc).__name__ + ": " + str(exc.strerror or exc)
def family(a): return socket.AF_INET6 if ":" in a else socket.AF_INET
for a, p in targets:
    def tcp(a=a, p=p):
        s = socket.socket(family(a)); s.settimeout(2); s.connect((a, p)); s.close()
    def udp(a=a, p=p):
        s = socket.socket(family(a), socket.SOCK_DGRAM); s.sendto(b"udp escape", (a, p))
    attempt("tcp " + a, tcp); attempt("udp " + a, udp)
query = bytes.fromhex("abcd01000001000000000000") + b"\x07example\x03com\x00\x00\x01\x00\x01"
for server in servers + ["127.0.0.1"]:
    def dns(server=server):
        s = socket.socket(family(server), socket.SOCK_DGRAM); s.settimeout(2)
        s.sendto(query, (server, 53)); s.recv(512)
    attempt("dns " + server, dns)
attempt("resolve", lambda: socket.getaddrinfo("allowed.test", 80))
for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
    def icmp(kind=kind):
        s = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
        s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", ({host_address()!r}, 0))
    attempt("icmp " + str(int(kind)), icmp)
print(json.dumps(out))
"""
    with client.session(workspace, network=POLICY) as session:
        argv = f"{sys.executable} -c {_quote(probe)} {_quote(json.dumps(targets))} "
        argv += _quote(json.dumps(nameservers))
        seen = json.loads(out(run(session, argv)))
        routes = out(run(session, "ip -o addr; echo ---; ip route; ip -6 route"))
    # Then every attempt failed — unreachable, refused by the namespace's own
    # loopback, or not permitted — and nothing reached a listener of the host (a
    # datagram to loopback is sent: to the namespace's own, where nothing listens)
    own_loopback = {"udp 127.0.0.1", "udp ::1"}
    assert seen and all(v != "ok" for k, v in seen.items() if k not in own_loopback), seen
    assert net.recorder.got == []
    # The namespace has its loopback and nothing else: no other device, no route out
    devices = {line.split()[1] for line in routes.split("---")[0].splitlines()}
    assert devices == {"lo"}
    assert routes.split("---")[1].strip() == ""


@pytest.mark.spec("N4", "N5")
def test_N4_names_and_addresses_that_lead_to_this_host_are_refused(
    client: Client, net: Site, workspace: Path
) -> None:
    port = net.recorder.port
    policy = {"allow": ["localhost", "127.0.0.1", host_address(), socket.gethostname()]}
    direct = "--noproxy '' -x \"$http_proxy\""  # loopback names skip the proxy otherwise
    with client.session(workspace, network=policy) as session:
        script = "; ".join(
            [
                f"curl -sS {direct} http://localhost:{port}/",
                f"curl -sS {direct} http://127.0.0.1:{port}/",
                f"curl -sS {direct} -p http://{host_address()}:{port}/",
                f"curl -sS {direct} http://{socket.gethostname()}:{port}/",
            ]
        )
        result = run(session, script + "; true")
    text = out(result)
    # Each is refused, naming the host and why: it would be this host (curl prints
    # a tunnel's refusal as "response 403"; the result lists it all the same)
    assert text.count("toolpool refused") == 3 and "response 403" in text, text
    assert "resolves to this host only (127.0.0.1 is a loopback address)" in text
    assert "127.0.0.1 is a loopback address, this host's" in text
    refused = {r["host"]: r["by"] for r in result.details["network_refused"]}
    assert set(refused) == {"localhost", "127.0.0.1", host_address(), socket.gethostname()}
    assert "is an address of this host" in refused[host_address()]
    assert net.recorder.got == []


@pytest.mark.spec("N5", "N7", "N2")
def test_N5_a_refused_name_or_port_fails_fast_saying_so_and_the_result_lists_it(
    client: Client, net: Site, workspace: Path
) -> None:
    policy = {"allow": ["allowed.test:80"], "deny": ["evil.test"]}
    with client.session(workspace, network=policy) as session:
        result = run(
            session,
            "curl -sS http://evil.test/; curl -sS http://allowed.test:8080/; "
            'curl -sS -x "$ALL_PROXY" http://other.test/ 2>&1; true',
            "refused-1",
        )
    text = out(result)
    assert 'toolpool refused evil.test:80 (deny "evil.test")' in text
    assert "toolpool refused allowed.test:8080 (no rule allows it)" in text  # the port
    assert "SOCKS5" in text  # curl's words for the SOCKS refusal
    assert result.details["network_refused"] == [
        {"host": "evil.test", "port": 80, "by": 'deny "evil.test"'},
        {"host": "allowed.test", "port": 8080, "by": "no rule allows it"},
        {"host": "other.test", "port": 80, "by": "no rule allows it"},
    ]
    assert "[network] The session's network policy refused: evil.test:80" in result.text
    assert net.evil.seen == []


@pytest.mark.spec("N3", "N2")
def test_N3_host_and_sni_games_reach_only_the_name_judged(
    client: Client, net: Site, workspace: Path
) -> None:
    # A TLS hello naming evil.test, through a tunnel the proxy opened to raw.test
    sni = (
        "import socket, ssl, os; s = socket.create_connection(('127.0.0.1', 3128)); "
        "s.sendall(b'CONNECT raw.test:443 HTTP/1.1\\r\\n\\r\\n'); print(s.recv(100).split()[1]); "
        "c = ssl.create_default_context(); c.check_hostname = False; "
        "c.verify_mode = ssl.CERT_NONE\n"
        "try:\n c.wrap_socket(s, server_hostname='evil.test')\nexcept OSError: pass"
    )
    with client.session(workspace, network=POLICY) as session:
        text = out(
            run(
                session,
                f'curl -sS -H "Host: evil.test" http://allowed.test/host; python3 -c {_quote(sni)}',
            )
        )
    # The forwarded request went to allowed.test's server with its own name as Host
    assert text.startswith("allowed /host")
    assert net.allowed.seen == [{"path": "/host", "host": "allowed.test"}]
    # The hello naming evil.test went to raw.test's listener: the tunnel's end is the
    # name judged, whatever the bytes in it say
    assert any(b"evil.test" in data for _, data in net.recorder.got)
    assert net.evil.seen == []


@pytest.mark.spec("N3", "N12")
def test_N3_each_session_has_its_own_proxy_out_of_the_others_reach(
    client: Client, net: Site, workspace: Path
) -> None:
    with (
        client.session(workspace, network={"allow": ["allowed.test"]}) as a,
        client.session(workspace, network={"allow": ["evil.test"]}) as b,
    ):
        # Each command's 127.0.0.1:3128 is its own session's proxy, judging by its rules
        assert out(run(a, "curl -sS http://allowed.test/a")).startswith("allowed /a")
        assert "toolpool refused" in out(run(a, "curl -sS http://evil.test/"))
        assert out(run(b, "curl -sS http://evil.test/b")).startswith("evil /b")
        assert "toolpool refused" in out(run(b, "curl -sS http://allowed.test/"))
        # B's token in A's session names no call of A's: it is A's policy all the same
        token = out(
            run(b, 'echo "$http_proxy"'),
        )
        leaked = run(a, f'curl -sS -x "{token}" http://evil.test/; true', "a-call")
        assert "toolpool refused evil.test:80" in out(leaked)
        assert leaked.details.get("network_refused") is None  # of no call of A's
        # The proxy listens nowhere in the host's namespace
        proxy = client.status()["egress_proxy"]["pid"]
        assert proxy is not None and _listening_inodes() & _socket_inodes(proxy) == set()
        # A flood of one session leaves the other served
        flood = (
            "import socket, time; s = [socket.create_connection(('127.0.0.1', 3128)) "
            "for _ in range(300)]; print(len(s), flush=True); time.sleep(600)"
        )
        shell_id, _ = start(a, f"python3 -c {_quote(flood)}")
        wait_until(lambda: _active(client, a.id) >= 256, "a's proxy full")
        assert out(run(b, "curl -sS http://evil.test/during")).startswith("evil /during")
        call(a, "kill_shell", shell_id=shell_id)
        wait_state(client, a, shell_id, "killed")
        # The 44 connections past the bound were dropped; the proxy says so with its
        # counters, which it sends at most once a second: waited for, not read once
        wait_until(
            lambda: client.status()["sessions"][a.id]["network"]["proxy"]["dropped"] >= 44,
            "a's proxy counted what it dropped",
        )


@pytest.mark.spec("N3", "N8")
def test_N3_a_background_shells_connections_are_the_call_that_started_it(
    client: Client, net: Site, workspace: Path
) -> None:
    with client.session(workspace, network=POLICY) as session:
        (started,) = session.submit(
            [
                ToolCall(
                    "starter",
                    "bash",
                    {
                        "command": "sleep 1; curl -sS http://allowed.test/bg",
                        "run_in_background": True,
                    },
                )
            ]
        ).results()
        shell_id = str(started.details["shell_id"])
        wait_state(client, session, shell_id, "exited")
        wait_until(lambda: records(net.audit, session.id), "the shell's record")
        (record,) = records(net.audit, session.id)
        assert record["call"] == "starter" and record["host"] == "allowed.test"


@pytest.mark.spec("N3")
def test_N3_checkpoints_keep_the_sessions_namespace_and_proxy(
    client: Client, net: Site, workspace: Path
) -> None:
    # Every turn's end is a checkpoint, which ends the session's sandbox and starts
    # it again (B1): the namespace, and the proxy's listeners in it, are the session's.
    with client.session(workspace, network=POLICY, workspace_mode="overlay") as session:
        for turn in range(3):
            assert out(run(session, f"curl -sS http://allowed.test/t{turn}")) == f"allowed /t{turn}"
        assert len(session.checkpoints()) >= 3


@pytest.mark.spec("N3")
def test_N3_a_proxy_that_dies_is_started_again_for_the_sessions_it_served(
    client: Client, net: Site, workspace: Path
) -> None:
    with client.session(workspace, network=POLICY) as session:
        assert out(run(session, "curl -sS http://allowed.test/before")) == "allowed /before"
        first = client.status()["egress_proxy"]
        os.kill(first["pid"], signal.SIGKILL)
        wait_until(
            lambda: client.status()["egress_proxy"]["started"] == first["started"] + 1,
            "the proxy started again",
        )
        # The same sandbox, the same namespace: served again, on new listeners
        again = out(run(session, "curl -sS --retry 5 --retry-connrefused http://allowed.test/x"))
        assert again == "allowed /x"
        assert client.status()["egress_proxy"]["pid"] not in (None, first["pid"])


# --- Unix sockets (N9) ---


@pytest.mark.spec("N9")
def test_N9_a_hosts_unix_socket_is_out_of_reach_unless_listed(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    # Given a listening socket outside the roots and the private /tmp (as an agent's is)
    outside = Path("/var/tmp") / f"toolpool-n9-{os.getpid()}-{tmp_path.name}"
    outside.mkdir()
    agent = socket.socket(socket.AF_UNIX)
    try:
        agent.bind(str(outside / "agent.sock"))
        agent.listen()
        (outside / "notes.txt").write_text("still readable\n")
        probe = (
            "import socket, sys\nfor p in sys.argv[1:]:\n"
            " s = socket.socket(socket.AF_UNIX)\n try:\n  s.connect(p); print('connected')\n"
            " except OSError as e: print(type(e).__name__)\n"
            "a, b = socket.socketpair(); a.send(b'x'); print('pair', b.recv(1))\n"
            "l = socket.socket(socket.AF_UNIX); l.bind('own.sock'); l.listen()\n"
            "c = socket.socket(socket.AF_UNIX); c.connect('own.sock'); print('own ok')"
        )
        command = f"python3 -c {_quote(probe)} {outside / 'agent.sock'}; cat {outside}/notes.txt"
        with client.session(workspace, network={"allow": []}) as session:
            masked = out(run(session, command))
        listed = {"allow": [], "unix_sockets": [str(outside / "agent.sock")]}
        (workspace / "own.sock").unlink()
        with client.session(workspace, network=listed) as session:
            kept = out(run(session, command))
    finally:
        agent.close()
        for path in outside.iterdir():
            path.unlink()
        outside.rmdir()
    # Then it is refused unless listed, while socketpair, a socket of the workspace's
    # and the directory's other files stay
    assert masked.splitlines() == [
        "ConnectionRefusedError",
        "pair b'x'",
        "own ok",
        "still readable",
    ]
    assert kept.splitlines()[0] == "connected"


# --- Python tools (N11) ---


@pytest.mark.spec("N11")
def test_N11_a_python_tool_of_a_policy_session_meets_the_same_rules(
    client: Client, net: Site, workspace: Path
) -> None:
    with client.session(workspace, network=POLICY) as session:
        fetched = call(session, "fetch", url="http://allowed.test/tool")
        refused = call(session, "fetch", url="http://evil.test/")
        direct = call(session, "connect", host="127.0.0.1", port=net.recorder.port)
        shown = call(session, "proxy_variables")
        host_ns = call(session, "leave_namespace", path="/proc/1/ns/net")
        own_ns = call(session, "leave_namespace", path="/proc/self/ns/net")
        worker = fetched.details["worker_pid"]
    assert json.loads(fetched.text) == {"status": 200, "body": "allowed /tool\n"}
    assert "403" in refused.text and "toolpool refused evil.test:80" in refused.text
    assert refused.details["network_refused"][0]["host"] == "evil.test"
    assert json.loads(direct.text)["connected"] is False  # its namespace: the proxy only
    assert "127.0.0.1:3128" in json.loads(shown.text)["https_proxy"]
    # and it cannot step into the host's namespace: not even into its own (the
    # seccomp filter of a policy session's worker refuses setns itself)
    assert json.loads(host_ns.text)["left"] is False
    assert json.loads(own_ns.text) == {"left": False, "error": "Operation not permitted"}
    assert net.recorder.got == [] and net.evil.seen == []
    # Its worker was the session's own, and is gone with the session
    wait_until(lambda: not running(worker), "the session's worker retired")


@pytest.mark.spec("N11", "A6")
def test_N11_a_shipped_tool_of_a_policy_session_runs_in_its_namespace(
    client: Client, net: Site, workspace: Path
) -> None:
    # Given a tool of this program's own, shipped with a policy session
    recorder = net.recorder.port

    def reach(url: str) -> dict[str, object]:
        """Fetch url through the proxy, then connect to the recorder straight.

        Args:
            url: What to fetch.
        """
        import socket as sockets
        import urllib.request as requests

        with requests.urlopen(url, timeout=20) as response:
            body = response.read().decode()
        try:
            with sockets.create_connection(("127.0.0.1", recorder), timeout=3):
                direct = "connected"
        except OSError as exc:
            direct = str(exc)
        return {"body": body, "direct": direct, "pid": os.getpid()}

    with client.session(workspace, network=POLICY, tools=[reach]) as session:
        shipped = call(session, "reach", url="http://allowed.test/shipped")
        builtin = call(session, "fetch", url="http://allowed.test/tool")
        worker = shipped.details["worker_pid"]
    # Then it met the session's rules as its Python tools do: through its proxy,
    # nothing straight out, on a worker of the session's own
    answer = json.loads(shipped.text)
    assert answer["body"] == "allowed /shipped\n"
    assert answer["direct"] != "connected"
    assert net.recorder.got == []
    assert not builtin.is_error, builtin.text
    assert worker not in (os.getpid(), net.daemon.pid)
    wait_until(lambda: not running(worker), "the session's worker retired")


# --- helpers ---


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _active(client: Client, session_id: str) -> int:
    network = client.status()["sessions"][session_id]["network"]
    return int(network.get("proxy", {}).get("active", 0))


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _listening_inodes() -> set[str]:
    """The inodes of every TCP socket listening in this (the host's) namespace."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    found.add(fields[9])
    return found
