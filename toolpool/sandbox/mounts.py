"""The file system a bubblewrap-confined command sees: bubblewrap's mount arguments.

    args += bwrap_mounts(roots, policy, tmp_bytes)   # first, before the namespaces' own

A read-only view of /, the roots (workspace and ``writable``) read-write, a private
/tmp (a tmpfs of ``tmp_bytes``, HOME at ``PRIVATE_HOME`` on it), every hidden path of
the policy masked (an empty tmpfs, or /dev/null for a file), and the interpreter,
toolpool and the resolver configuration bound back wherever a mask covers them (X1).
"""

from __future__ import annotations

import functools
import os
import site
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolpool.sandbox import confine_exec
from toolpool.sandbox.policy import Policy, is_under

PRIVATE_HOME = "/tmp/home"  # HOME inside the sandbox: on the private /tmp


@functools.cache
def interpreter_paths() -> tuple[str, ...]:
    """What a command may need of our own install: the interpreter, its standard
    library and site-packages, and toolpool itself, as real paths (X1)."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.dirname(sys.executable),
        str(Path(confine_exec.__file__).resolve().parent.parent),  # the toolpool package
        *site.getsitepackages(),
    }
    return tuple(sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}))


def _strictly_under(path: str, others: Sequence[str]) -> bool:
    return any(path != o and is_under(path, o) for o in others)


def _masked(policy: Policy) -> list[str]:
    """Paths replaced by an empty tmpfs (directories) or /dev/null (files), but none
    inside another (what a mask covers is gone already)."""
    masked = [str(p) for p in policy.hidden_paths() if os.path.lexists(p)]
    if policy.private_run:
        masked += [os.path.realpath(p) for p in ("/run", "/var/run") if os.path.isdir(p)]
    masks = list(dict.fromkeys(masked))
    return [m for m in masks if not _strictly_under(m, masks)]


# The root of the sandbox's file system: this host's, read-only. A session sandbox
# may one day be given another (an overlay of /, an image's layers).
HOST_ROOT = ("--ro-bind", "/", "/")


def bwrap_mounts(
    roots: Sequence[Path],
    policy: Policy,
    tmp_bytes: int,
    root: Sequence[str] = HOST_ROOT,
    views: Mapping[str, str] | None = None,
) -> list[str]:
    """bubblewrap's mount arguments. Order matters: the root (``root``, bubblewrap's
    arguments that mount /), masks of paths that contain a root go first, then what
    must stay visible under a mask (the interpreter, the resolver configuration),
    then the roots, then masks inside the roots. ``views``: what is bound at a root's
    real path instead of the root itself (its session's overlay of it, V14), and at
    ``/tmp`` instead of a tmpfs of ``tmp_bytes`` (a layered session's, B1)."""
    real_roots = [os.path.realpath(r) for r in roots]
    args = [*root, "--dev", "/dev", "--proc", "/proc"]
    kept_tmp = (views or {}).get("/tmp")  # a session's own, that outlives its sandbox
    if kept_tmp is None:
        args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    else:
        args += ["--bind", kept_tmp, "/tmp"]
    args += ["--dir", PRIVATE_HOME]
    masks = _masked(policy)
    outer = [m for m in masks if not any(is_under(m, r) for r in real_roots)]
    inner = [m for m in masks if m not in outer and m not in real_roots]
    directories = {m for m in masks if os.path.isdir(m)}
    for mask in outer:
        args += _mask(mask, mask in directories)
    # Whatever a mask (or the private /tmp) covers but the command needs, back again.
    covering = ["/tmp", *outer]
    keep = [p for p in interpreter_paths() if any(is_under(p, c) for c in covering)]
    resolv = os.path.realpath("/etc/resolv.conf")
    if _strictly_under(resolv, covering) and os.path.exists(resolv):
        keep.append(resolv)
    for path in keep:
        if not _strictly_under(path, keep):  # a bind brings what lies under it along
            args += ["--ro-bind", path, path]
    for root in real_roots:
        args += ["--bind", (views or {}).get(root, root), root]
    for mask in inner:
        args += _mask(mask, mask in directories)
    # Read-only only once everything under the masks is mounted.
    return args + [a for m in [*outer, *inner] if m in directories for a in ("--remount-ro", m)]


def hidden_from_sandbox(path: Path, roots: Sequence[Path], policy: Policy) -> bool:
    """Whether ``path`` is out of sight of a command under ``bwrap_mounts``: under the
    private /tmp or a mask, and not under anything bound back (a root, our install)."""
    real = os.path.realpath(path)
    real_roots = [os.path.realpath(r) for r in roots]
    masks = _masked(policy)
    # A mask inside a root is mounted after the roots (bwrap_mounts): it hides.
    inner = [m for m in masks if m not in real_roots and any(is_under(m, r) for r in real_roots)]
    if any(is_under(real, m) for m in inner):
        return True
    if any(is_under(real, s) for s in [*real_roots, *interpreter_paths()]):
        return False
    return any(is_under(real, c) for c in ["/tmp", *masks])


def _mask(path: str, directory: bool) -> list[str]:
    """An empty directory, or a file that cannot be opened (/dev/null on a nodev
    mount: "Permission denied")."""
    if directory:
        return ["--perms", "0755", "--tmpfs", path]
    return ["--ro-bind", "/dev/null", path]
