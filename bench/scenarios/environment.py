"""Scenario: a session's environment (V1). Through the daemon, for each kind of
session — its root the host's, offline and network-allowed (the only root kind
there is so far) — the session's open, its first command (which starts the
session's sandbox), its second, and what an idle session's sandbox holds: the
resident memory of its processes (bubblewrap, the holder, and the daemon's pasta
for it: one session is open at a time) and the bytes its private /tmp (a tmpfs) holds."""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import daemon
from toolpool import Client, ToolCall

NAME = "environment"
PASTA = shutil.which("pasta") or "pasta"
KINDS = {"host root": False, "host root, network": True}


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    sessions = 3 if quick else 10
    found: dict[str, Any] = {}
    with daemon(1) as running, Client(runtime_dir=running.runtime) as client:
        for kind, network in KINDS.items():
            rows = [_one(client, running.pid, workspace, network) for _ in range(sessions)]
            found[kind] = {
                key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]
            }
            found[kind]["sessions"] = sessions
    return found


def _one(client: Any, daemon_pid: int, workspace: Path, network: bool) -> dict[str, float]:
    began = time.perf_counter()
    with client.session(workspace, allow_network=network) as session:
        opened = time.perf_counter()
        times = []
        for n in range(2):
            start = time.perf_counter()
            (result,) = session.submit([ToolCall(f"b{n}", "bash", {"command": "true"})]).results()
            assert not result.is_error, result.text
            times.append((time.perf_counter() - start) * 1000)
        (box,) = client.status()["sessions"][session.id]["sandboxes"]
        holder = psutil.Process(int(box["pid"]))
        processes = [holder, holder.parent(), *holder.children(recursive=True)]  # + bwrap
        processes += [  # pasta (a child of the daemon, as "passt.avx2" or "pasta")
            p for p in psutil.Process(daemon_pid).children() if p.cmdline()[:1] == [PASTA]
        ]
        rss = sum(p.memory_info().rss for p in processes if p is not None)
        df = ToolCall("d", "bash", {"command": "df -B1 --output=used /tmp | tail -1"})
        (used,) = session.submit([df]).results()
        tmp_bytes = float(used.text.split()[0])
    return {
        "open_ms": (opened - began) * 1000,
        "first_command_ms": times[0],
        "second_command_ms": times[1],
        "idle_rss_mib": rss / 2**20,
        "idle_tmp_bytes": tmp_bytes,
    }


def report(data: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Environment",
        "",
        "Per kind of session, through the daemon (medians over the sessions opened): the "
        "open, the first command (bash `true`: it starts the session's sandbox), the "
        "second, and the resident memory of an idle session's sandbox (bubblewrap, its "
        "holder, pasta) and the bytes its /tmp holds.",
        "",
        "| session | open ms | first command ms | second command ms | idle RSS MiB | /tmp bytes |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, row in data.items():
        lines.append(
            f"| {kind} | {row['open_ms']:.1f} | {row['first_command_ms']:.1f} | "
            f"{row['second_command_ms']:.1f} | {row['idle_rss_mib']:.1f} | "
            f"{row['idle_tmp_bytes']:.0f} |"
        )
    return lines
