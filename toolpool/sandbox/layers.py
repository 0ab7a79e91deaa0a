"""A session's writable layers (SPEC V12–V14): one tmpfs of ``layer_bytes`` per
session, mounted by the daemon (as root) under its runtime dir, where no command sees
it, holding the upper layers of the session's overlays: of its root (the host's root,
or an image's layers, read-only below) and of its workspace (the host directory).

    layer = SessionLayer.make(directory, layer_bytes)   # the tmpfs
    layer.mount_root()                                  # an overlay of / (or lowers=…)
    layer.mount_workspace(workspace)                    # an overlay of the workspace
    SessionSandbox.start(..., root=layer.root_args())   # bubblewrap binds it as /
    layer.used_bytes()                                  # what the session wrote
    layer.remove()                                      # unmounted, gone

Writes anywhere in the root (``pip install`` into /usr/local, /etc) or the workspace
land in the upper layers; the lower layers never change; whatever the layer holds is
gone when it is removed. An overlay of the host's root covers its root file system
only: other host mounts under it show as empty directories (or their mount points'
contents) unless the sandbox binds them (the roots, /dev, /proc, the private /tmp and
/run are its own). A directory renamed inside is moved by overlayfs's
``redirect_dir``; a file is copied up whole on its first write. A full layer is
ENOSPC for the command or the file tool that filled it.

Mounting needs CAP_SYS_ADMIN in the host's namespaces: a daemon run as another user
gets a clear refusal (its sessions' commands are refused, never run on the host's).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from toolpool.sandbox.session_box import SandboxStartError

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
_MS_NOSUID = 2
_MS_NODEV = 4


class LayerError(SandboxStartError):
    """The session's layer could not be made (so neither its sandbox); says why."""

    def __init__(self, why: str) -> None:
        super().__init__(f"its copy-on-write layers could not be made: {why}")


def _mount(source: str, target: Path, kind: str, flags: int, options: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), kind.encode(), flags, options.encode()):
        errno = ctypes.get_errno()
        raise LayerError(f"mount {kind} on {target}: {os.strerror(errno)}")


def _unmount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) and ctypes.get_errno() not in (22, 2):
        raise OSError(ctypes.get_errno(), f"umount {target}: {os.strerror(ctypes.get_errno())}")


class SessionLayer:
    """One session's writable layers on one tmpfs of ``layer_bytes``: its root's
    (``root/``: an overlay of the host's root or of an image's layers, V12, V13) and
    its workspace's (``w/``: an overlay of the host directory, V14), each mounted when
    first asked for. ``root_merged`` is what its sandbox takes as /, ``workspace_view``
    what its commands and file tools see as the workspace."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.root_merged: Path | None = None
        self.workspace_view: Path | None = None

    @classmethod
    def make(cls, directory: Path, layer_bytes: int) -> SessionLayer:
        """A tmpfs of ``layer_bytes`` at ``directory`` (made here, private). Raises
        LayerError."""
        if os.geteuid() != 0:
            raise LayerError(
                "a session's layers are mounted by a daemon run as root, and this one is "
                'not (root = "overlay" or an image, workspace_mode = "overlay")'
            )
        _check_option_path(directory)
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
        except BaseException:
            layer.remove()
            raise
        return layer

    def mount_root(self, lowers: Sequence[Path] = (Path("/"),), *, userxattr: bool = False) -> Path:
        """The overlay of ``lowers`` (the topmost first, as overlay lists them) with
        its upper layer here; where apt is, apt's sandbox user is root in it."""
        if self.root_merged is None:
            for lower in lowers:
                _check_option_path(lower)
            merged = self._overlay(
                "root", ":".join(str(p) for p in lowers), userxattr, _apt_as_root
            )
            self.root_merged = merged
        return self.root_merged

    def mount_workspace(self, workspace: Path) -> Path:
        """The overlay of the host directory ``workspace`` with its upper layer here:
        the session's view of its workspace, the host's never written."""
        if self.workspace_view is None:
            _check_option_path(workspace)
            self.workspace_view = self._overlay("w", str(workspace), False, None)
        return self.workspace_view

    def _overlay(
        self, name: str, lowerdir: str, userxattr: bool, prepare: Callable[[Path, str], None] | None
    ) -> Path:
        place = self.directory / name
        place.mkdir(mode=0o755, exist_ok=True)  # a mount that failed may have left it
        for part in ("upper", "work", "merged"):
            (place / part).mkdir(mode=0o755, exist_ok=True)
        if prepare is not None:
            prepare(place / "upper", lowerdir.split(":")[0])
        options = f"lowerdir={lowerdir},upperdir={place / 'upper'},workdir={place / 'work'}"
        options += ",userxattr" if userxattr else ",redirect_dir=on"
        _mount(f"toolpool-{name}", place / "merged", "overlay", 0, options)
        return place / "merged"

    def root_args(self) -> tuple[str, ...]:
        """bubblewrap's arguments that make the merged root the sandbox's root."""
        assert self.root_merged is not None
        return ("--bind", str(self.root_merged), "/")

    def used_bytes(self) -> int:
        """What the session's writes take on its layer's tmpfs."""
        try:
            found = os.statvfs(self.directory)
        except OSError:
            return 0
        return (found.f_blocks - found.f_bfree) * found.f_frsize

    def remove(self) -> None:
        """Unmount the overlays and the tmpfs (lazily: a process still inside keeps
        its view until it ends) and remove the directory; idempotent."""
        remove_layers(self.directory)


def _check_option_path(path: Path) -> None:
    if any(c in str(path) for c in ",:\\"):  # overlay's option syntax
        raise LayerError(f"{path} holds a ',', ':' or '\\', which overlay options cannot name")


# apt drops to "_apt" for its downloads, which needs capabilities a command lacks
# (X5): in the session's own root it runs them as the user it is.
APT_SANDBOX = 'APT::Sandbox::User "root";\n'


def _apt_as_root(upper: Path, top: str) -> None:
    """Where the root has apt (``top``: its topmost lower layer), the session's layer
    starts with its sandbox user set to root (a file of the upper layer: the lower
    layers' /etc stays as it is)."""
    if not os.path.isdir(os.path.join(top, "etc/apt/apt.conf.d")):
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


def layers_self_check() -> tuple[bool, str]:
    """Whether a session's layers can be made here (``toolpool doctor``): a tmpfs, an
    overlay of the host's root and one of a directory, mounted, written through and
    removed in a private temporary directory; what failed otherwise."""
    if os.geteuid() != 0:
        return False, (
            'off: a daemon run as root mounts them (root = "overlay" or an image, '
            'workspace_mode = "overlay"); this one\'s sessions have their commands refused'
        )
    with tempfile.TemporaryDirectory(prefix="toolpool-layers-") as place:
        lower = Path(place) / "lower"
        lower.mkdir()
        try:
            layer = SessionLayer.make(Path(place) / "l", 1024 * 1024)
            try:
                view = layer.mount_workspace(lower)
                root = layer.mount_root()
                (view / "probe").write_text("x")
                if (lower / "probe").exists() or not (root / "etc").is_dir():
                    return False, "the overlays do not keep writes to their upper layer"
            finally:
                layer.remove()
        except (LayerError, OSError) as exc:
            return False, str(exc)
    return True, "a tmpfs and overlays of / and of a directory mount here and are removed"
