"""Two adjacent frozen layers of an overlay squashed into one (SPEC B5): what keeps a
session's checkpoints within ``max_checkpoints``, and so its overlays within what the
kernel can stack.

An upper layer is not a tree to copy: its whiteouts hide what lies below, an opaque
directory hides all of it, a directory renamed by ``redirect_dir`` takes its content
from elsewhere. So the kernel does the merging: a scratch overlay of everything below
the older layer, with a new empty upper layer, and the two layers replayed onto it in
order — a whiteout is a removal, an opaque directory a removal and a ``mkdir``, a
redirected directory a rename (from where its content lay below), a file a new file
with its content and metadata. What overlayfs writes into the new upper layer is the
one layer that shows what the two showed. It costs what the two layers hold, never the
tree below them; neither layer is written (others may stack them), and the caller
swaps the result in while nothing runs.

Lost on the way: hard links within a layer (each name its own copy), and extended
attributes other than overlayfs's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from toolpool.sandbox.layer_removal import remove_layer
from toolpool.sandbox.layer_stack import FrozenLayer, LayerStore, Overlay

_PARKING = ".toolpool-squash"  # where redirected directories wait for their new place


def squash(overlay: Overlay, first: int, store: LayerStore, name: str) -> FrozenLayer:
    """The frozen layers ``first`` and ``first + 1`` of ``overlay`` as one new frozen
    layer ``<place>/<name>`` on ``store`` (the session's tmpfs). The overlay is not
    changed (``Overlay.replace`` swaps it in). Raises OSError (ENOSPC when the tmpfs
    cannot hold the copy: the layers stay as they are)."""
    mounter, seen = overlay.mounter, overlay.mounter.seen
    older, newer = overlay.frozen[first], overlay.frozen[first + 1]
    out, work, view = (overlay.place / f"{name}{part}" for part in ("", "-work", "-view"))
    for part in (out, work, view):
        seen(part).mkdir(mode=0o755)
    namespace = "user" if "userxattr" in overlay.options else "trusted"
    try:
        mounter.mount_overlay(view, overlay.lowers(first), str(out), str(work), overlay.options)
        try:
            for layer in (older, newer):
                _replay(seen(layer.path), seen(view), namespace)
        finally:
            mounter.unmount(view, lazily=True)
    except BaseException:
        remove_layer(seen(out))  # a copy of the view may hold what the replay wrote
        raise
    finally:
        for part in (work, view):
            shutil.rmtree(seen(part), ignore_errors=True)
    return FrozenLayer(out, store)


def _xattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def _redirects(layer: Path, namespace: str) -> list[tuple[str, str]]:
    """The directories of ``layer`` that overlayfs moved (``redirect_dir``), parents
    first: (their path, the path below they take their content from)."""
    found: list[tuple[str, str]] = []
    lower_of: dict[str, str] = {"": ""}  # a directory's path below, where it moved

    def walk(relative: str) -> None:
        with os.scandir(layer / relative if relative else layer) as entries:
            names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        for name in names:
            path = f"{relative}/{name}" if relative else name
            redirect = _xattr(layer / path, f"{namespace}.overlay.redirect")
            if redirect is None:
                lower_of[path] = f"{lower_of[relative]}/{name}".lstrip("/")
            else:
                target = os.fsdecode(redirect)
                below = (
                    target.lstrip("/")
                    if target.startswith("/")
                    else (f"{lower_of[relative]}/{target}".lstrip("/"))
                )
                lower_of[path] = below
                found.append((path, below))
            walk(path)

    walk("")
    return found


def _replay(layer: Path, view: Path, namespace: str) -> None:
    """``layer``'s changes carried out on the overlay ``view``."""
    moves = _redirects(layer, namespace)
    parked: dict[str, Path] = {}  # a redirected directory's path → where it waits
    if moves:
        parking = view / _PARKING
        parking.mkdir(mode=0o700)
        where: dict[str, Path] = {}  # a path below → where it is now
        for index, (path, below) in enumerate(moves):
            source = _now_at(view, below, where)
            if os.path.lexists(source):
                os.rename(source, parking / str(index))
                where[below] = parking / str(index)
                parked[path] = parking / str(index)
    _apply(layer, view, "", namespace, parked)
    if moves:
        shutil.rmtree(view / _PARKING, ignore_errors=True)


def _now_at(view: Path, below: str, where: dict[str, Path]) -> Path:
    """Where the path ``below`` is now, its nearest moved ancestor's move applied."""
    parts = below.split("/")
    for cut in range(len(parts), 0, -1):
        moved = where.get("/".join(parts[:cut]))
        if moved is not None:
            return moved.joinpath(*parts[cut:])
    return view / below


def _apply(layer: Path, view: Path, relative: str, namespace: str, parked: dict[str, Path]) -> None:
    here = layer / relative if relative else layer
    with os.scandir(here) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        path = f"{relative}/{name}" if relative else name
        source, target = layer / path, view / path
        found = os.lstat(source)
        mode = found.st_mode
        if stat.S_ISCHR(mode) and found.st_rdev == 0:  # a whiteout
            _remove(target)
        elif stat.S_ISDIR(mode):
            if path in parked:
                _remove(target)
                os.rename(parked[path], target)
            elif _xattr(source, f"{namespace}.overlay.opaque") == b"y" or not (
                os.path.isdir(target) and not os.path.islink(target)
            ):
                _remove(target)
                os.mkdir(target, 0o700)
            _apply(layer, view, path, namespace, parked)
            _metadata(target, found)
        elif stat.S_ISREG(mode):
            _remove(target)
            _copy_file(source, target)
            _metadata(target, found)
        elif stat.S_ISLNK(mode):
            _remove(target)
            os.symlink(os.readlink(source), target)
            _metadata(target, found)
        elif stat.S_ISFIFO(mode):
            _remove(target)
            os.mkfifo(target, 0o600)
            _metadata(target, found)
        # sockets and devices cannot be made by a session's commands: nothing to keep


def _remove(target: Path) -> None:
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)


def _copy_file(source: Path, target: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as read, open(os.open(target, flags, 0o600), "wb") as write:
        shutil.copyfileobj(read, write, 1024 * 1024)


def _metadata(target: Path, found: os.stat_result) -> None:
    """Mode, owner (as root) and times of ``found`` on ``target``."""
    if os.geteuid() == 0:
        os.lchown(target, found.st_uid, found.st_gid)
    if not stat.S_ISLNK(found.st_mode):
        os.chmod(target, stat.S_IMODE(found.st_mode))
    os.utime(target, ns=(found.st_atime_ns, found.st_mtime_ns), follow_symlinks=False)
