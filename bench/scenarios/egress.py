"""Scenario egress: what a policy session's proxy costs (SPEC N3). A local HTTP server
(in the bench's process, on loopback) serves a small body and a large one; one script
fetches them over fresh connections, timing each inside itself: from the host
straight to the server (no proxy), and from a command of a policy session through its
proxy — a forwarded ``http://`` request and a ``CONNECT`` tunnel — the server pinned
by ``network_resolve``. Rounds interleave the three, so a busy moment hits all alike;
the figures are medians per connection (the small body) and of throughput (the large
one), and their ratios to the direct fetch."""

from __future__ import annotations

import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.common import daemon
from toolpool import Client, ToolCall

NAME = "egress"
SMALL = 1024
LARGE = 32 * 1024**2

# Run on the host and in the session: ``mode`` "direct" dials the server, "forward"
# asks the proxy for an absolute URL, "tunnel" CONNECTs through it first. Prints the
# milliseconds of each small fetch and the MB/s of each large one.
SCRIPT = r"""
import base64, json, os, socket, sys, time
from urllib.parse import urlsplit
mode, host = sys.argv[1], sys.argv[2]
port, small, large = (int(a) for a in sys.argv[3:6])
proxy = urlsplit(os.environ.get("http_proxy", ""))
auth = b""
if proxy.username:
    token = base64.b64encode(f"{proxy.username}:{proxy.password}".encode())
    auth = b"Proxy-Authorization: Basic " + token + b"\r\n"
def fetch(path):
    if mode == "direct":
        s = socket.create_connection((host, port))
        s.sendall(b"GET " + path + b" HTTP/1.0\r\n\r\n")
    elif mode == "forward":
        s = socket.create_connection((proxy.hostname, proxy.port))
        s.sendall(b"GET http://%s:%d%s HTTP/1.0\r\n" % (host.encode(), port, path) + auth + b"\r\n")
    else:
        s = socket.create_connection((proxy.hostname, proxy.port))
        s.sendall(b"CONNECT %s:%d HTTP/1.1\r\n" % (host.encode(), port) + auth + b"\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        s.sendall(b"GET " + path + b" HTTP/1.0\r\n\r\n")
    got = 0
    while chunk := s.recv(1 << 20):
        got += len(chunk)
    s.close()
    return got
out = {"small_ms": [], "large_mb_s": []}
for _ in range(small):
    began = time.perf_counter(); fetch(b"/small")
    out["small_ms"].append((time.perf_counter() - began) * 1000)
for _ in range(large):
    began = time.perf_counter(); got = fetch(b"/large")
    out["large_mb_s"].append(got / 1e6 / (time.perf_counter() - began))
print(json.dumps(out))
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    bodies = {"/small": b"s" * SMALL, "/large": b"L" * LARGE}

    def do_GET(self) -> None:
        body = self.bodies.get(self.path, b"")
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "a network policy needs a daemon run as root"}
    rounds, small, large = (3, 20, 1) if quick else (10, 50, 3)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    script = workspace / "egress_fetch.py"
    script.write_text(SCRIPT)
    samples: dict[str, dict[str, list[float]]] = {
        m: {"small_ms": [], "large_mb_s": []} for m in ("direct", "forward", "tunnel")
    }
    policy = {"allow": ["local.test"]}
    try:
        with (
            daemon(1, f"--network-resolve=local.test=127.0.0.1:{port}") as running,
            Client(runtime_dir=running.runtime, timeout=300) as client,
            client.session(workspace, network=policy) as session,
        ):
            args = f"{small} {large}"
            for i in range(rounds + 1):
                measured = {
                    "direct": _host(script, f"direct 127.0.0.1 {port} {args}"),
                    "forward": _session(session, script, f"forward local.test 80 {args}"),
                    "tunnel": _session(session, script, f"tunnel local.test 443 {args}"),
                }
                if i == 0:
                    continue  # the first round starts the proxy and warms the caches
                for mode, got in measured.items():
                    for key, values in got.items():
                        samples[mode][key] += values
            stats = client.status()["sessions"][session.id]["network"]["proxy"]
    finally:
        server.shutdown()
        server.server_close()
    medians = {
        mode: {key: round(statistics.median(v), 3) for key, v in s.items()}
        for mode, s in samples.items()
    }
    direct = medians["direct"]
    return {
        "rounds": rounds,
        "small_bytes": SMALL,
        "large_bytes": LARGE,
        "median": medians,
        "added_ms_per_connection": {
            m: round(medians[m]["small_ms"] - direct["small_ms"], 3) for m in ("forward", "tunnel")
        },
        "throughput_ratio": {
            m: round(medians[m]["large_mb_s"] / direct["large_mb_s"], 3)
            for m in ("forward", "tunnel")
        },
        "proxy_counters": stats,
    }


def _host(script: Path, args: str) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    done = subprocess.run(
        [sys.executable, str(script), *args.split()],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return dict(json.loads(done.stdout))


def _session(session: Any, script: Path, args: str) -> dict[str, list[float]]:
    command = f"{sys.executable} {script} {args}"
    (result,) = session.submit([ToolCall("e", "bash", {"command": command})]).results()
    assert not result.is_error, result.text
    return dict(json.loads(result.text.rsplit("\nExit code:", 1)[0]))


def report(data: dict[str, Any]) -> list[str]:
    if "skipped" in data:
        return ["", "## Egress proxy (N3)", "", f"Not measured: {data['skipped']}."]
    m, added, ratio = data["median"], data["added_ms_per_connection"], data["throughput_ratio"]
    lines = [
        "",
        "## Egress proxy (N3)",
        "",
        f"A {data['small_bytes']} B body over a fresh connection (median ms) and a "
        f"{data['large_bytes'] // 2**20} MiB body (median MB/s), from the host straight to a "
        f"local server and from a policy session's command through its proxy; "
        f"{data['rounds']} interleaved rounds.",
        "",
        "| path | per connection, ms | added, ms | download, MB/s | ratio to direct |",
        "|---|---|---|---|---|",
        f"| direct (no proxy) | {m['direct']['small_ms']:.3f} | — | "
        f"{m['direct']['large_mb_s']:.0f} | 1 |",
    ]
    for mode in ("forward", "tunnel"):
        lines.append(
            f"| {mode} | {m[mode]['small_ms']:.3f} | {added[mode]:.3f} | "
            f"{m[mode]['large_mb_s']:.0f} | {ratio[mode]:.2f} |"
        )
    return lines
