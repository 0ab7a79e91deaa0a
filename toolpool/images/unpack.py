"""One layer tar → one directory, in a process of its own under limits (``python -m``).

The daemon starts this module for every layer it unpacks (``unpacking.run_unpack``),
hands it the layer's fd and a job on stdin, and reads one JSON report from stdout. It
sets its rlimits (file size, CPU, address space, open files) before it reads a byte.

What a layer may not do, each refused with ``image_invalid`` and nothing of it kept:
an absolute member or one with ``..``; a member below a symlink or a file of the layer
(every directory is opened with ``O_NOFOLLOW``, so a symlink is never written through);
a hard link to anything but a file or symlink this layer made; a whiteout naming
``.``, ``..`` or nothing, or a ``.wh.`` directory. What it may not keep: device nodes
and fifos are skipped (counted in the report); set-id and sticky bits are stripped;
ownership is applied only when unpacking as root; the archive's xattrs are never
applied (so a layer cannot set overlay's own). Whiteouts become overlay's: ``.wh.NAME``
a 0/0 character device, ``.wh..wh..opq`` the ``<kind>.overlay.opaque=y`` xattr on its
directory (``trusted`` as root, ``user`` unprivileged, for a ``userxattr`` mount).
Past ``max_bytes`` (of the uncompressed stream or of what is written) or
``max_entries`` members it stops with ``limit_exceeded``.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import sys
import tarfile
import zlib
from typing import Any

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """The layer is refused: ``code`` and a message for the report."""

    def __init__(self, message: str, code: str = "image_invalid") -> None:
        super().__init__(message)
        self.code = code


class _Source(io.RawIOBase):
    """The layer's bytes (``size`` at ``offset`` of ``fd``), hashed as they are read."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._fd, self._pos, self._end = fd, offset, offset + size
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._end - self._pos)
        data = os.pread(self._fd, want, self._pos) if want > 0 else b""
        buffer[: len(data)] = data
        self._pos += len(data)
        self.sha.update(data)
        return len(data)


class _Counted(io.RawIOBase):
    """The uncompressed tar stream: hashed (the diff id) and bounded to ``limit`` bytes."""

    def __init__(self, inner: io.BufferedIOBase, limit: int) -> None:
        self._inner, self._limit, self.count = inner, limit, 0
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        self.count += len(data)
        if self.count > self._limit:
            raise Refused(
                f"the layer's tar is larger than max_bytes ({self._limit})", "limit_exceeded"
            )
        buffer[: len(data)] = data
        self.sha.update(data)
        return len(data)


def parts_of(name: str, what: str = "member") -> list[str]:
    """A member name's components; Refused when it is absolute or climbs with ``..``."""
    if name.startswith("/"):
        raise Refused(f"{what} {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"{what} {name!r} climbs out of the layer with '..'")
    return parts


class Layer:
    """The directory one layer is unpacked into, written only through directory fds."""

    def __init__(self, root_fd: int, job: dict[str, Any]) -> None:
        self.root_fd = root_fd
        self.opaque = f"{job['xattr']}.overlay.opaque"
        self.owners = bool(job["owners"])
        self.max_bytes = int(job["max_bytes"])
        self.written = 0
        self.skipped: list[str] = []
        self.dirs: dict[tuple[str, ...], tarfile.TarInfo] = {}

    def open_dir(self, parts: list[str], name: str, create: bool = True) -> int:
        """An fd of the directory ``parts``, made when missing (``create``); Refused when
        a component is a symlink or a file: nothing is written through one."""
        fd = os.dup(self.root_fd)
        try:
            for part in parts:
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as error:
                    if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    raise Refused(
                        f"member {name!r} lies below {part!r}, a symlink or file of this layer"
                    ) from None
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = parts_of(member.name)
        if not parts:
            if member.isdir():
                self.dirs[()] = member
            return
        for part in parts[:-1]:
            if part.startswith(_WHITEOUT):
                raise Refused(f"member {member.name!r} lies below a whiteout")
        base = parts[-1]
        if base.startswith(_WHITEOUT):
            self._whiteout(parts, member.name)
            return
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            self.skipped.append(member.name)  # devices and fifos: /dev is the sandbox's
            return
        parent = self.open_dir(parts[:-1], member.name)
        try:
            self._clear(parent, base, keep_dir=member.isdir())
            if member.isdir():
                if not _exists(parent, base):
                    os.mkdir(base, 0o700, dir_fd=parent)
                self.dirs[tuple(parts)] = member
            elif member.issym():
                os.symlink(member.linkname, base, dir_fd=parent)
                self._own(parent, base, member)
            elif member.islnk():
                self._hard_link(parent, base, member)
            else:
                self._file(tar, parent, base, member)
        finally:
            os.close(parent)

    def _whiteout(self, parts: list[str], name: str) -> None:
        base = parts[-1]
        parent = self.open_dir(parts[:-1], name)
        try:
            if base == _OPAQUE:
                os.setxattr(parent, self.opaque, b"y")
                return
            target = base[len(_WHITEOUT) :]
            if target in ("", ".", "..") or target.startswith(_WHITEOUT):
                raise Refused(f"whiteout {name!r} names {target!r}, which is no entry")
            if not _exists(parent, target):  # this layer's own entry of that name wins
                os.mknod(target, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)
        finally:
            os.close(parent)

    def _clear(self, parent: int, base: str, keep_dir: bool) -> None:
        """Remove what an earlier member put at ``base`` (a later member replaces it)."""
        try:
            info = os.stat(base, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            if not keep_dir:
                shutil.rmtree(base, dir_fd=parent)
        else:
            os.unlink(base, dir_fd=parent)

    def _hard_link(self, parent: int, base: str, member: tarfile.TarInfo) -> None:
        target = parts_of(member.linkname, "hard link target")
        if not target:
            raise Refused(f"hard link {member.name!r} points at the layer's root")
        try:
            target_dir = self.open_dir(target[:-1], member.name, create=False)
        except FileNotFoundError:
            target_dir = -1
        try:
            info = None
            if target_dir >= 0:
                try:
                    info = os.stat(target[-1], dir_fd=target_dir, follow_symlinks=False)
                except FileNotFoundError:
                    info = None
            if info is None or not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                raise Refused(
                    f"hard link {member.name!r} points at {member.linkname!r}, "
                    "which is no file of this layer"
                )
            os.link(
                target[-1], base, src_dir_fd=target_dir, dst_dir_fd=parent, follow_symlinks=False
            )
        finally:
            if target_dir >= 0:
                os.close(target_dir)

    def _file(self, tar: tarfile.TarFile, parent: int, base: str, member: tarfile.TarInfo) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(base, flags, 0o600, dir_fd=parent)
        try:
            data = tar.extractfile(member)
            assert data is not None  # a regular member has data
            while chunk := data.read(_CHUNK):
                self.written += len(chunk)
                if self.written > self.max_bytes:
                    raise Refused(
                        f"the layer's files are larger than max_bytes ({self.max_bytes})",
                        "limit_exceeded",
                    )
                os.write(fd, chunk)
            if self.owners:
                os.fchown(fd, member.uid, member.gid)
            os.fchmod(fd, member.mode & 0o777)  # no set-id, no sticky
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)

    def _own(self, parent: int, base: str, member: tarfile.TarInfo) -> None:
        if self.owners:
            os.chown(base, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)

    def finish_dirs(self) -> None:
        """Directories' owners, modes and times, deepest first (a read-only directory
        would block its children otherwise)."""
        for parts, member in sorted(self.dirs.items(), key=lambda item: -len(item[0])):
            fd = self.open_dir(list(parts), member.name, create=False)
            try:
                if self.owners:
                    os.fchown(fd, member.uid, member.gid)
                os.fchmod(fd, member.mode & 0o777)
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)


