"""The content-addressed layer cache every session of a daemon (or of several) shares.

Layout under the cache root (0700)::

    xattr               "trusted" or "user": the overlay xattr namespace of its layers
    layers/<hex>/       a complete layer only: root/ (the overlay lower), entry.json
                        (its size), used (its mtime: when a prepare last used it)
    locks/<hex>.lock    shared flock while the layer is in use, exclusive to evict it
    tmp/<name>/         an unpack under way, with tmp/<name>.lock held by its preparer
    trash/              evicted layers being deleted
    evict.lock          one eviction at a time

``<hex>`` is the layer's diff id (sha256 of its uncompressed tar). A layer is unpacked
into ``tmp/`` and renamed to ``layers/<hex>`` in one step: two preparers of one layer
(two sessions, two daemons) both unpack, the first rename wins and the other drops its
copy, so there is always one good copy and never a partial one. ``usage`` counts the
layers' disk blocks; after every prepare, least recently used layers no lease holds
are evicted until ``usage() <= max_bytes`` (layers in use stay, even past the bound).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.images.access import admit
from toolpool.images.errors import ImageError
from toolpool.images.formats import Form, LayerSource, open_image
from toolpool.images.leases import Lease, exclusive, share, try_exclusive
from toolpool.images.unpacking import (
    MAX_LAYER_BYTES,
    UnpackLimits,
    XattrKind,
    remove_tree,
    run_unpack,
)


@dataclass(frozen=True)
class PreparedImage:
    """An image ready to mount: ``layers`` lowest first (overlay lowers, read-only),
    the commands' base ``env`` and ``working_dir``, the image's ``digest`` (manifest
    digest for OCI, config digest for docker, ``dir:<path>`` for a root directory),
    its cached ``bytes``, and the ``xattr`` namespace its opaque directories use (mount
    with ``userxattr`` when it is ``user``). Its ``lease`` keeps the layers from
    eviction until ``release``."""

    layers: tuple[Path, ...]
    env: Mapping[str, str]
    working_dir: str
    digest: str
    bytes: int
    xattr: XattrKind
    form: Form
    lease: Lease = field(repr=False)

    def release(self) -> None:
        self.lease.release()

    def shared(self) -> PreparedImage:
        """The same image with a lease of its own (a forked session's)."""
        return dataclasses.replace(self, lease=self.lease.shared())

    def __enter__(self) -> PreparedImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def default_cache_root() -> Path:
    """Where a daemon keeps its layer cache unless configured: the user's cache
    directory (``$XDG_CACHE_HOME`` or ``~/.cache``), ``toolpool/images``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolpool" / "images"


class ImageCache:
    """Prepares images into the layer cache at ``root``, bounded by ``max_bytes``.

    ``prepare`` blocks while layers unpack (each in a process of its own): the daemon
    calls it off its event loop. ``xattr`` is the overlay namespace layers are made for:
    by default ``trusted`` when running as root, else ``user``; a cache is made for one.
    """

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        *,
        limits: UnpackLimits | None = None,
        xattr: XattrKind | None = None,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.limits = limits or UnpackLimits(max_bytes=min(max_bytes, MAX_LAYER_BYTES))
        self.xattr: XattrKind = xattr or ("trusted" if os.geteuid() == 0 else "user")
        self._owners = os.geteuid() == 0  # ownership is applied only by root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in ("layers", "locks", "tmp", "trash"):
            (root / name).mkdir(mode=0o700, exist_ok=True)
        self._claim_kind()

    def _claim_kind(self) -> None:
        marker = self.root / "xattr"
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            made_for = marker.read_text().strip()
            if made_for != self.xattr:
                raise ImageError(
                    f"the image cache {self.root} holds layers made for {made_for}.overlay "
                    f"xattrs, not {self.xattr}: give this daemon a cache of its own",
                    code="image_refused",
                ) from None
            return
        with os.fdopen(fd, "w") as file:
            file.write(self.xattr)

    def prepare(
        self, image: Path, *, allowed_dirs: Sequence[Path], denied: Sequence[Path]
    ) -> PreparedImage:
        """The image at ``image``, its layers unpacked (or found) in the cache and held
        by the returned image's lease; ImageError when refused or invalid."""
        real = admit(image, allowed_dirs, denied)
        lease = Lease()
        try:
            with open_image(real, allowed_dirs, denied) as source:
                if source.form == "rootfs":
                    layers: tuple[Path, ...] = (real,)
                    total = 0
                else:
                    layers, total = self._hold(source.layers, lease)
                prepared = PreparedImage(
                    layers,
                    dict(source.env),
                    source.working_dir,
                    source.digest,
                    total,
                    self.xattr,
                    source.form,
                    lease,
                )
        except BaseException:
            lease.release()
            raise
        self.evict()
        return prepared

    def _hold(self, sources: Sequence[LayerSource], lease: Lease) -> tuple[tuple[Path, ...], int]:
        paths = []
        total = 0
        for layer in sources:
            key = layer.diff_id.removeprefix("sha256:")
            lease.add(share(self.root / "locks" / f"{key}.lock"))
            entry = self.root / "layers" / key
            if not entry.is_dir():
                self._unpack(layer, key)
            os.utime(entry / "used")
            total += _entry_bytes(entry)
            paths.append(entry / "root")
        return tuple(paths), total

    def _unpack(self, layer: LayerSource, key: str) -> None:
        tmp = self.root / "tmp"
        while True:
            name = f"{key}.{secrets.token_hex(6)}"
            lock = tmp / f"{name}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            held = try_exclusive(lock)  # only remove_stale could hold it (and unlink it)
            os.close(fd)
            if held is not None:
                break
        work = tmp / name
        try:
            work.mkdir(mode=0o700)
            (work / "root").mkdir(mode=0o755)
            report = run_unpack(layer, work / "root", self.limits, self.xattr, self._owners)
            entry = {"diff_id": layer.diff_id, "bytes": report.bytes, "entries": report.entries}
            entry["skipped"] = report.skipped
            (work / "entry.json").write_text(json.dumps(entry))
            (work / "used").touch()
            try:
                os.rename(work, self.root / "layers" / key)
            except OSError as error:  # another preparer's copy is there: keep that one
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            remove_tree(work)
            lock.unlink()
            os.close(held)

    def usage(self) -> int:
        """The bytes the cache's complete layers take on disk."""
        return sum(size for _used, _key, size in self._entries())

    def evict(self) -> list[str]:
        """Remove least recently used layers that no lease holds until the cache is
        within ``max_bytes``; the diff ids removed, oldest first."""
        removed: list[str] = []
        with exclusive(self.root / "evict.lock"):
            entries = sorted(self._entries())
            total = sum(size for _used, _key, size in entries)
            for _used, key, size in entries:
                if total <= self.max_bytes:
                    break
                lock = self.root / "locks" / f"{key}.lock"
                if not lock.exists():
                    lock.touch(mode=0o600)
                fd = try_exclusive(lock)
                if fd is None:
                    continue  # in use
                trash = self.root / "trash" / f"{key}.{secrets.token_hex(6)}"
                try:
                    os.rename(self.root / "layers" / key, trash)
                    lock.unlink()
                finally:
                    os.close(fd)
                remove_tree(trash)
                total -= size
                removed.append(f"sha256:{key}")
        return removed

    def remove_stale(self) -> list[str]:
        """Remove what crashed unpacks and evictions left (names removed): a temporary
        directory whose lock no live preparer holds, and the trash."""
        removed: list[str] = []
        tmp = self.root / "tmp"
        for lock in sorted(tmp.glob("*.lock")):
            fd = try_exclusive(lock)
            if fd is None:
                continue  # an unpack under way
            try:
                work = tmp / lock.name.removesuffix(".lock")
                remove_tree(work)
                lock.unlink()
                removed.append(work.name)
            finally:
                os.close(fd)
        for work in sorted(tmp.iterdir()):
            if work.suffix != ".lock" and not (tmp / f"{work.name}.lock").exists():
                remove_tree(work)  # its lock went with a crash mid-removal
                removed.append(work.name)
        with exclusive(self.root / "evict.lock"):
            for trash in sorted((self.root / "trash").iterdir()):
                remove_tree(trash)
                removed.append(trash.name)
        return removed

    def _entries(self) -> list[tuple[int, str, int]]:
        """(last used, key, bytes) of every complete layer."""
        found = []
        for entry in (self.root / "layers").iterdir():
            try:
                used = os.stat(entry / "used").st_mtime_ns
                size = _entry_bytes(entry)
            except (FileNotFoundError, ImageError):
                continue  # evicted meanwhile
            found.append((used, entry.name, size))
        return found


def _entry_bytes(entry: Path) -> int:
    try:
        return int(json.loads((entry / "entry.json").read_text())["bytes"])
    except (ValueError, KeyError) as error:
        raise ImageError(f"the cache entry {entry} is damaged ({error})") from None
