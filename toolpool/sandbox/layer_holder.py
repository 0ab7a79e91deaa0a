"""A session's layers for a daemon not run as root (SPEC V17): this process makes a
user namespace of its own (the daemon's uid as its root) and a mount namespace owned
by it, and mounts there what the daemon asks — a tmpfs, overlays — for as long as it
lives. The daemon reaches those mounts through ``/proc/<pid>/root`` (its file tools)
and starts the session's sandboxes inside these namespaces (``nsenter``); nothing is
mounted in the host's. The sessions forked from one another share one holder (their
frozen layers are each other's lower layers, B3).

Run as ``python -I -S layer_holder.py``: it answers ``ready`` once its namespaces
exist, then reads one request per line on stdin — a JSON list, its first item the
operation: ``["mount", source, target, fstype, options]``, ``["overlay", target,
lowers, upper, work, options]`` or ``["umount", target, lazily]`` — and answers ``ok`` or
``error: why``. It ends when stdin closes (the daemon closed it, or died), and its
mounts go with it. Standard library only: it runs before anything of toolpool could
be trusted here. The daemon run as root mounts its overlays with ``mount_overlay``
too (one way to name many lower layers).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Sequence

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MS_NOSUID = 2
_MS_NODEV = 4
_PR_SET_PDEATHSIG = 1
_SIGKILL = 9
# The new mount API (Linux 5.2; overlay's "lowerdir+" 6.8): each lower layer its own
# string, so that a stack of many layers is not cut at mount(2)'s 4 KiB of options.
_SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 429, 430, 431, 432
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_MOVE_MOUNT_F_EMPTY_PATH = 4
_AT_FDCWD = -100
_MNT_DETACH = 2
MAX_LOWER_LAYERS = 500  # overlayfs's OVL_MAX_STACK

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _fail(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


def _enter_namespaces() -> None:
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS):
        raise _fail("unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None):
        raise _fail("make / private")


def mount(source: str, target: str, kind: str, options: str) -> None:
    """mount(2) of ``kind`` (a tmpfs is nosuid and nodev)."""
    flags = _MS_NOSUID | _MS_NODEV if kind == "tmpfs" else 0
    if _libc.mount(source.encode(), target.encode(), kind.encode(), flags, options.encode()):
        raise _fail(f"mount {kind} on {target}")


def mount_overlay(
    target: str, lowers: Sequence[str], upper: str, work: str, options: Sequence[str]
) -> None:
    """An overlay at ``target`` of ``lowers`` (the topmost first), read-only without
    ``upper`` (then ``work`` is unused); ``options`` are flags ("userxattr") or
    ``key=value`` ("redirect_dir=on")."""
    if not lowers or len(lowers) > MAX_LOWER_LAYERS:
        raise OSError(f"an overlay takes 1 to {MAX_LOWER_LAYERS} lower layers, not {len(lowers)}")
    fs = _libc.syscall(_SYS_FSOPEN, b"overlay", _FSOPEN_CLOEXEC)
    if fs < 0:
        raise _fail("fsopen overlay")
    try:

        def string(key: str, value: str) -> None:
            if _libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key.encode(),
                             os.fsencode(value), 0) < 0:  # fmt: skip
                raise _fail(f"overlay {key}={value}")

        for lower in lowers:
            string("lowerdir+", lower)
        if upper:
            string("upperdir", upper)
            string("workdir", work)
        for option in options:
            key, is_pair, value = option.partition("=")
            if is_pair:
                string(key, value)
            elif _libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_FLAG, key.encode(), None, 0) < 0:
                raise _fail(f"overlay {key}")
        if _libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0) < 0:
            raise _fail(f"overlay on {target}")
        mounted = _libc.syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, 0)
        if mounted < 0:
            raise _fail(f"fsmount overlay on {target}")
        try:
            if _libc.syscall(_SYS_MOVE_MOUNT, mounted, b"", _AT_FDCWD, os.fsencode(target),
                             _MOVE_MOUNT_F_EMPTY_PATH) < 0:  # fmt: skip
                raise _fail(f"move_mount overlay to {target}")
        finally:
            os.close(mounted)
    finally:
        os.close(fs)


def unmount(target: str, *, lazily: bool = False) -> None:
    """umount(2); one that is busy fails (EBUSY) unless ``lazily``."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH if lazily else 0):
        raise _fail(f"umount {target}")


def _serve(request: list[object]) -> None:
    operation, *arguments = request
    match operation:
        case "mount":
            source, target, kind, options = (str(a) for a in arguments)
            mount(source, target, kind, options)
        case "overlay":
            where, lowers, upper, work, flags = arguments
            if not isinstance(lowers, list) or not isinstance(flags, list):
                raise ValueError("an overlay's lowers and options are lists")
            mount_overlay(str(where), [str(x) for x in lowers], str(upper), str(work),
                          [str(x) for x in flags])  # fmt: skip
        case "umount":
            point, lazily = arguments
            unmount(str(point), lazily=bool(lazily))
        case _:
            raise ValueError(f"no operation {operation!r}")


def main() -> int:
    _libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL)  # the daemon gone: so are we, and the mounts
    try:
        _enter_namespaces()
    except OSError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if not isinstance(request, list) or not request:
                raise ValueError("a request is a non-empty list")
            _serve(request)
        except (OSError, ValueError, TypeError) as exc:
            print(f"error: {exc}", flush=True)
            continue
        print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
