"""Pathname Unix sockets out of a policy session's reach (SPEC N9).

A command can ``connect()`` to a Unix socket by its path whatever network namespace
it is in — a container engine's socket, an SSH or GPG agent's, a local proxy's —
and a read-only mount does not stop it (connecting needs write permission on the
socket, which a read-only file system does not take away from a socket). Abstract
sockets (``@name``) belong to a network namespace: a policy session's own namespace
has none of the host's.

So, when a policy session's sandbox starts, every socket bound on this host
(``/proc/net/unix``) that its commands would see — not under the session's roots,
not under the private ``/tmp`` and ``/run`` or a ``deny_read`` mask already — gets
``/dev/null`` bound over it: connecting there is refused (ECONNREFUSED), and nothing
else of its directory is hidden. Sockets the policy lists (``unix_sockets``) are
left as they are. ``socket(AF_UNIX)``, ``socketpair`` and sockets bound under the
roots (or in ``/tmp``) keep working: this is a mount, not a seccomp rule.

A socket made on the host after the sandbox started is not covered until the
session's sandbox starts again.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from toolpool.sandbox.mounts import hidden_from_sandbox
from toolpool.sandbox.policy import Policy, is_under

_TABLE = "/proc/net/unix"


def bound_socket_paths(table: str = _TABLE) -> list[str]:
    """The paths of the pathname sockets bound in this network namespace."""
    found: list[str] = []
    try:
        with open(table, encoding="utf-8", errors="surrogateescape") as f:
            next(f, None)
            for line in f:
                fields = line.rstrip("\n").split(None, 7)
                if len(fields) == 8 and fields[7].startswith("/"):
                    found.append(fields[7])
    except OSError:
        pass
    return list(dict.fromkeys(found))


def masked_sockets(
    roots: Sequence[Path], policy: Policy, allowed: Iterable[str], paths: Iterable[str] = ()
) -> list[str]:
    """The sockets to mask in a policy session's sandbox: those of ``paths`` (every
    one bound here, by default) that exist as sockets, lie outside ``roots``, are not
    hidden from the sandbox already, and are not ``allowed``."""
    keep = {os.path.realpath(p) for p in allowed}
    real_roots = [os.path.realpath(r) for r in roots]
    masked: list[str] = []
    for path in list(paths) or bound_socket_paths():
        real = os.path.realpath(path)
        if real in keep or any(is_under(real, r) for r in real_roots):
            continue
        try:
            if not stat.S_ISSOCK(os.lstat(real).st_mode):
                continue
        except OSError:
            continue  # gone, or bound in another mount namespace
        if hidden_from_sandbox(Path(real), roots, policy):
            continue
        masked.append(real)
    return sorted(set(masked))


def mask_arguments(sockets: Iterable[str]) -> list[str]:
    """bubblewrap's arguments masking ``sockets``; after the root and the roots."""
    return [a for path in sockets for a in ("--ro-bind", "/dev/null", path)]
