"""Images built in the tests with tarfile, json and hashlib: layers, OCI layouts, docker
save archives, root directories; and an overlay mount of prepared layers to look in."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
APPLETS = ("sh", "ls", "cat", "echo", "pwd")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Member:
    """One member of a layer tar."""

    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    linkname: str = ""
    devmajor: int = 0
    devminor: int = 0
    pax: dict[str, str] | None = None


def layer_tar(members: Sequence[Member]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type = m.kind
            info.mode = m.mode
            info.mtime = 1_700_000_000
            info.linkname = m.linkname
            info.devmajor, info.devminor = m.devmajor, m.devminor
            if m.pax:
                info.pax_headers = dict(m.pax)
            if m.kind == tarfile.REGTYPE:
                info.size = len(m.data)
                tar.addfile(info, io.BytesIO(m.data))
            else:
                tar.addfile(info)
    return out.getvalue()


def busybox_layers() -> list[bytes]:
    """Two layers: a busybox root; then one deleting etc/gone.txt and making opq opaque."""
    applets = [Member(f"bin/{a}", tarfile.SYMTYPE, linkname="busybox") for a in APPLETS]
    first = [
        Member("bin", tarfile.DIRTYPE, mode=0o755),
        Member("bin/busybox", data=Path(BUSYBOX).read_bytes(), mode=0o755),
        *applets,
        Member("etc", tarfile.DIRTYPE, mode=0o755),
        Member("etc/gone.txt", data=b"gone\n"),
        Member("etc/kept.txt", data=b"kept\n"),
        Member("etc/hard.txt", tarfile.LNKTYPE, linkname="etc/kept.txt"),
        Member("opq", tarfile.DIRTYPE, mode=0o755),
        Member("opq/old.txt", data=b"old\n"),
        Member("work", tarfile.DIRTYPE, mode=0o755),
    ]
    second = [
        Member("etc", tarfile.DIRTYPE, mode=0o755),
        Member("etc/.wh.gone.txt"),
        Member("etc/added.txt", data=b"added\n"),
        Member("opq", tarfile.DIRTYPE, mode=0o755),
        Member("opq/.wh..wh..opq"),
        Member("opq/new.txt", data=b"new\n"),
    ]
    return [layer_tar(first), layer_tar(second)]


def config_for(layers: Sequence[bytes], **settings: object) -> dict[str, object]:
    base: dict[str, object] = {"Env": ["PATH=/bin", "GREETING=hello"], "WorkingDir": "/work"}
    base.update(settings)
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": base,
        "rootfs": {"type": "layers", "diff_ids": [sha(layer) for layer in layers]},
    }


def _put_blob(blobs: Path, data: bytes) -> str:
    digest = sha(data)
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return digest


def write_oci(
    where: Path,
    layers: Sequence[bytes],
    *,
    compress: bool = True,
    config: dict[str, object] | None = None,
    layer_type: str | None = None,
) -> Path:
    """An OCI image layout directory at ``where`` (gzip layers unless ``compress=False``)."""
    blobs = where / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    config_bytes = json.dumps(config or config_for(layers)).encode()
    descriptors = []
    for layer in layers:
        stored = gzip.compress(layer, mtime=0) if compress else layer
        media = layer_type or (OCI_LAYER + "+gzip" if compress else OCI_LAYER)
        digest = _put_blob(blobs, stored)
        descriptors.append({"mediaType": media, "digest": digest, "size": len(stored)})
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "digest": _put_blob(blobs, config_bytes),
            "size": len(config_bytes),
        },
        "layers": descriptors,
    }
    manifest_bytes = json.dumps(manifest).encode()
    entry = {"mediaType": OCI_MANIFEST, "digest": _put_blob(blobs, manifest_bytes)}
    entry["size"] = len(manifest_bytes)  # type: ignore[assignment]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
    (where / "index.json").write_text(json.dumps(index))
    (where / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return where


def write_docker(where: Path, layers: Sequence[bytes]) -> Path:
    """A ``docker save`` tarball at ``where`` (the classic layout: <id>/layer.tar)."""
    config_bytes = json.dumps(config_for(layers)).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    names = []
    with tarfile.open(where, "w") as tar:
        _add(tar, config_name, config_bytes)
        for number, layer in enumerate(layers):
            name = f"{number:064x}/layer.tar"
            _add(tar, name, layer)
            names.append(name)
        manifest = [{"Config": config_name, "RepoTags": ["t:latest"], "Layers": names}]
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return where


def tar_of(directory: Path, where: Path) -> Path:
    """An uncompressed tar of ``directory``'s contents (an OCI layout as a tar)."""
    with tarfile.open(where, "w") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return where


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_rootfs(where: Path) -> Path:
    """A root file system directory: busybox and its applets, etc/, work/."""
    (where / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, where / "bin" / "busybox")
    for applet in APPLETS:
        os.symlink("busybox", where / "bin" / applet)
    (where / "etc").mkdir()
    (where / "etc" / "kept.txt").write_text("kept\n")
    (where / "work").mkdir()
    return where


def in_overlay(
    layers: Sequence[Path], script: str, *, xattr: str = "trusted", mountpoint: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) with the layers mounted as overlay lowers (lowest first given;
    overlay lists the top first) under a fresh writable layer, as a session has, at
    ``mountpoint``, in a private mount namespace (a user namespace too when not root:
    the unprivileged daemon's case)."""
    lower = ":".join(str(p) for p in reversed(layers))
    upper, work = mountpoint.parent / "upper", mountpoint.parent / "work"
    upper.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    options += ",userxattr" if xattr == "user" else ""
    mount = f"mount -t overlay overlay -o {options} {mountpoint} && cd {mountpoint} && {script}"
    namespaces = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Ur", "-m"]
    return subprocess.run(
        [*namespaces, "sh", "-c", mount], capture_output=True, text=True, timeout=60
    )


def bash_layer() -> bytes:
    """A layer with this host's bash and the libraries it loads, at the paths the
    host has them: an image whose commands run as toolpool runs them (bash -c)."""
    bash = os.path.realpath(shutil.which("bash") or "/bin/bash")
    listed = subprocess.run(["ldd", bash], capture_output=True, text=True, check=True).stdout
    needed = [part for line in listed.splitlines() for part in line.split() if part.startswith("/")]
    members: dict[str, Member] = {}
    for path in [*needed, "/bin/bash"]:
        source = bash if path == "/bin/bash" else os.path.realpath(path)
        parts = Path(path).relative_to("/").parts
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            members.setdefault(directory, Member(directory, tarfile.DIRTYPE, mode=0o755))
        name = "/".join(parts)
        members[name] = Member(name, data=Path(source).read_bytes(), mode=0o755)
    return layer_tar(list(members.values()))
