"""Opening below a directory fd, never through a symlink nor ``..`` (SPEC X4).

    fd = open_beneath(dir_fd, "src/main.py", os.O_RDONLY)   # ELOOP/ENOTDIR at a symlink
    info = stat_beneath(dir_fd, "src")                       # a symlink's own stat

openat2 (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``) where the kernel has it and no
seccomp filter refuses it, else a walk of ``STEP_FLAGS`` opens (``O_PATH |
O_NOFOLLOW``), one component at a time. The tools use these below a directory that
paths.py resolved (glob, grep, tree): the names there are real, so a symlink met is a
swap and is refused.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

STEP_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # one component, never a link

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (the generic table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_openat2_works: bool | None = None


def _openat2(dir_fd: int, rel: str, flags: int) -> int | None:
    """openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; None when the kernel lacks it."""
    global _openat2_works
    if _openat2_works is False:
        return None
    how = struct.pack(
        "QQQ", flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    )
    for _ in range(8):
        fd = int(_libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), how, len(how)))
        if fd >= 0:
            _openat2_works = True
            return fd
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM) and _openat2_works is None:
            _openat2_works = False  # no openat2, or a seccomp filter refuses it
            return None
        if err != errno.EAGAIN:  # EAGAIN: a rename raced the walk; try again
            raise OSError(err, os.strerror(err), rel)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


def open_beneath(dir_fd: int, rel: str, flags: int) -> int:
    """An fd of ``rel`` (a relative path of real names) below ``dir_fd``, never
    through a symlink nor ``..``: openat2 where the kernel has it, else an
    ``O_NOFOLLOW`` walk. A symlink anywhere on the way is ``ELOOP``/``ENOTDIR``."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), rel)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dir_fd)
    fd = _openat2(dir_fd, "/".join(parts), flags | os.O_CLOEXEC | os.O_NOFOLLOW)
    if fd is not None:
        return fd
    current = dir_fd
    try:
        for part in parts[:-1]:
            step = os.open(part, STEP_FLAGS | os.O_DIRECTORY, dir_fd=current)
            if current != dir_fd:
                os.close(current)
            current = step
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


def stat_beneath(dir_fd: int, rel: str) -> os.stat_result:
    """The stat of ``rel`` below ``dir_fd`` (a symlink's own), as ``open_beneath``."""
    fd = open_beneath(dir_fd, rel, os.O_PATH)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