def _exists(parent: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def unpack(job: dict[str, Any]) -> dict[str, Any]:
    """Unpack the job's layer into ``job["dest"]``; the report, or Refused."""
    source = _Source(int(job["fd"]), int(job["offset"]), int(job["size"]))
    compression = job["compression"]
    if compression == "auto":
        head = os.pread(int(job["fd"]), 2, int(job["offset"]))
        compression = "gzip" if head == b"\x1f\x8b" else "none"
    raw = io.BufferedReader(source, _CHUNK)
    inner: io.BufferedIOBase = (
        gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw
    )
    stream = _Counted(inner, int(job["max_bytes"]))
    root_fd = os.open(job["dest"], _DIR_FLAGS)
    layer = Layer(root_fd, job)
    entries = 0
    try:
        with tarfile.open(fileobj=io.BufferedReader(stream, _CHUNK), mode="r|") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # type: ignore[attr-defined]  # a stream's need not be kept
                entries += 1
                if entries > int(job["max_entries"]):
                    raise Refused(
                        f"the layer has more than max_entries ({job['max_entries']}) members",
                        "limit_exceeded",
                    )
                layer.add(tar, member)
            while stream.read(_CHUNK):  # the rest (the tar's end blocks) counts in the hash
                pass
        layer.finish_dirs()
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise Refused(f"the layer is not a valid tar ({compression}): {error}") from None
    finally:
        os.close(root_fd)
    _check_digest("the layer's digest", job["digest"], source.sha.hexdigest())
    _check_digest("the layer's diff id", job["diff_id"], stream.sha.hexdigest())
    return {
        "ok": True,
        "entries": entries,
        "bytes": disk_bytes(job["dest"]),
        "skipped": len(layer.skipped),
        "skipped_names": layer.skipped[:10],
    }


def _check_digest(what: str, expected: str | None, actual_hex: str) -> None:
    if expected is not None and expected != f"sha256:{actual_hex}":
        raise Refused(
            f"{what} does not match: the image says {expected}, it is sha256:{actual_hex}"
        )


def disk_bytes(path: str) -> int:
    """What the tree at ``path`` takes on disk (its blocks, every inode counted)."""
    total = os.lstat(path).st_blocks * 512
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def _limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def main() -> None:
    job = json.load(sys.stdin)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails: EFBIG
    _limit(resource.RLIMIT_FSIZE, int(job["max_bytes"]))
    cpu = int(job["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    _limit(resource.RLIMIT_AS, int(job["address_space"]))
    _limit(resource.RLIMIT_NOFILE, int(job["open_files"]))
    try:
        report = unpack(job)
    except Refused as refused:
        report = {"ok": False, "code": refused.code, "message": str(refused)}
    except MemoryError:
        report = {
            "ok": False,
            "code": "limit_exceeded",
            "message": f"unpacking needed more than its {job['address_space']} bytes of memory",
        }
    except OSError as error:
        if error.errno == errno.EFBIG:
            message = f"a file of the layer is larger than max_bytes ({job['max_bytes']})"
            report = {"ok": False, "code": "limit_exceeded", "message": message}
        elif error.errno == errno.EMFILE:
            message = f"unpacking needed more than {job['open_files']} open files"
            report = {"ok": False, "code": "limit_exceeded", "message": message}
        else:
            report = {"ok": False, "code": "image_invalid", "message": f"unpacking failed: {error}"}
    sys.stdout.write(json.dumps(report))


if __name__ == "__main__":
    main()
