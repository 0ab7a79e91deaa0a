"""The three forms of an image, read into one description: layers, Env, WorkingDir.

- a root file system directory: a directory holding neither ``oci-layout`` nor
  ``manifest.json``; it is one lower layer as it is, with no config;
- an OCI image layout (a directory, or an uncompressed tar of one): ``oci-layout``,
  ``index.json`` → manifest (through a nested index for a multi-platform image, whose
  ``linux`` entry for this host's architecture is taken) → config and layers;
- a ``docker save`` tarball (or the directory it unpacks to): ``manifest.json`` →
  ``<config>.json`` and the layer tars.

Every JSON document is checked against its digest here (the index of an OCI layout and
docker's ``manifest.json`` are the roots: nothing names their digests). Layers are
checked while they are unpacked: the compressed digest the manifest names (OCI) and the
uncompressed digest, the diff id, the config names (both forms). Their diff ids key the
cache, so the same layer from both forms is one entry.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolpool.images.access import check_open
from toolpool.images.blobs import Blob, Container, DirContainer, TarContainer, read_json
from toolpool.images.errors import ImageError
from toolpool.sandbox.policy import DEFAULT_PATH

Compression = Literal["gzip", "none", "auto"]
Form = Literal["rootfs", "oci", "docker"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
_MANIFEST_TYPES = {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}
_CONFIG_TYPES = {
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
}
_LAYER_TYPES: dict[str, Compression] = {
    "application/vnd.oci.image.layer.v1.tar": "none",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "none",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
}
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}


@dataclass(frozen=True, slots=True)
class LayerSource:
    """One layer: where its bytes are, how they are compressed, what they must hash to."""

    blob: Blob
    compression: Compression
    diff_id: str  # sha256 of the uncompressed tar: the cache's key
    digest: str | None  # sha256 of the blob as stored (OCI), when the image names it


@dataclass(frozen=True, slots=True)
class ImageSource:
    """An opened image: its form, layers lowest first, the commands' base."""

    form: Form
    path: Path
    digest: str
    layers: tuple[LayerSource, ...]
    env: Mapping[str, str]
    working_dir: str


def host_arch() -> str:
    """This machine's architecture as OCI platforms name it."""
    machine = platform.machine()
    return _ARCHES.get(machine, machine)


@contextlib.contextmanager
def open_image(
    real: Path, allowed_dirs: Sequence[Path], denied: Sequence[Path]
) -> Iterator[ImageSource]:
    """The image at the real path ``real`` (admitted already), open while in the block."""
    fds: list[int] = []
    try:
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise ImageError(f"{real} cannot be opened ({error.strerror})") from None
        fds.append(fd)
        check_open(real, fd, allowed_dirs, denied)
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            container: Container = DirContainer(fd, fds)
            if container.find("oci-layout") is None and container.find("manifest.json") is None:
                yield ImageSource("rootfs", real, f"dir:{real}", (), _base_env({}), "/")
                return
        elif stat.S_ISREG(mode):
            container = TarContainer(fd, str(real))
        else:
            raise ImageError(f"{real} is neither a directory nor a file", code="image_refused")
        if container.find("oci-layout") is not None:
            yield _read_oci(container, real)
        elif container.find("manifest.json") is not None:
            yield _read_docker(container, real)
        else:
            raise ImageError(f"{real} holds neither an OCI layout nor a docker save archive")
    finally:
        for fd in fds:
            os.close(fd)


def _read_oci(container: Container, path: Path) -> ImageSource:
    layout = read_json(container, "oci-layout")
    version = layout.get("imageLayoutVersion") if isinstance(layout, dict) else None
    if not isinstance(version, str) or not version.startswith("1."):
        raise ImageError(f"oci-layout: unknown imageLayoutVersion {version!r}")
    index = read_json(container, "index.json")
    manifest_digest = _choose(container, index, "index.json", depth=0)
    manifest = read_json(container, _blob_name(manifest_digest), manifest_digest)
    config_desc = _field(manifest, "config", dict, "the manifest")
    if config_desc.get("mediaType") not in _CONFIG_TYPES:
        raise ImageError(f"the config has an unknown media type {config_desc.get('mediaType')!r}")
    config_digest = _digest(config_desc)
    config = read_json(container, _blob_name(config_digest), config_digest)
    descriptors = _field(manifest, "layers", list, "the manifest")
    diff_ids = _diff_ids(config, len(descriptors))
    layers = []
    for desc, diff_id in zip(descriptors, diff_ids, strict=True):
        media = desc.get("mediaType") if isinstance(desc, dict) else None
        if media not in _LAYER_TYPES:
            raise ImageError(f"a layer has an unknown media type {media!r}")
        digest = _digest(desc)
        blob = _blob(container, _blob_name(digest))
        if blob.size != desc.get("size"):
            raise ImageError(
                f"layer {digest} has {blob.size} bytes, the manifest says {desc.get('size')}"
            )
        layers.append(LayerSource(blob, _LAYER_TYPES[media], diff_id, digest))
    env, working_dir = _runtime(config)
    return ImageSource("oci", path, manifest_digest, tuple(layers), env, working_dir)


