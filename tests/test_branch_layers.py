"""A session's overlays as stacks of layers (SPEC B1, B3, B5, B11, B13), on real
mounts: a freeze renames and never copies, a fork's overlay stacks its parent's frozen
layers and outlives the parent's session, a merge of two layers leaves the tree as it
was — whatever the operations were (whiteouts, opaque and renamed directories) — and
no copy of an overlay that another mount namespace made outlives its unmount."""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from toolpool.sandbox import layer_removal
from toolpool.sandbox.layer_merge import squash
from toolpool.sandbox.layers import SessionLayer, mounts_under

from .shell_support import wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounting layers in the host's namespaces needs root"
)


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root``: its type, mode and content (a link's target)."""
    found: dict[str, tuple[object, ...]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            entry = os.lstat(path)
            key = str(path.relative_to(root))
            if stat.S_ISLNK(entry.st_mode):
                found[key] = ("link", os.readlink(path))
            elif stat.S_ISDIR(entry.st_mode):
                found[key] = ("dir", stat.S_IMODE(entry.st_mode))
            elif stat.S_ISCHR(entry.st_mode):  # a layer's whiteout
                found[key] = ("device", entry.st_rdev)
            else:
                found[key] = ("file", stat.S_IMODE(entry.st_mode), path.read_bytes())
    return found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    place = tmp_path / "s"
    place.mkdir()
    yield place
    assert mounts_under(place) == [], "a layer stayed mounted"


def base_tree(workspace: Path) -> None:
    for directory in ("a", "a/b", "c", "e", "e/f", "g"):
        (workspace / directory).mkdir()
    for name in ("a/1", "a/b/2", "c/3", "e/f/4", "g/5", "top"):
        (workspace / name).write_text(f"{name}\n")


@pytest.mark.spec("B1")
def test_B1_a_freeze_renames_the_upper_layer_and_copies_nothing(
    store: Path, workspace: Path
) -> None:
    # Given a session's workspace overlay with a file written in it
    base_tree(workspace)
    layer = SessionLayer.make(store / "1.l", 64 * 2**20)
    try:
        view = layer.seen(layer.mount_workspace(workspace))
        (view / "made.txt").write_text("made\n")
        overlay = layer.overlays["w"]
        upper = os.stat(layer.seen(overlay.upper))
        made = os.stat(layer.seen(overlay.upper) / "made.txt")
        # When the session checkpoints
        assert layer.freeze() == ["w"]
        # Then the upper layer became the frozen one, the same inodes (a rename)
        frozen = layer.seen(overlay.frozen[0].path)
        assert os.stat(frozen).st_ino == upper.st_ino
        assert os.stat(frozen / "made.txt").st_ino == made.st_ino
        # and a fresh, empty upper layer is mounted over it: the view is unchanged
        assert os.listdir(layer.seen(overlay.upper)) == []
        assert (view / "made.txt").read_text() == "made\n"
        assert layer.depths() == {"w": 1}
        # A checkpoint of nothing new freezes nothing and unmounts nothing
        assert layer.freeze() == [] and layer.depths() == {"w": 1}
    finally:
        layer.remove()
    assert not (store / "1.l").exists()


@pytest.mark.spec("B11")
def test_B11_a_forks_layers_outlive_its_parent_and_go_with_the_last_user(
    store: Path, workspace: Path
) -> None:
    # Given a parent whose workspace froze a layer, and a fork stacked on it
    base_tree(workspace)
    parent = SessionLayer.make(store / "1.l", 64 * 2**20)
    fork = None
    try:
        view = parent.seen(parent.mount_workspace(workspace))
        (view / "parent.txt").write_text("parent\n")
        parent.freeze()
        point = parent.depths()
        fork = SessionLayer.make(store / "2.l", 64 * 2**20)
        forked = fork.seen(fork.mount_workspace(workspace, parent.inherit(point)))
        frozen = parent.overlays["w"].frozen[0]
        assert frozen.users == 2
        # When the parent's session ends first
        parent.remove()
        # Then its tmpfs stays, holding the layer the fork stacks, and the fork reads it
        assert (store / "1.l").is_dir() and str(store / "1.l") in mounts_under(store)
        assert (forked / "parent.txt").read_text() == "parent\n"
        assert frozen.users == 1
        # When the fork ends too, the last user of that layer: everything goes
        fork.remove()
        fork = None
        assert not (store / "1.l").exists() and not (store / "2.l").exists()
    finally:
        if fork is not None:
            fork.remove()
        parent.remove()


def _operation(rng: random.Random, view: Path, number: int) -> None:
    """One random change of the tree through the overlay, as a command would make it."""
    entries = sorted(str(p.relative_to(view)) for p in view.rglob("*"))
    files = [e for e in entries if (view / e).is_file() and not (view / e).is_symlink()]
    directories = [e for e in entries if (view / e).is_dir() and not (view / e).is_symlink()]
    choice = rng.choice(["write", "append", "delete", "rmtree", "rename_dir", "chmod",
                         "symlink", "mkdir", "opaque", "rename_file"])  # fmt: skip
    where = rng.choice(["", *directories])
    target = view / where / f"n{number}"
    if choice == "write" or (choice in ("append", "delete", "chmod", "rename_file") and not files):
        target.write_bytes(rng.randbytes(rng.randint(0, 64)))
    elif choice == "append":
        with open(view / rng.choice(files), "ab") as file:
            file.write(b"+")
    elif choice == "delete":
        os.unlink(view / rng.choice(files))
    elif choice == "chmod":
        os.chmod(view / rng.choice(files), rng.choice([0o600, 0o755, 0o640]))
    elif choice == "rename_file":
        os.rename(view / rng.choice(files), target)
    elif choice == "symlink":
        target.symlink_to(rng.choice(["/etc/passwd", "../top", f"n{number}-dangling"]))
    elif choice in ("rmtree", "rename_dir", "opaque") and not directories:
        target.mkdir()
    elif choice == "rmtree":
        shutil.rmtree(view / rng.choice(directories))
    elif choice == "rename_dir":
        moved = rng.choice(directories)
        if not (where == moved or where.startswith(moved + "/")):
            os.rename(view / moved, target)  # redirect_dir: a redirect in the layer
    elif choice == "opaque":
        victim = rng.choice(directories)
        shutil.rmtree(view / victim)
        (view / victim).mkdir()
        (view / victim / f"o{number}").write_text("in an opaque directory\n")
    else:
        target.mkdir()


@pytest.mark.spec("B5")
@pytest.mark.parametrize("seed", range(12))
def test_B5_a_merge_of_two_layers_leaves_the_tree_as_it_was(
    store: Path, workspace: Path, seed: int
) -> None:
    # Given a session whose two turns made random changes, each frozen in a layer
    rng = random.Random(seed)
    base_tree(workspace)
    layer = SessionLayer.make(store / "1.l", 64 * 2**20)
    try:
        view = layer.seen(layer.mount_workspace(workspace))
        number = 0
        for _turn in range(3):
            for _ in range(rng.randint(3, 12)):
                number += 1
                _operation(rng, view, number)
            layer.freeze()
        overlay = layer.overlays["w"]
        assert len(overlay.frozen) == 3
        before = snapshot(view)
        frozen = [layer.seen(f.path) for f in overlay.frozen]
        kept = [snapshot(f) for f in frozen]
        # When the first two layers are merged into one and swapped in
        merged = squash(overlay, 0, layer, "m0")
        overlay.replace(0, 1, merged)
        # Then the tree is the same, now on two layers, and the merged layers were
        # never written (a fork may stack them)
        assert snapshot(view) == before
        assert len(overlay.frozen) == 2
        assert [snapshot(f) for f in frozen[2:]] == kept[2:]
        # and the session writes on as before
        (view / "after.txt").write_text("after\n")
        assert (view / "after.txt").read_text() == "after\n"
    finally:
        layer.remove()


MIB = 2**20


def copies(pid: int, point: Path) -> int:
    """How many mounts the mount namespace of ``pid`` has at ``point``."""
    with open(f"/proc/{pid}/mountinfo") as table:
        return sum(1 for line in table if line.split()[4] == str(point))


@contextmanager
def unshared(point: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process on the host that made a mount namespace of its own, with private
    mounts (``unshare -m``'s way), while ``point`` is mounted."""
    process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "300"])
    ours = os.readlink("/proc/self/ns/mnt")

    def made() -> bool:  # its own namespace (not ours, before unshare ran), and the copy
        try:
            theirs = os.readlink(f"/proc/{process.pid}/ns/mnt")
        except OSError:
            return False
        return theirs != ours and copies(process.pid, point) == 1

    try:
        wait_until(made, "the namespace made")
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.spec("B13")
@pytest.mark.parametrize("operation", ["rewind", "merge", "freeze", "remove"])
def test_B13_the_room_of_layers_let_go_is_free_whatever_namespace_holds_a_copy(
    store: Path, workspace: Path, operation: str
) -> None:
    layer = SessionLayer.make(store / "1.l", 16 * MIB)
    try:
        view = layer.seen(layer.mount_workspace(workspace))
        overlay = layer.overlays["w"]
        # Given 2 MiB frozen (and, for a merge, a second layer frozen over it)
        (view / "a").write_bytes(bytes(2 * MIB))
        layer.freeze()
        if operation == "merge":
            (view / "c").write_text("c\n")
            layer.freeze()
        # and a namespace made while the overlay is mounted, which holds a copy of it,
        # through which the frozen file is read and (but for a merge) 2 MiB written,
        # with a read-only mode (a file an unprivileged daemon could not write as is)
        with unshared(overlay.merged) as holder:
            pid = holder.pid
            assert (view / "a").read_bytes() == bytes(2 * MIB)
            if operation != "merge":
                (view / "b").write_bytes(bytes(2 * MIB))
                (view / "b").chmod(0o444)
            # When the layers change: a rewind, a merge, a freeze, the session's end
            if operation == "rewind":
                layer.rewind({"w": 0})
                room = 0  # everything dropped
            elif operation == "merge":
                overlay.replace(0, 1, squash(overlay, 0, layer, "m0"))
                room = 2 * MIB  # the merged layer's copy of "a"; the two it replaced gone
            elif operation == "freeze":
                layer.freeze()
                room = 4 * MIB  # nothing dropped
            else:
                layer.remove()
            if operation != "remove":
                # Then the tmpfs holds what the layers keep, no more, while the copy
                # of the old overlay lives on, untouched, in that namespace (taking
                # it away would fail a sandbox being set up there at that moment)
                assert room <= layer.used_bytes() < room + 256 * 1024
                assert holder.poll() is None, "the namespace's process ended"
                with open(f"/proc/{pid}/mountinfo") as table:
                    seen = table.read()
                assert copies(pid, overlay.merged) == 1, seen
                assert (view / "a").exists() == (operation != "rewind")
            else:
                # Then the tmpfs is gone from that namespace too (its directory removed)
                assert copies(pid, layer.directory) == 0
    finally:
        layer.remove()


@pytest.mark.spec("B13")
def test_B13_emptying_a_dropped_layer_follows_no_link_and_opens_no_fifo(
    store: Path, workspace: Path, tmp_path: Path
) -> None:
    # Given host files that links in a layer name, and a layer that holds those links,
    # a fifo, a file nobody may write and 2 MiB, frozen
    victim = tmp_path / "victim.txt"
    victim.write_text("the host's\n")
    (tmp_path / "victim-dir").mkdir()
    (tmp_path / "victim-dir" / "inside.txt").write_text("the host's too\n")
    layer = SessionLayer.make(store / "1.l", 16 * MIB)
    try:
        view = layer.seen(layer.mount_workspace(workspace))
        (view / "link").symlink_to(victim)
        (view / "dir-link").symlink_to(tmp_path / "victim-dir")
        (view / "nested").mkdir()
        (view / "nested" / "link").symlink_to(victim)
        os.mkfifo(view / "fifo")
        (view / "locked").write_bytes(bytes(2 * MIB))
        (view / "locked").chmod(0)
        layer.freeze()
        # When the layer is dropped (a rewind to the start)
        layer.rewind({"w": 0})
        # Then the layer is gone, its room free, and what its links named untouched
        assert os.listdir(view) == [] and layer.used_bytes() < 256 * 1024
        assert victim.read_text() == "the host's\n"
        assert (tmp_path / "victim-dir" / "inside.txt").read_text() == "the host's too\n"
    finally:
        layer.remove()


@pytest.mark.spec("B13", "B2")
def test_B13_a_dropped_layer_nested_past_any_recursion_limit_goes_whole(
    store: Path, workspace: Path
) -> None:
    # Given a layer that nests 1500 directories (deeper than PATH_MAX can name, and
    # than Python recurses), a 64 KiB file every 100 levels, frozen
    layer = SessionLayer.make(store / "1.l", 16 * MIB)
    try:
        view = layer.seen(layer.mount_workspace(workspace))
        here = os.open(view, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for level in range(1500):
                os.mkdir("d", dir_fd=here)
                below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
                os.close(here)
                here = below
                if level % 100 == 0:
                    made = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=here)
                    with open(made, "wb") as file:
                        file.write(bytes(64 * 1024))
        finally:
            os.close(here)
        layer.freeze()
        assert layer.used_bytes() >= 15 * 64 * 1024
        # When a rewind drops it, then all of it is gone, its room free, and the
        # overlay's directory holds nothing but what a fresh one does
        layer.rewind({"w": 0})
        assert os.listdir(view) == [] and layer.used_bytes() < 256 * 1024
        place = layer.seen(layer.overlays["w"].place)
        assert sorted(os.listdir(place)) == ["merged", "upper", "work"]
    finally:
        layer.remove()


NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.spec("B13", "V17")
@pytest.mark.skipif(
    shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON),
    reason="needs setpriv to become a uid, and a python it may run",
)
def test_B13_an_unprivileged_daemons_removal_gets_past_the_modes_a_layer_set() -> None:
    # Given a layer an unprivileged daemon's user owns, with a read-only file, a
    # directory of 0555 and one of 000, each holding a file, and a link to a file of
    # the host that the user may write (all where that user can reach)
    place = Path(tempfile.mkdtemp(prefix="toolpool-b13-", dir="/tmp"))
    try:
        layer = place / "f0"
        (layer / "ro").mkdir(parents=True)
        (layer / "sealed" / "in").mkdir(parents=True)
        for name in ("locked", "ro/f", "sealed/in/f"):
            (layer / name).write_bytes(bytes(64 * 1024))
        victim = place / "victim.txt"
        victim.write_text("kept\n")
        (layer / "link").symlink_to(victim)
        # and each file's inode held from outside too, as an old overlay's copy would
        held = [place / f"held{n}" for n in range(3)]
        for name, holder in zip(("locked", "ro/f", "sealed/in/f"), held, strict=True):
            os.link(layer / name, holder)
        # The module uses the standard library only: a copy of it, run by the
        # system's python, is the daemon's removal as that user runs it
        code = Path(layer_removal.__file__).read_text()
        (place / "removal.py").write_text(code + "\nimport sys\nremove_layer(Path(sys.argv[1]))\n")
        for path in [place, *place.rglob("*")]:
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        place.chmod(0o755)
        (layer / "locked").chmod(0o444)
        (layer / "ro").chmod(0o555)
        (layer / "sealed").chmod(0)
        # When that user removes it
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        argv += [SYSTEM_PYTHON, "-I", "-S", str(place / "removal.py"), str(layer)]
        subprocess.run(argv, check=True, timeout=60, cwd="/", capture_output=True)
        # Then all of it is gone, its files emptied (what held them holds no room),
        # and the file the link named is as it was
        assert not layer.exists()
        assert [holder.stat().st_size for holder in held] == [0, 0, 0]
        assert victim.read_text() == "kept\n"
    finally:
        shutil.rmtree(place, ignore_errors=True)
