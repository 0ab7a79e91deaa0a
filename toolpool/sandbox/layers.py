"""A session's writable layers (SPEC V12–V14): one tmpfs of ``layer_bytes`` per
session, mounted by the daemon (as root) under its runtime dir, where no command sees
it, holding the upper layers of the session's overlays: of its root (the host's root,
or an image's layers, read-only below) and of its workspace (the host directory).

    layer = SessionLayer.make(directory, layer_bytes)   # the tmpfs
    layer.mount_root()                                  # an overlay of / (or lowers=…)
    layer.mount_workspace(workspace)                    # an overlay of the workspace
    SessionSandbox.start(..., root=layer.root_args())   # bubblewrap binds it as /
    layer.used_bytes()                                  # what the session wrote
    layer.freeze(); mark = layer.depths()               # a checkpoint (B1)
    layer.rewind(mark)                                  # back to it (B2)
    fork.mount_workspace(workspace, layer.inherit(mark))  # a fork's, on these (B3)
    layer.remove()                                      # unmounted, gone

Writes anywhere in the root (``pip install`` into /usr/local, /etc) or the workspace
land in the upper layers; the lower layers never change; whatever the layer holds is
gone when it is removed (or, for the layers it froze, when no fork stacks them any
more). Each overlay is a stack of layers (``layer_stack.Overlay``): checkpoints freeze
its upper layer, rewinds drop layers, forks stack theirs on it.

An overlay of the host's root covers its root file system only: other host mounts
under it show as empty directories (or their mount points' contents) unless the
sandbox binds them (the roots, /dev, /proc, the private /tmp and /run are its own). A
directory renamed inside is moved by overlayfs's ``redirect_dir``; a file is copied up
whole on its first write. A full layer is ENOSPC for the command or the file tool that
filled it.

A daemon run as root mounts them in the host's namespaces; any other in a user
namespace of its own (``layer_holder.py``, V17).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from toolpool.sandbox import layer_holder
from toolpool.sandbox.layer_namespace import LayerNamespace
from toolpool.sandbox.layer_stack import Overlay
from toolpool.sandbox.session_box import SandboxStartError

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


class LayerError(SandboxStartError):
    """The session's layer could not be made (so neither its sandbox); says why."""

    def __init__(self, why: str) -> None:
        super().__init__(f"its copy-on-write layers could not be made: {why}")


def _unmount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) and ctypes.get_errno() not in (22, 2):
        raise OSError(ctypes.get_errno(), f"umount {target}: {os.strerror(ctypes.get_errno())}")


Inherit = Mapping[str, tuple[Overlay, int]]  # a fork's: the parent's overlay, its depth

# A session's layers' size when it names none. (session_options.py, which another
# issue reshapes, still writes its own copy; tests/test_session_root.py keeps the
# two equal until it imports this one.)
DEFAULT_LAYER_BYTES = 1024**3


