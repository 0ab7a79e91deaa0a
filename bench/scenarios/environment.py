"""Scenario: a session's environment (V1, V12–V14). Through the daemon, for each kind
of session — its root the host's (offline and network-allowed), an overlay of it, an
image (a root directory and an OCI layout, made here of the host's bash and what it
loads), its workspace an overlay — the session's open, its first command (which
starts the session's sandbox and mounts its layers), its second, and what an idle
session holds: the resident memory of its sandbox's processes (bubblewrap, the
holder, and the daemon's pasta for it: one session is open at a time), the bytes its
private /tmp (a tmpfs) holds, and the bytes its writable layers hold. The layer
kinds need a daemon run as root; elsewhere they are left out."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import daemon
from toolpool import Client, ToolCall

NAME = "environment"
PASTA = shutil.which("pasta") or "pasta"


def kinds(images: Path) -> dict[str, dict[str, Any]]:
    """Each kind of session measured: its session options."""
    found: dict[str, dict[str, Any]] = {
        "host root": {},
        "host root, network": {"allow_network": True},
    }
    if os.geteuid() == 0:  # the layers are mounted by a daemon run as root
        found["overlay root"] = {"root": "overlay"}
        found["image root (directory)"] = {"root": {"image": str(images / "rootfs")}}
        found["image root (OCI)"] = {"root": {"image": str(images / "oci")}}
        found["overlay workspace"] = {"workspace_mode": "overlay"}
    return found


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    sessions = 3 if quick else 10
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="toolpool-bench-images-") as tmp:
        images = _images(Path(tmp))
        settings = {"TOOLPOOL_IMAGE_DIRS": str(images), "TOOLPOOL_IMAGE_CACHE": f"{tmp}/cache"}
        with (
            daemon(1, settings=settings) as running,
            Client(runtime_dir=running.runtime) as client,
        ):
            for kind, options in kinds(images).items():
                rows = [_one(client, running.pid, workspace, options) for _ in range(sessions)]
                found[kind] = {
                    key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]
                }
                found[kind]["sessions"] = sessions
    return found


def _images(where: Path) -> Path:
    """A root directory and an OCI layout (one uncompressed layer) holding the host's
    bash and the libraries it loads, and coreutils' ``df`` and ``tail``: enough for the commands."""
    images = where / "images"
    rootfs = images / "rootfs"
    programs = [os.path.realpath(shutil.which(p) or p) for p in ("bash", "df", "tail")]
    for program in programs:
        listed = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
        needed = [w for line in listed.splitlines() for w in line.split() if w.startswith("/")]
        for path in [*needed, program]:
            target = rootfs / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.realpath(path), target)
    for name in ("bash", "df", "tail"):
        link = rootfs / "bin" / name
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.realpath(shutil.which(name) or name))
    (rootfs / "tmp").mkdir(exist_ok=True)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for member in sorted(rootfs.rglob("*")):
            tar.add(member, arcname=str(member.relative_to(rootfs)), recursive=False)
    _write_oci(images / "oci", layer.getvalue())
    return images


def _write_oci(where: Path, layer: bytes) -> None:
    blobs = where / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}

    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar")],
    }
    entry = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    (where / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (where / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))


def _argv0(process: psutil.Process) -> str | None:
    """Its program, or None when it ended since it was listed (another session's
    short-lived helper, a pasta starting up)."""
    try:
        argv = process.cmdline()
    except psutil.Error:
        return None
    return argv[0] if argv else None


def _rss(process: psutil.Process) -> int:
    """Its resident bytes; 0 when it ended since it was listed."""
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


def _one(
    client: Any, daemon_pid: int, workspace: Path, options: dict[str, Any]
) -> dict[str, float]:
    began = time.perf_counter()
    with client.session(workspace, **options) as session:
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
            p for p in psutil.Process(daemon_pid).children() if _argv0(p) == PASTA
        ]
        rss = sum(_rss(p) for p in processes if p is not None)
        df = ToolCall("d", "bash", {"command": "df -B1 --output=used /tmp | tail -1"})
        (used,) = session.submit([df]).results()
        tmp_bytes = float(used.text.split()[0])
        environment = client.status()["sessions"][session.id]["environment"]
        layer_bytes = float(environment.get("layer_used_bytes", 0))
    return {
        "open_ms": (opened - began) * 1000,
        "first_command_ms": times[0],
        "second_command_ms": times[1],
        "idle_rss_mib": rss / 2**20,
        "idle_tmp_bytes": tmp_bytes,
        "idle_layer_bytes": layer_bytes,
    }


def report(data: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Environment",
        "",
        "Per kind of session, through the daemon (medians over the sessions opened): the "
        "open, the first command (bash `true`: it starts the session's sandbox), the "
        "second, and the resident memory of an idle session's sandbox (bubblewrap, its "
        "holder, pasta), the bytes its /tmp holds and those its writable layers hold "
        "(0: it has none).",
        "",
        "| session | open ms | first command ms | second command ms | idle RSS MiB "
        "| /tmp bytes | layer bytes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, row in data.items():
        lines.append(
            f"| {kind} | {row['open_ms']:.1f} | {row['first_command_ms']:.1f} | "
            f"{row['second_command_ms']:.1f} | {row['idle_rss_mib']:.1f} | "
            f"{row['idle_tmp_bytes']:.0f} | {row['idle_layer_bytes']:.0f} |"
        )
    return lines
