"""A session's changes out (SPEC B8–B10) on real trees and real ``git apply``: the
patch of any two trees turns a copy of the first into the second; names built to
break a terminal or a parser are quoted; export copies without following anything;
a commit checks the host first, writes atomically and undoes itself on a failure or
a race. The trees here are plain directories (the daemon's are a session's layers:
tests/test_branching.py)."""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from toolpool.changes import (
    BaseMarks,
    Change,
    ChangeKind,
    CommitConflict,
    EntryType,
    PatchTooLarge,
    Tree,
    commit,
    compare,
    export,
    git_patch,
)
from toolpool.changes.patch import quoted

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is what the patch is for")
NAMES = ["plain.txt", "sp ace", "é-utf8", "\x1b[31mred", 'quo"te', "back\\slash", "tab\tname",
         "new\nline", "ends-", "-starts", "x.bin"]  # fmt: skip


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    found: dict[str, tuple[object, ...]] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files + [d for d in dirs if os.path.islink(Path(directory, d))]:
            path = Path(directory, name)
            entry = os.lstat(path)
            key = str(path.relative_to(root))
            if stat.S_ISLNK(entry.st_mode):
                found[key] = ("link", os.readlink(path))
            else:
                found[key] = ("file", bool(entry.st_mode & 0o100), path.read_bytes())
    return found


def all_paths(*roots: Path) -> list[str]:
    found = set()
    for root in roots:
        with Tree(root) as tree:
            found.update(path for path, _ in tree.below())
    return sorted(found, key=lambda p: p.split("/"))


def changes_between(old: Path, new: Path) -> list[Change]:
    with Tree(old) as a, Tree(new) as b:
        return compare(a, b, all_paths(old, new))


def patch_between(old: Path, new: Path) -> str:
    with Tree(old) as a, Tree(new) as b:
        return git_patch(a, b, compare(a, b, all_paths(old, new)), 10**9)


def content(rng: random.Random) -> bytes:
    kind = rng.choice(["text", "text", "binary", "empty", "no-newline", "crlf", "latin1"])
    lines = [f"line {rng.randint(0, 9)}\n" for _ in range(rng.randint(1, 30))]
    match kind:
        case "text":
            return "".join(lines).encode()
        case "binary":
            return rng.randbytes(rng.randint(1, 3000)) + b"\0"
        case "empty":
            return b""
        case "no-newline":
            return "".join(lines).rstrip("\n").encode()
        case "crlf":
            return "".join(lines).replace("\n", "\r\n").encode()
    return "".join(lines).encode("latin-1") + b"\xe9\xff\n"


def random_tree(rng: random.Random, root: Path, depth: int = 0) -> None:
    root.mkdir(exist_ok=True)
    for name in rng.sample(NAMES, rng.randint(1, 5)):
        path = root / name
        roll = rng.random()
        if roll < 0.2 and depth < 2:
            random_tree(rng, path, depth + 1)
        elif roll < 0.3:
            path.symlink_to(rng.choice(["/etc/passwd", "plain.txt", "../nowhere"]))
        else:
            path.write_bytes(content(rng))
            path.chmod(rng.choice([0o644, 0o755, 0o600]))


def mutate(rng: random.Random, root: Path) -> None:
    """Random changes: files rewritten, deleted, chmod'ed, a directory replaced by a
    file, a file by a directory or a symlink, new files."""
    for path in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        if not os.path.lexists(path):
            continue
        roll = rng.random()
        if path.is_symlink():
            if roll < 0.3:
                path.unlink()
        elif path.is_dir():
            if roll < 0.15:
                shutil.rmtree(path)
                if rng.random() < 0.5:
                    path.write_bytes(content(rng))
        elif roll < 0.2:
            path.unlink()
        elif roll < 0.4:
            path.write_bytes(content(rng))
        elif roll < 0.5:
            path.chmod(0o755 if not path.stat().st_mode & 0o100 else 0o644)
        elif roll < 0.55:
            path.unlink()
            path.mkdir()
            (path / "inside").write_bytes(content(rng))
        elif roll < 0.6:
            path.unlink()
            path.symlink_to("plain.txt")
    random_tree(rng, root / rng.choice(["added", "plain.txt.d"]), 1)


