"""A session's copy-on-write root (SPEC V12): the host's root as the lower layer of
an overlay whose upper layer lies on a tmpfs of ``layer_bytes``, mounted by the
daemon (as root) under its runtime dir, where no command sees it; the session's
sandbox takes the merged tree as its ``/``.

    layer = RootLayer.make(directory, layer_bytes)     # tmpfs + overlay of /
    SessionSandbox.start(..., root=layer.root_args())  # bubblewrap binds it as /
    layer.used_bytes()                                  # what the session wrote
    layer.remove()                                      # unmounted, gone

Writes anywhere in the root (``pip install`` into /usr/local, /etc) land in the
upper layer; the host's root never changes; whatever the layer holds is gone when it
is removed. The overlay covers the root file system only: other host mounts under it
show as empty directories (or their mount points' contents) unless the sandbox binds
them (the roots, /dev, /proc, the private /tmp and /run are its own). A directory
renamed inside is moved by overlayfs's ``redirect_dir``; a file is copied up whole
on its first write. A full layer is ENOSPC for the command that filled it.

Mounting needs CAP_SYS_ADMIN in the host's namespaces: a daemon run as another user
gets a clear refusal (its sessions keep the host's root).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from pathlib import Path

from toolpool.sandbox.session_box import SandboxStartError

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
_MS_NOSUID = 2
_MS_NODEV = 4


class LayerError(SandboxStartError):
    """The session's layer could not be made (so neither its sandbox); says why."""

    def __init__(self, why: str) -> None:
        super().__init__(f"its copy-on-write root could not be made: {why}")


def _mount(source: str, target: Path, kind: str, flags: int, options: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), kind.encode(), flags, options.encode()):
        errno = ctypes.get_errno()
        raise LayerError(f"mount {kind} on {target}: {os.strerror(errno)}")


def _unmount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) and ctypes.get_errno() not in (22, 2):
        raise OSError(ctypes.get_errno(), f"umount {target}: {os.strerror(ctypes.get_errno())}")


class RootLayer:
    """One session's copy-on-write root: ``merged`` is what its sandbox takes as /."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.merged = directory / "merged"

    @classmethod
    def make(cls, directory: Path, layer_bytes: int) -> RootLayer:
        """A tmpfs of ``layer_bytes`` at ``directory`` (made here, private) holding the
        upper layer, and the overlay of / over it. Raises LayerError."""
        if os.geteuid() != 0:
            raise LayerError(
                "an overlay of the host's root is mounted by a daemon run as root, and "
                'this one is not (its sessions keep root = "host")'
            )
        if any(c in str(directory) for c in ",:\\"):  # overlay's option syntax
            raise LayerError(f"its directory {directory} holds a ',', ':' or '\\'")
        directory.mkdir(mode=0o700)
        layer = cls(directory)
        try:
            _mount(
                "toolpool-layer",
                directory,
                "tmpfs",
                _MS_NOSUID | _MS_NODEV,
                f"size={layer_bytes},mode=0700",
            )
            for name in ("upper", "work", "merged"):
                (directory / name).mkdir(mode=0o755)
            _apt_as_root(directory / "upper")
            options = f"lowerdir=/,upperdir={directory / 'upper'},workdir={directory / 'work'}"
            _mount("toolpool-root", layer.merged, "overlay", 0, options + ",redirect_dir=on")
        except BaseException:
            layer.remove()
            raise
        return layer

    def root_args(self) -> tuple[str, ...]:
        """bubblewrap's arguments that make the merged tree the sandbox's root."""
        return ("--bind", str(self.merged), "/")

    def used_bytes(self) -> int:
        """What the session's writes take on its layer's tmpfs."""
        try:
            found = os.statvfs(self.directory)
        except OSError:
            return 0
        return (found.f_blocks - found.f_bfree) * found.f_frsize

    def remove(self) -> None:
        """Unmount the overlay and the tmpfs (lazily: a process still inside keeps its
        view until it ends) and remove the directory; idempotent."""
        remove_layers(self.directory)


# apt drops to "_apt" for its downloads, which needs capabilities a command lacks
# (X5): in the session's own root it runs them as the user it is.
APT_SANDBOX = 'APT::Sandbox::User "root";\n'


def _apt_as_root(upper: Path) -> None:
    """Where the host has apt, the session's layer starts with its sandbox user set to
    root (a file of the upper layer: the host's /etc stays as it is)."""
    if not os.path.isdir("/etc/apt/apt.conf.d"):
        return
    conf = upper / "etc" / "apt" / "apt.conf.d"
    conf.mkdir(mode=0o755, parents=True)
    (conf / "99toolpool-sandbox").write_text(APT_SANDBOX)


FULL_BELOW_BYTES = 256 * 1024  # a layer with less room left than this is full


def layer_full(directory: Path) -> bool:
    """Whether the layer whose tmpfs is mounted at ``directory`` is (all but) full: a
    write past ``layer_bytes`` failed, or the next will."""
    try:
        found = os.statvfs(directory)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < FULL_BELOW_BYTES


def mounts_under(directory: Path) -> list[str]:
    """The mount points at or under ``directory``, the deepest first."""
    real = os.path.realpath(directory)
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as table:
        for line in table:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == real or point.startswith(real.rstrip("/") + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_layers(directory: Path) -> None:
    """Unmount every mount at or under ``directory`` (the deepest first) and remove
    it: a session's layer, or what a dead daemon left under its runtime dir. Never
    removes through a mount that stays (a merged root is the whole host's tree):
    then it is left, and OSError says why."""
    for point in mounts_under(directory):
        _unmount(Path(point))
    if mounts_under(directory):
        raise OSError(f"{directory} still holds mounts: left in place")
    shutil.rmtree(directory, ignore_errors=True)
