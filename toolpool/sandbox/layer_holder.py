"""A session's layers for a daemon not run as root (SPEC V17): this process makes a
user namespace of its own (the daemon's uid as its root) and a mount namespace owned
by it, and mounts there what the daemon asks — a tmpfs, overlays — for as long as it
lives. The daemon reaches those mounts through ``/proc/<pid>/root`` (its file tools)
and starts the session's sandboxes inside these namespaces (``nsenter``); nothing is
mounted in the host's.

Run as ``python -I -S layer_holder.py``, one per session: it answers ``ready`` once
its namespaces exist, then reads one request per line on stdin — a JSON list
``[source, target, fstype, options]`` — and answers ``ok`` or ``error: why``. It ends
when stdin closes (the daemon closed it, or died), and its mounts go with it.
Standard library only: it runs before anything of toolpool could be trusted here.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MS_NOSUID = 2
_MS_NODEV = 4
_PR_SET_PDEATHSIG = 1
_SIGKILL = 9

_libc = ctypes.CDLL(None, use_errno=True)


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


def _mount(source: str, target: str, kind: str, options: str) -> None:
    flags = _MS_NOSUID | _MS_NODEV if kind == "tmpfs" else 0
    if _libc.mount(source.encode(), target.encode(), kind.encode(), flags, options.encode()):
        raise _fail(f"mount {kind} on {target}")


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
            source, target, kind, options = json.loads(line)
            _mount(str(source), str(target), str(kind), str(options))
        except (OSError, ValueError, TypeError) as exc:
            print(f"error: {exc}", flush=True)
            continue
        print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