def _choose(container: Container, index: Any, name: str, depth: int) -> str:
    """The digest of the image manifest for linux on this host's architecture."""
    entries = _field(index, "manifests", list, name)
    arch = host_arch()
    found: list[str] = []
    seen: list[str] = []
    for desc in entries:
        if not isinstance(desc, dict):
            raise ImageError(f"{name}: a manifest entry is not an object")
        plat = desc.get("platform")
        if isinstance(plat, dict):
            seen.append(f"{plat.get('os')}/{plat.get('architecture')}")
            if plat.get("os") != "linux" or plat.get("architecture") != arch:
                continue
        media = desc.get("mediaType")
        if media in _INDEX_TYPES and depth == 0:
            nested_digest = _digest(desc)
            nested = read_json(container, _blob_name(nested_digest), nested_digest)
            found.append(_choose(container, nested, nested_digest, depth + 1))
        elif media in _MANIFEST_TYPES:
            found.append(_digest(desc))
        else:
            raise ImageError(f"{name}: an entry has an unknown media type {media!r}")
    if not found:
        platforms = ", ".join(seen) or "none"
        raise ImageError(f"{name} has no image for linux/{arch} (platforms: {platforms})")
    if len(set(found)) > 1:
        raise ImageError(
            f"{name} names {len(set(found))} different images for linux/{arch}: keep one"
        )
    return found[0]


def _read_docker(container: Container, path: Path) -> ImageSource:
    manifest = read_json(container, "manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        count = len(manifest) if isinstance(manifest, list) else "no"
        raise ImageError(f"manifest.json must describe one image (it has {count})")
    entry = manifest[0]
    config_name = _field(entry, "Config", str, "manifest.json")
    named = re.search(r"([0-9a-f]{64})(\.json)?$", config_name)
    if named is None:
        raise ImageError(f"manifest.json: the config {config_name!r} is not named by its digest")
    config_digest = f"sha256:{named.group(1)}"
    config = read_json(container, config_name, config_digest)
    names = _field(entry, "Layers", list, "manifest.json")
    diff_ids = _diff_ids(config, len(names))
    layers = []
    for layer_name, diff_id in zip(names, diff_ids, strict=True):
        if not isinstance(layer_name, str):
            raise ImageError("manifest.json: a layer name is not a string")
        layers.append(LayerSource(_blob(container, layer_name), "auto", diff_id, None))
    env, working_dir = _runtime(config)
    return ImageSource("docker", path, config_digest, tuple(layers), env, working_dir)


def _diff_ids(config: Any, count: int) -> list[str]:
    rootfs = _field(config, "rootfs", dict, "the config")
    diff_ids = _field(rootfs, "diff_ids", list, "the config's rootfs")
    if len(diff_ids) != count:
        raise ImageError(f"the config names {len(diff_ids)} diff ids for {count} layers")
    for diff_id in diff_ids:
        if not isinstance(diff_id, str) or not _DIGEST.fullmatch(diff_id):
            raise ImageError(f"the config has an unsupported diff id {diff_id!r}")
    return [str(diff_id) for diff_id in diff_ids]


def _runtime(config: Any) -> tuple[dict[str, str], str]:
    """The config's Env (PATH added when it has none, as docker does) and WorkingDir."""
    settings = (config.get("config") or {}) if isinstance(config, dict) else {}
    if not isinstance(settings, dict):
        raise ImageError("the config's config is not an object")
    env: dict[str, str] = {}
    for item in settings.get("Env") or []:
        if not isinstance(item, str) or "=" not in item:
            raise ImageError(f"the config's Env has an entry that is not NAME=value: {item!r}")
        name, value = item.split("=", 1)
        env[name] = value
    working_dir = settings.get("WorkingDir") or "/"
    if not isinstance(working_dir, str) or not working_dir.startswith("/"):
        raise ImageError(f"the config's WorkingDir is not an absolute path: {working_dir!r}")
    return _base_env(env), working_dir


def _base_env(env: dict[str, str]) -> dict[str, str]:
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def _field(value: Any, key: str, kind: type, where: str) -> Any:
    field = value.get(key) if isinstance(value, dict) else None
    if not isinstance(field, kind):
        raise ImageError(f"{where} has no {key} ({kind.__name__})")
    return field


def _digest(desc: Any) -> str:
    digest = desc.get("digest") if isinstance(desc, dict) else None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ImageError(f"unsupported digest {digest!r} (sha256 only)")
    return digest


def _blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def _blob(container: Container, name: str) -> Blob:
    blob = container.find(name)
    if blob is None:
        raise ImageError(f"the image has no {name} (a missing blob)")
    return blob