class SessionLayer:
    """One session's writable layers on one tmpfs of ``layer_bytes``: its root's
    (``root/``: an overlay of the host's root or of an image's layers, V12, V13) and
    its workspace's (``w/``: an overlay of the host directory, V14), each mounted when
    first asked for, and its sandboxes' ``/tmp`` (a tmpfs of its own, kept when they
    start again after a checkpoint). A daemon run as root mounts them in the host's
    namespaces; any other mounts them in a user namespace of its own (``space``, V17),
    where its sandboxes start (``enter_argv``) and which its file tools reach from
    outside; a fork's layers share their parent's namespace.

    ``overlays`` are the stacks (``layer_stack.Overlay``) by name; ``root_merged`` is
    what its sandbox takes as / and ``workspace_merged`` what it binds at the
    workspace (paths of the mount namespace they are in); ``workspace_view`` is where
    the file tools find the workspace from here.

    The tmpfs outlives the session while a fork still stacks a layer frozen on it
    (B3): ``remove`` lets the session's part go, the last frozen layer's end the rest."""

    def __init__(self, directory: Path, space: LayerNamespace | None = None) -> None:
        self.directory = directory
        self.space = space
        self.root_merged: Path | None = None
        self.workspace_merged: Path | None = None
        self.tmp: Path | None = None
        self.overlays: dict[str, Overlay] = {}
        self._frozen = 0  # frozen layers of this tmpfs still stacked somewhere
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def make(
        cls, directory: Path, layer_bytes: int, space: LayerNamespace | None = None
    ) -> SessionLayer:
        """A tmpfs of ``layer_bytes`` at ``directory`` (made here, private), in
        ``space`` when given (a fork's: its parent's namespace). Raises LayerError."""
        _check_option_path(directory)
        directory.mkdir(mode=0o700)
        layer = cls(directory, None if space is None else space.retain())
        try:
            if layer.space is None and os.geteuid() != 0:
                layer.space = LayerNamespace.start()
            layer._mount("toolpool-layer", directory, "tmpfs", f"size={layer_bytes},mode=0700")
        except OSError as exc:
            layer.remove()
            raise LayerError(str(exc)) from None
        except BaseException:
            layer.remove()
            raise
        return layer

    def seen(self, path: Path) -> Path:
        """Where ``path`` of the layers' mount namespace is reached from here."""
        return path if self.space is None else Path(self.space.outside + str(path))

    @property
    def workspace_view(self) -> Path | None:
        """The workspace's overlay as the file tools reach it (V15), once mounted."""
        merged = self.workspace_merged
        return None if merged is None else self.seen(merged)

    def enter_argv(self) -> tuple[str, ...]:
        """What a command is started under to see these layers (nothing as root)."""
        return () if self.space is None else self.space.enter_argv()

    def _mount(self, source: str, target: Path, kind: str, options: str) -> None:
        if self.space is not None:
            self.space.mount(source, target, kind, options)
        else:
            layer_holder.mount(source, str(target), kind, options)

    def mount_overlay(
        self, target: Path, lowers: Sequence[str], upper: str, work: str, options: Sequence[str]
    ) -> None:
        """An overlay where these layers are mounted (``layer_holder.mount_overlay``)."""
        if self.space is not None:
            self.space.overlay(target, lowers, upper, work, options)
        else:
            layer_holder.mount_overlay(str(target), lowers, upper, work, options)

    def unmount(self, target: Path, *, lazily: bool = False) -> None:
        """Unmount there; busy (EBUSY) unless ``lazily``."""
        if self.space is not None:
            self.space.unmount(target, lazily=lazily)
        else:
            layer_holder.unmount(str(target), lazily=lazily)

    def mount_root(
        self,
        lowers: Sequence[Path] = (Path("/"),),
        *,
        userxattr: bool = False,
        inherit: Inherit | None = None,
    ) -> Path:
        """The overlay of ``lowers`` (the topmost first, as overlay lists them) with
        its upper layer here (a fork's stacked on its parent's frozen layers,
        ``inherit``); where apt is, apt's sandbox user is root in it. Raises
        LayerError."""
        if self.root_merged is None:
            try:
                if self.space is not None and list(lowers) == [Path("/")]:
                    merged = self._host_root_in_namespace(inherit or {})
                else:
                    for lower in lowers:
                        _check_option_path(lower)
                    xattr = userxattr or self.space is not None
                    apt = functools.partial(self._apt_as_root, etc=lowers[0] / "etc", within="etc")
                    base = [str(p) for p in lowers]
                    merged = self._overlay("root", base, xattr, apt=apt, inherit=inherit)
            except OSError as exc:
                raise LayerError(str(exc)) from None
            self.root_merged = merged
        return self.root_merged

    def _host_root_in_namespace(self, inherit: Inherit) -> Path:
        """The host's root copy-on-write where / itself cannot be an overlay's lower
        layer (its mounts below are locked in a user namespace): an overlay for each
        of its directories, its symlinks as they are, its mount points — and a
        directory with mounts below it, which cannot be a lower layer either — empty.
        Only what this user may write on the host is writable there."""
        merged = self.directory / "root" / "merged"
        self.seen(merged).mkdir(mode=0o755, parents=True, exist_ok=True)
        for entry in os.scandir("/"):
            here = self.seen(merged / entry.name)
            if entry.is_symlink():
                here.symlink_to(os.readlink(entry.path))
            elif entry.is_dir() and not os.path.ismount(entry.path):
                _check_option_path(Path(entry.path))
                apt = functools.partial(self._apt_as_root, etc=Path("/etc"), within="")
                try:
                    self._overlay(
                        f"root/{entry.name}",
                        [entry.path],
                        True,
                        merged / entry.name,
                        apt if entry.name == "etc" else None,
                        inherit,
                    )
                except OSError:
                    if entry.name in ("usr", "etc"):
                        raise  # no root without them: others stay empty
            elif entry.is_dir():
                here.mkdir(mode=0o755)
        return merged

    def mount_workspace(self, workspace: Path, inherit: Inherit | None = None) -> Path:
        """The overlay of the host directory ``workspace`` with its upper layer here
        (a fork's on its parent's frozen layers, ``inherit``): the session's view of
        its workspace, the host's never written. Raises LayerError."""
        if self.workspace_merged is None:
            try:
                _check_option_path(workspace)
                userxattr = self.space is not None
                self.workspace_merged = self._overlay(
                    "w", [str(workspace)], userxattr, inherit=inherit
                )
            except OSError as exc:
                raise LayerError(str(exc)) from None
        return self.workspace_merged

    def mount_tmp(self, tmp_bytes: int) -> Path:
        """The sandboxes' private /tmp, a tmpfs of ``tmp_bytes`` here: made once, so
        that it outlives a sandbox started again after a checkpoint (V1). Raises
        LayerError."""
        if self.tmp is None:
            place = self.directory / "tmp"
            try:
                self.seen(place).mkdir(mode=0o1777, exist_ok=True)
                self._mount("toolpool-tmp", place, "tmpfs", f"size={tmp_bytes},mode=1777")
            except OSError as exc:
                raise LayerError(str(exc)) from None
            self.tmp = place
        return self.tmp

    def _overlay(
        self,
        name: str,
        base: Sequence[str],
        userxattr: bool,
        at: Path | None = None,
        apt: Callable[[Path], bool] | None = None,
        inherit: Inherit | None = None,
    ) -> Path:
        """The overlay ``name`` of ``base`` at ``at`` (``<name>/merged`` by default),
        its upper layer ``<name>/upper``; ``apt`` may add a layer of the session's own
        over the base; a fork's stacks its parent's frozen layers (``inherit``)."""
        place = self.directory / name
        merged = at or place / "merged"
        own = [str(place / "apt")] if apt is not None and apt(place / "apt") else []
        parent = (inherit or {}).get(name)
        if parent is None:
            options = ["userxattr"] if userxattr else ["redirect_dir=on"]
            overlay = Overlay(self, place, merged, base, options, own_base=own)
        else:
            overlay = parent[0].branch(self, place, merged, parent[1], own)
        self.overlays[name] = overlay
        overlay.mount()
        return merged

    def _apt_as_root(self, layer: Path, *, etc: Path, within: str) -> bool:
        """Where the root has apt (``etc``: its /etc in the topmost lower layer), a
        layer of the session's own goes over it with apt's sandbox user set to root
        (``within`` it, /etc is), the lower layers' /etc as it was (apt drops to
        "_apt" for its downloads, which needs capabilities a command lacks, X5).
        Whether it made one."""
        if not (etc / "apt" / "apt.conf.d").is_dir():
            return False
        conf = self.seen(layer / within / "apt" / "apt.conf.d")
        conf.mkdir(mode=0o755, parents=True, exist_ok=True)
        (conf / "99toolpool-sandbox").write_text(APT_SANDBOX)
        return True

    def root_args(self) -> tuple[str, ...]:
        """bubblewrap's arguments that make the merged root the sandbox's root."""
        assert self.root_merged is not None
        return ("--bind", str(self.root_merged), "/")

    def used_bytes(self) -> int:
        """What the session's writes take on its layer's tmpfs."""
        try:
            found = os.statvfs(self.seen(self.directory))
        except OSError:
            return 0
        return (found.f_blocks - found.f_bfree) * found.f_frsize

    # -- checkpoints (B1–B4) ----------------------------------------------------------

    def changed(self) -> bool:
        """Whether any upper layer holds something its last freeze did not."""
        return any(overlay.changed() for overlay in self.overlays.values())

    def freeze(self) -> list[str]:
        """Every changed upper layer frozen (nothing runs in the session: its
        sandboxes are ended); the names of the overlays that froze. Raises OSError."""
        return [name for name, overlay in self.overlays.items() if overlay.freeze(self)]

    def depths(self) -> dict[str, int]:
        """How many frozen layers each overlay stacks now: a checkpoint's mark."""
        return {name: overlay.depth for name, overlay in self.overlays.items()}

    def rewind(self, depths: Mapping[str, int]) -> None:
        """Each overlay back to its depth in ``depths`` (0 for one made since), its
        upper layer emptied. Raises OSError."""
        for name, overlay in self.overlays.items():
            overlay.rewind(depths.get(name, 0))

    def inherit(self, depths: Mapping[str, int]) -> dict[str, tuple[Overlay, int]]:
        """What a fork at the checkpoint of ``depths`` stacks: each overlay of this
        session that existed then, with its depth then."""
        return {n: (o, depths[n]) for n, o in self.overlays.items() if n in depths}

    def layer_made(self) -> None:
        with self._lock:
            self._frozen += 1

    def layer_gone(self) -> None:
        """One of the frozen layers on this tmpfs was removed (its last user let it
        go); after the session, the last one takes the tmpfs with it."""
        with self._lock:
            self._frozen -= 1
            last = self._closed and self._frozen <= 0
        if last:
            self._remove_store()

    def remove(self) -> None:
        """Unmount the overlays (lazily: a process still inside keeps its view until
        it ends), let their frozen layers go, and unless a fork still stacks a layer
        frozen here, unmount the tmpfs and remove the directory; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        overlays = list(self.overlays.values())
        self.overlays.clear()
        for overlay in reversed(overlays):  # the root's subdirectories after the root's
            with contextlib.suppress(OSError):
                overlay.close()
        with self._lock:
            last = self._frozen <= 0
        if last:
            self._remove_store()

    def _remove_store(self) -> None:
        space, self.space = self.space, None
        if space is not None:
            for mount_point in (self.directory / "tmp", self.directory):
                with contextlib.suppress(OSError):
                    space.unmount(mount_point, lazily=True)
            shutil.rmtree(self.directory, ignore_errors=True)
            space.close()  # the last user's close ends the holder, its mounts with it
            return
        remove_layers(self.directory)

    def __repr__(self) -> str:
        state = "removed" if self._closed else f"{len(self.overlays)} overlays"
        return f"<SessionLayer {self.directory} {state}, {self._frozen} frozen layers>"


def _check_option_path(path: Path) -> None:
    if any(c in str(path) for c in ",:\\"):  # overlay's option syntax
        raise LayerError(f"{path} holds a ',', ':' or '\\', which overlay options cannot name")


APT_SANDBOX = 'APT::Sandbox::User "root";\n'


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
    with tempfile.TemporaryDirectory(prefix="toolpool-layers-") as place:
        lower = Path(place) / "lower"
        lower.mkdir()
        try:
            layer = SessionLayer.make(Path(place) / "l", 1024 * 1024)
            try:
                view = layer.seen(layer.mount_workspace(lower))
                root = layer.seen(layer.mount_root())
                (view / "probe").write_text("x")
                if (lower / "probe").exists() or not (root / "etc").is_dir():
                    return False, "the overlays do not keep writes to their upper layer"
            finally:
                layer.remove()
        except (LayerError, OSError) as exc:
            return False, str(exc)
    if os.geteuid() == 0:
        return True, "a tmpfs and overlays of / and of a directory mount here and are removed"
    return True, (
        "a tmpfs and overlays of / and of a directory mount in a user namespace of this "
        'user\'s; with root = "overlay" only what this user may write on the host is '
        "writable (V17)"
    )