@needs_git
@pytest.mark.spec("B8")
@pytest.mark.parametrize("seed", range(25))
def test_B8_the_patch_applied_with_git_to_a_copy_of_the_base_gives_the_new_tree(
    tmp_path: Path, seed: int
) -> None:
    # Given two trees: a base, and what a session made of it
    rng = random.Random(seed)
    base, session = tmp_path / "base", tmp_path / "session"
    random_tree(rng, base)
    shutil.copytree(base, session, symlinks=True)
    mutate(rng, session)
    # When the patch between them is applied by git to a copy of the base
    patch = patch_between(base, session)
    copy = tmp_path / "copy"
    shutil.copytree(base, copy, symlinks=True)
    (tmp_path / "p.diff").write_text(patch)
    applied = subprocess.run(
        [GIT or "git", "apply", str(tmp_path / "p.diff")],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    # Then git takes it, and the copy is the session's tree, byte for byte and mode
    assert applied.returncode == 0, applied.stderr + patch[:3000]
    assert snapshot(copy) == snapshot(session)


@pytest.mark.spec("B8")
def test_B8_names_built_to_break_a_terminal_are_quoted_and_paths_stay_inside(
    tmp_path: Path,
) -> None:
    # Given a session that made files whose names hold escape sequences, quotes and
    # newlines, and a symlink that points out of the workspace
    base, session = tmp_path / "base", tmp_path / "session"
    base.mkdir()
    session.mkdir()
    for name in NAMES:
        (session / name).write_text("x\n")
    (session / "escape").symlink_to("/etc/passwd")
    patch = patch_between(base, session)
    # Then no header line holds a control character: each such name is C-quoted
    headers = [line for line in patch.splitlines() if line.startswith(("diff --git", "---", "+++"))]
    assert headers and all(ch.isprintable() for line in headers for ch in line)
    assert '"b/\\033[31mred"' in patch and '"b/new\\nline"' in patch
    assert quoted("b/", "\x1b]0;title\x07") == '"b/\\033]0;title\\a"'
    # And every path is the workspace's: relative, no way up
    for line in headers:
        assert "../" not in line and " /" not in line.replace(" /dev/null", ""), line
        starts = ("diff --git a/", 'diff --git "a/', "--- a/", '--- "a/', "--- /dev/null",
                  "+++ b/", '+++ "b/', "+++ /dev/null")  # fmt: skip
        assert line.startswith(starts), line
    # The symlink is a symlink (mode 120000, its target as content), never the file
    assert "new file mode 120000" in patch and "root:" not in patch


@pytest.mark.spec("B8")
def test_B8_a_patch_past_its_bound_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    base, session = tmp_path / "base", tmp_path / "session"
    base.mkdir()
    session.mkdir()
    (session / "big.txt").write_text("x\n" * 10_000)
    with Tree(base) as a, Tree(session) as b, pytest.raises(PatchTooLarge, match="export"):
        git_patch(a, b, compare(a, b, ["big.txt"]), 1000)


@pytest.mark.spec("B8")
def test_B8_changes_name_each_path_with_its_kind_type_and_modes(tmp_path: Path) -> None:
    base, session = tmp_path / "base", tmp_path / "session"
    base.mkdir()
    for name in ("kept", "edited", "gone", "chmod"):
        (base / name).write_text(f"{name}\n")
    (base / "dir").mkdir()
    (base / "dir" / "inside").write_text("inside\n")
    shutil.copytree(base, session)
    (session / "edited").write_text("changed\n")
    (session / "gone").unlink()
    (session / "chmod").chmod(0o700)
    shutil.rmtree(session / "dir")
    (session / "new").symlink_to("kept")
    (session / "fifo").parent.mkdir(exist_ok=True)
    os.mkfifo(session / "fifo")  # a special file: not compared, not carried
    found = {(c.path, c.kind, c.type) for c in changes_between(base, session)}
    assert found == {
        ("edited", ChangeKind.MODIFIED, EntryType.FILE),
        ("gone", ChangeKind.DELETED, EntryType.FILE),
        ("chmod", ChangeKind.MODE, EntryType.FILE),
        ("dir", ChangeKind.DELETED, EntryType.DIRECTORY),
        ("dir/inside", ChangeKind.DELETED, EntryType.FILE),
        ("new", ChangeKind.ADDED, EntryType.SYMLINK),
    }


# -- export (B9) ------------------------------------------------------------------------


@pytest.mark.spec("B9")
def test_B9_an_export_copies_the_tree_and_follows_nothing(tmp_path: Path) -> None:
    rng = random.Random(7)
    session = tmp_path / "session"
    random_tree(rng, session)
    (session / "out").symlink_to("/etc")  # a link out: exported as a link
    with Tree(session) as tree:
        written = export(tree, tmp_path / "copy")
        export(tree, tmp_path / "copy.tar.gz")
    assert written == len(all_paths(session))
    assert snapshot(tmp_path / "copy") == snapshot(session)
    assert os.readlink(tmp_path / "copy" / "out") == "/etc"
    with tarfile.open(tmp_path / "copy.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="tar")
    assert snapshot(tmp_path / "unpacked") == snapshot(session)
    # Nothing is overwritten
    with Tree(session) as tree, pytest.raises(FileExistsError):
        export(tree, tmp_path / "copy")


# -- commit (B10) ----------------------------------------------------------------------


def session_of(host: Path, tmp_path: Path) -> tuple[Path, BaseMarks]:
    """A session's view: a copy of ``host`` taken now, with the marks it starts from
    (the daemon's take a margin before the start, on the safe side; here the host was
    made just before, which that margin would count as changed since)."""
    marks = BaseMarks(time.time_ns())
    view = tmp_path / "view"
    shutil.copytree(host, view, symlinks=True)
    return view, marks


def never_found(path: str) -> bool:
    return False


def host_tree(host: Path) -> None:
    host.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (host / name).write_text(f"{name} on the host\n")
    (host / "sub").mkdir()
    (host / "sub" / "d.txt").write_text("d\n")


@pytest.mark.spec("B10")
def test_B10_a_commit_applies_the_changes_and_the_host_tree_is_the_sessions(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    host_tree(host)
    view, marks = session_of(host, tmp_path)
    (view / "a.txt").write_text("a by the session\n")
    (view / "b.txt").unlink()
    shutil.rmtree(view / "sub")
    (view / "new" / "deep").mkdir(parents=True)
    (view / "new" / "deep" / "e.txt").write_text("e\n")
    (view / "c.txt").chmod(0o755)
    (view / "link").symlink_to("a.txt")
    changes = changes_between(host, view)
    with Tree(view) as tree:
        written = commit(tree, host, changes, marks, never_found)
    assert sorted(written) == sorted(c.path for c in changes)
    assert snapshot(host) == snapshot(view)
    assert not [p for p in os.listdir(host) if p.startswith(".toolpool-commit")]
    # And a second commit of the same changes finds nothing left to do, and refuses
    # nothing: what the commit wrote counts as the session's
    assert changes_between(host, view) == []
    (view / "a.txt").write_text("again\n")
    with Tree(view) as tree:
        commit(tree, host, changes_between(host, view), marks, never_found)
    assert (host / "a.txt").read_text() == "again\n"


@pytest.mark.spec("B10")
@pytest.mark.parametrize("seed", range(15))
def test_B10_any_changes_committed_make_the_host_the_sessions_tree(
    tmp_path: Path, seed: int
) -> None:
    # Given a host tree and a session that changed it at random (type changes too)
    rng = random.Random(seed)
    host = tmp_path / "host"
    random_tree(rng, host)
    view, marks = session_of(host, tmp_path)
    mutate(rng, view)
    # When its changes are committed
    with Tree(view) as tree:
        commit(tree, host, changes_between(host, view), marks, never_found)
    # Then the host is the session's tree, and nothing of the commit's own is left
    assert snapshot(host) == snapshot(view)
    assert changes_between(host, view) == []
    assert not list(host.rglob(".toolpool-commit*"))


@pytest.mark.spec("B10")
def test_B10_paths_the_host_changed_since_the_start_refuse_the_commit_whole(
    tmp_path: Path,
) -> None:
    # Given a session that changed a.txt, b.txt and made c.txt anew
    host = tmp_path / "host"
    host_tree(host)
    view, marks = session_of(host, tmp_path)
    (view / "a.txt").write_text("a by the session\n")
    (view / "b.txt").write_text("b by the session\n")
    (view / "sub" / "d.txt").write_text("d by the session\n")
    changes = changes_between(host, view)
    # When the host changed a.txt since, and deleted d.txt the session found there
    time.sleep(0.02)  # a ctime after the session's start (clock granularity)
    (host / "a.txt").write_text("a by the user\n")
    (host / "sub" / "d.txt").unlink()
    before = snapshot(host)
    with Tree(view) as tree, pytest.raises(CommitConflict) as refused:
        commit(tree, host, changes, marks, lambda path: path == "sub/d.txt")
    # Then it is refused listing them, and nothing was written
    assert sorted(refused.value.paths) == ["a.txt", "sub/d.txt"]
    assert snapshot(host) == before


class RacingView(Tree):
    """A session's view whose reading of ``path`` is the moment the host changes
    ``victim``: a host change between the commit's check and its writes."""

    def __init__(self, root: Path, path: str, victim: Path) -> None:
        super().__init__(root)
        self.path, self.victim = path, victim

    def open(self, path: str) -> int:
        if path == self.path:
            self.victim.write_text("the user's change, mid-commit\n")
        return super().open(path)


@pytest.mark.spec("B10")
def test_B10_a_host_change_racing_the_commit_undoes_everything_it_wrote(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    host_tree(host)
    view, marks = session_of(host, tmp_path)
    for name in ("a.txt", "b.txt", "c.txt"):
        (view / name).write_text(f"{name} by the session\n")
    changes = changes_between(host, view)
    before = snapshot(host)
    time.sleep(0.02)  # the host's change has a ctime after the start (clock granularity)
    # When the host changes c.txt while the commit writes b.txt (after a.txt)
    with (
        RacingView(view, "b.txt", host / "c.txt") as tree,
        pytest.raises(CommitConflict) as refused,
    ):
        commit(tree, host, changes, marks, never_found)
    # Then the commit stops at c.txt, a.txt and b.txt are as they were, and the host's
    # change to c.txt is kept
    assert refused.value.paths == ["c.txt"]
    after = snapshot(host)
    assert after["a.txt"] == before["a.txt"] and after["b.txt"] == before["b.txt"]
    assert (host / "c.txt").read_text() == "the user's change, mid-commit\n"
    assert not [p for p in os.listdir(host) if p.startswith(".toolpool-commit")]


@pytest.mark.spec("B10")
def test_B10_a_write_that_fails_midway_restores_what_was_written(tmp_path: Path) -> None:
    # Given a session that changed a.txt and made sub/new.txt
    host = tmp_path / "host"
    host_tree(host)
    view, marks = session_of(host, tmp_path)
    (view / "a.txt").write_text("a by the session\n")
    (view / "zz").mkdir()
    (view / "zz" / "new.txt").write_text("new\n")
    changes = changes_between(host, view)
    # When, as the commit runs, the host has a symlink where the session's directory
    # goes (made after the check: the commit must not write through it)
    outside = tmp_path / "outside"
    outside.mkdir()

    class Swapping(Tree):
        def open(self, path: str) -> int:
            if path == "a.txt":
                (host / "zz").symlink_to(outside)
            return super().open(path)

    before = snapshot(host)
    with Swapping(view) as tree, pytest.raises(CommitConflict):
        commit(tree, host, changes, marks, never_found)
    # Then a.txt is restored, nothing went through the symlink
    assert (host / "a.txt").read_text() == before["a.txt"][2].decode()  # type: ignore[union-attr]
    assert os.listdir(outside) == []
    assert not [p for p in os.listdir(host) if p.startswith(".toolpool-commit")]
