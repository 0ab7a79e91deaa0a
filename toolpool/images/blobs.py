"""The files of an image, as byte ranges of open files: a directory or a tar of one.

An OCI layout and a ``docker save`` output are sets of named files; the same readers
take them from a directory or from an uncompressed tar. A ``Blob`` is a byte range of
an open fd (the whole file of a directory, a member's data in the tar), so the unpack
process reads a layer from the fd it is handed, without extracting the outer tar.

Names are opened beneath the image, one component at a time with ``O_NOFOLLOW``: a
symlink anywhere in a layout directory is refused, never followed. In a tar, symlink
and hard-link members are resolved among its own members and may not leave it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from dataclasses import dataclass
from typing import Any, Protocol

from toolpool.images.errors import ImageError

# The bound on a JSON document of an image (index, manifest, config) read by the daemon.
MAX_JSON_BYTES = 4 << 20
# The bound on the members of an outer tar (an image holds a few dozen files).
MAX_ARCHIVE_MEMBERS = 100_000
_SYMLINK_HOPS = 16
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Blob:
    """``size`` bytes at ``offset`` of the open file ``fd``, named ``name`` in the image."""

    name: str
    fd: int
    offset: int
    size: int

    def read(self) -> bytes:
        """The whole blob (only for the small JSON documents)."""
        parts = []
        done = 0
        while done < self.size:
            chunk = os.pread(self.fd, min(_CHUNK, self.size - done), self.offset + done)
            if not chunk:
                raise ImageError(f"{self.name} is shorter than its {self.size} bytes")
            parts.append(chunk)
            done += len(chunk)
        return b"".join(parts)


class Container(Protocol):
    """A set of named files: an image directory or an image tar."""

    def find(self, name: str) -> Blob | None:
        """The file ``name`` (a relative path), or None when there is none."""


def split_name(name: str) -> list[str]:
    """``name``'s components; ImageError when it is absolute or climbs with ``..``."""
    if name.startswith("/"):
        raise ImageError(f"{name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"{name!r} climbs out with '..'")
    return parts


class DirContainer:
    """The files beneath an open directory, reached without following any symlink."""

    def __init__(self, dir_fd: int, fds: list[int]) -> None:
        self._dir_fd = dir_fd
        self._fds = fds  # what is opened here is closed with the image

    def find(self, name: str) -> Blob | None:
        parts = split_name(name)
        if not parts:
            return None
        fd = os.dup(self._dir_fd)
        try:
            for part in parts[:-1]:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = next_fd
            blob_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise ImageError(
                f"{name} cannot be opened without following a symlink ({error.strerror})"
            ) from None
        finally:
            os.close(fd)
        self._fds.append(blob_fd)
        info = os.fstat(blob_fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageError(f"{name} is not a regular file")
        return Blob(name, blob_fd, 0, info.st_size)


class TarContainer:
    """The regular files of an uncompressed tar, indexed once: name → byte range."""

    def __init__(self, fd: int, shown: str) -> None:
        self._fd = fd
        self._files: dict[str, tuple[int, int]] = {}
        self._links: dict[str, tuple[str, bool]] = {}  # name → (target, is_symlink)
        head = os.pread(fd, 6, 0)
        if head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00":
            raise ImageError(f"{shown} is a compressed archive: decompress it first")
        try:
            with os.fdopen(os.dup(fd), "rb") as file, tarfile.open(fileobj=file, mode="r:") as tar:
                self._index(tar, shown)
        except tarfile.TarError as error:
            raise ImageError(f"{shown} is not a tar archive ({error})") from None

    def _index(self, tar: tarfile.TarFile, shown: str) -> None:
        count = 0
        while (member := tar.next()) is not None:
            count += 1
            if count > MAX_ARCHIVE_MEMBERS:
                raise ImageError(f"{shown} has more than {MAX_ARCHIVE_MEMBERS} members")
            tar.members.clear()  # type: ignore[attr-defined]  # names are enough
            name = "/".join(split_name(member.name))
            if member.isreg() and not member.issparse():
                self._files[name] = (member.offset_data, member.size)
            elif member.issym() or member.islnk():
                self._links[name] = (member.linkname, member.issym())

    def find(self, name: str) -> Blob | None:
        wanted = "/".join(split_name(name))
        for _ in range(_SYMLINK_HOPS):
            if wanted in self._files:
                offset, size = self._files[wanted]
                return Blob(name, self._fd, offset, size)
            if wanted not in self._links:
                return None
            target, symbolic = self._links[wanted]
            base = wanted.rsplit("/", 1)[0] if symbolic and "/" in wanted else ""
            wanted = "/".join(split_name(f"{base}/{target}" if base else target))
        raise ImageError(f"{name} is a chain of more than {_SYMLINK_HOPS} links")


def read_json(container: Container, name: str, digest: str | None = None) -> Any:
    """The JSON document ``name``, its sha256 checked against ``digest`` when given."""
    blob = container.find(name)
    if blob is None:
        raise ImageError(f"the image has no {name}")
    if blob.size > MAX_JSON_BYTES:
        raise ImageError(f"{name} is larger than {MAX_JSON_BYTES} bytes")
    data = blob.read()
    if digest is not None:
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ImageError(
                f"{name}: digest mismatch (the image says {digest}, its bytes are {actual})"
            )
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ImageError(f"{name} is not JSON ({error})") from None
