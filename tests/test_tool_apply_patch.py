"""apply_patch: Codex's patch grammar, several files all or none, context lines as the
staleness guard, the register for what a patch does not show (F3), confinement like
write (X4), the preview of every file (P7)."""

from __future__ import annotations

import codecs
import difflib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from toolpool import ToolError
from toolpool.file_reads import content_hash
from toolpool.registry import ToolSpec
from toolpool.tool import ToolContext
from toolpool.tools.apply_patch import apply_patch_tool
from toolpool.tools.support import patch_commit
from toolpool.tools.support.patch_grammar import PatchSyntaxError, parse_patch
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE

from .tool_support import read_whole, tool_context

Tree = Mapping[str, str | bytes]


def write_tree(root: Path, tree: Tree) -> None:
    for name, content in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def read_tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every entry under ``root``: bytes (files), mtime and mode — what all-or-none keeps."""
    out = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        out[str(p.relative_to(root))] = (data, st_.st_mtime_ns, st_.st_mode)
    return out


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


def apply(ctx: ToolContext, text: str) -> str:
    """Validate, preview, then execute, as the pipeline does."""
    args = {"input": text}
    verdict = apply_patch_tool.validate(args, ctx)
    if not verdict.ok:
        raise ToolError(verdict.message, details={"validation_code": verdict.code})
    apply_patch_tool.preview(args, ctx)
    return apply_patch_tool.execute(args, ctx)


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return tool_context(workspace)


# --- the grammar's edge cases, as scenarios: a tree, a patch, the tree after or an error ---

SCENARIOS: list[Any] = [
    pytest.param(
        {}, patch("*** Add File: nested/dir/new.md", "+# Title", "+", "+text"), [],
        {"nested/dir/new.md": "# Title\n\ntext\n"}, id="add-file-with-directories",
    ),
    pytest.param(
        {"a.txt": "x\n"}, patch("*** Add File: empty.txt"), [],
        {"a.txt": "x\n", "empty.txt": ""}, id="add-empty-file",
    ),
    pytest.param(
        {"modify.txt": "line1\nline2\n", "delete.txt": "obsolete\n"},
        patch(
            "*** Add File: nested/new.txt", "+created",
            "*** Delete File: delete.txt",
            "*** Update File: modify.txt", "@@", "-line2", "+changed",
        ),
        ["delete.txt"],
        {"modify.txt": "line1\nchanged\n", "nested/new.txt": "created\n"},
        id="multiple-operations",
    ),
    pytest.param(
        {"multi.txt": "line1\nline2\nline3\nline4\n"},
        patch(
            "*** Update File: multi.txt", "@@", " line1", "-line2", "+changed2",
            "@@", " line3", "-line4", "+changed4",
        ),
        [], {"multi.txt": "line1\nchanged2\nline3\nchanged4\n"}, id="multiple-hunks",
    ),
    pytest.param(
        {"old/name.txt": "old content\n", "old/other.txt": "unrelated\n"},
        patch(
            "*** Update File: old/name.txt", "*** Move to: renamed/dir/name.txt",
            "@@", "-old content", "+new content",
        ),
        [], {"old/other.txt": "unrelated\n", "renamed/dir/name.txt": "new content\n"},
        id="move-to-a-new-directory",
    ),
    pytest.param(
        {"a.txt": "from\n", "b.txt": "existing\n"},
        patch("*** Update File: a.txt", "*** Move to: b.txt", "@@", "-from", "+moved"),
        ["b.txt"], {"b.txt": "moved\n"}, id="move-over-a-destination-that-was-read",
    ),
    pytest.param(
        {"a.txt": "from\n", "b.txt": "existing\n"},
        patch("*** Update File: a.txt", "*** Move to: b.txt", "@@", "-from", "+moved"),
        [], "Move to b.txt: it has not been read", id="move-over-an-unread-destination",
    ),
    pytest.param(
        {"dup.txt": "old\n"}, patch("*** Add File: dup.txt", "+new"), ["dup.txt"],
        {"dup.txt": "new\n"}, id="add-over-a-file-that-was-read",
    ),
    pytest.param(
        {"dup.txt": "old\n"}, patch("*** Add File: dup.txt", "+new"), [],
        "Add File dup.txt: it has not been read", id="add-over-an-unread-file",
    ),
    pytest.param(
        {"dir/foo.txt": "x\n"}, patch("*** Delete File: dir"), [],
        "Delete File dir: it is not a regular file", id="delete-a-directory",
    ),
    pytest.param(
        {"foo.txt": "x\n"}, patch("*** Delete File: missing.txt"), [],
        "Delete File .*missing.txt", id="delete-a-missing-file",
    ),
    pytest.param(
        {"foo.txt": "x\n"}, patch("*** Update File: missing.txt", "@@", "-x", "+y"), [],
        "Update File .*missing.txt", id="update-a-missing-file",
    ),
    pytest.param(
        {"foo.txt": "x\n"}, patch(), [], "line 2: the patch holds no file operation",
        id="empty-patch",
    ),
    pytest.param(
        {"modify.txt": "line1\nline2\n"},
        patch("*** Update File: modify.txt", "@@", "-missing", "+changed"), [],
        r"Update File modify.txt: hunk 1 of 1 \(line 3 of the patch\) does not match",
        id="missing-context",
    ),
    pytest.param(
        {"foo.txt": "x\n"}, patch("*** Update File: foo.txt"), [],
        "line 2: '\\*\\*\\* Update File: foo.txt' has no hunk", id="empty-update",
    ),
    pytest.param(
        {"foo.txt": "x\n"}, patch("*** Frobnicate File: foo.txt"), [],
        "line 2: '\\*\\*\\* Frobnicate File: foo.txt' is not a file operation",
        id="invalid-operation-header",
    ),
    pytest.param(
        {"no_newline.txt": "no newline at end"},
        patch("*** Update File: no_newline.txt", "@@", "-no newline at end", "+first", "+second"),
        [], {"no_newline.txt": "first\nsecond\n"}, id="update-ends-with-a-newline",
    ),
    pytest.param(
        {"input.txt": "line1\nline2\n"},
        patch("*** Update File: input.txt", "@@", "+added 1", "+added 2"),
        [], {"input.txt": "line1\nline2\nadded 1\nadded 2\n"}, id="pure-addition-at-the-end",
    ),
    pytest.param(
        {"f.py": "class A:\n    x = 1\n"},
        patch("*** Update File: f.py", "@@ class A:", "+    y = 0"),
        [], {"f.py": "class A:\n    y = 0\n    x = 1\n"}, id="pure-addition-below-its-header",
    ),
    pytest.param(
        {"foo.txt": "old\n"},
        "  *** Begin Patch \n  *** Update File: foo.txt  \n@@\n-old\n+new\n *** End Patch  \n",
        [], {"foo.txt": "new\n"}, id="whitespace-padded-markers",
    ),
    pytest.param(
        {"foo.txt": "line1\nnaïve café\n"},
        patch("*** Update File: foo.txt", "@@", " line1", "-naïve café", "+naïve café ✅"),
        [], {"foo.txt": "line1\nnaïve café ✅\n"}, id="unicode",
    ),
    pytest.param(
        {"q.txt": "say \u201chi\u201d \u2014 it\u2019s\u00a0fine\nend\n"},
        patch("*** Update File: q.txt", "@@", " say \"hi\" - it's fine", "-end", "+END"),
        [], {"q.txt": "say \u201chi\u201d \u2014 it\u2019s\u00a0fine\nEND\n"},
        id="typographic-punctuation-matches-ascii-and-context-keeps-the-file's-text",
    ),
    pytest.param(
        {"w.py": "def f():   \n\treturn 1\n"},
        patch("*** Update File: w.py", "@@", " def f():", "-    return 1", "+\treturn 2"),
        [], {"w.py": "def f():   \n\treturn 2\n"}, id="leading-and-trailing-whitespace-aside",
    ),
    pytest.param(
        {"lines.txt": "line1\nremove me\nline3\n"},
        patch("*** Update File: lines.txt", "@@", " line1", "-remove me", " line3"),
        [], {"lines.txt": "line1\nline3\n"}, id="deletion-only",
    ),
    pytest.param(
        {"tail.txt": "x\nsame\nmiddle\nsame\n"},
        patch("*** Update File: tail.txt", "@@", "-same", "+last", "*** End of File"),
        [], {"tail.txt": "x\nsame\nmiddle\nlast\n"}, id="end-of-file-anchors-at-the-end",
    ),
    pytest.param(
        {"tail.txt": "first\nsecond\nthird\n"},
        patch("*** Update File: tail.txt", "@@", "-second", "+2", "*** End of File"),
        [], "marked '\\*\\*\\* End of File' but its lines are at line 2",
        id="end-of-file-marker-not-at-the-end",
    ),
    pytest.param(
        {"foo.txt": "old\n"},
        "<<'EOF'\n" + patch("*** Update File: foo.txt", "@@", "-old", "+new") + "\nEOF\n",
        [], {"foo.txt": "new\n"}, id="heredoc-wrapped",
    ),
    pytest.param(
        {"foo.txt": "old\n"},
        patch("*** Update File: foo.txt", "@@", "-old", "+new").replace("\n", "\r\n"),
        [], {"foo.txt": "new\n"}, id="crlf-patch-text",
    ),
    pytest.param(
        {"f.py": "def f():\n    return 1\n"},
        patch(
            "*** Update File: f.py", "@@ -1,2 +1,2 @@ def f():", "-    return 1", "+    return 2"
        ),
        [], {"f.py": "def f():\n    return 2\n"}, id="unified-diff-hunk-header",
    ),
    pytest.param(
        {}, patch("*** Add File: n.txt", "+one", "*** Update File: n.txt", "@@", "-one", "+two"),
        [], {"n.txt": "two\n"}, id="add-then-update-one-path",
    ),
    pytest.param(
        {"o.txt": "a\nb\nc\nd\n"},
        patch("*** Update File: o.txt", "@@", "-c", "+C", "@@", "-a", "+A"),
        [], "Its lines are at line 1, above where the hunk before it ended",
        id="hunks-out-of-order",
    ),
    pytest.param(
        {"h.py": "def f():\n    pass\n"},
        patch("*** Update File: h.py", "@@ def g():", "-    pass", "+    return"),
        [], "Its '@@ def g\\(\\):' line is not in the file", id="header-not-found",
    ),
    pytest.param(
        {"e.txt": "a\nb\n"},
        patch("*** Update File: e.txt", "@@", " a", "-b", "+B", ""),
        [], {"e.txt": "a\nB\n"}, id="a-last-empty-line-stands-for-the-final-newline",
    ),
    pytest.param(
        {"keep.txt": "k\n"},
        patch(
            "*** Add File: created.txt", "+hello",
            "*** Update File: missing.txt", "@@", "-a", "+b",
        ),
        [], "Update File .*missing.txt", id="a-failure-after-a-planned-file-changes-nothing",
    ),
    pytest.param(
        {"two.txt": "x = 1\ny = 2\n"},
        patch("*** Update File: two.txt", " x = 1", "-y = 2", "+y = 3"),
        [], {"two.txt": "x = 1\ny = 3\n"}, id="first-hunk-without-@@",
    ),
]  # fmt: skip


@pytest.mark.spec("F11", "F3")
@pytest.mark.parametrize(("tree", "text", "read", "expected"), SCENARIOS)
def test_scenario(
    workspace: Path, ctx: ToolContext, tree: Tree, text: str, read: list[str], expected: Any
) -> None:
    # Given a tree, some of it read
    write_tree(workspace, tree)
    for name in read:
        read_whole(ctx, name)
    before = snapshot(workspace)
    # When the patch is applied
    if isinstance(expected, str):
        # Then it is refused, naming why, and nothing changed (all or none)
        with pytest.raises(ToolError) as caught:
            apply(ctx, text)
        assert re.search(expected, caught.value.message), caught.value.message
        assert snapshot(workspace) == before
    else:
        # Then the tree is the expected one, and nothing else was left behind
        out = apply(ctx, text)
        assert out.startswith("Success.")
        assert read_tree(workspace) == expected


# --- parse errors name the line ---------------------------------------------------------


def in_order(text: str, parts: str) -> bool:
    """Whether the ``…``-separated ``parts`` are in ``text``, in that order."""
    at = 0
    for part in parts.split("…"):
        found = text.find(part, at)
        if found == -1:
            return False
        at = found + len(part)
    return True


@pytest.mark.spec("F11")
@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("", 1, "the patch is empty"),
        ("bad\n*** End Patch", 1, "the patch must start with '*** Begin Patch', not 'bad'"),
        ("\n\n*** Begin Patch\n*** Add File: a\n+x", 5, "must end with '*** End Patch'"),
        (patch("*** Add File: a", "+x", "oops"), 4, "'oops' is not a file operation…with '+'"),
        (patch("*** Update File: a", "@@", "x"), 4, "'x' is not a line of a hunk"),
        (patch("*** Update File: a", "@@", "-x", "@@"), 5, "the hunk has no lines"),
        (patch("*** Update File: a", "@@", "*** End of File"), 3, "the hunk has no lines"),
        (patch("*** Add File:   "), 2, "'*** Add File:' names no path"),
        (patch("*** Update File: a", "*** Move to: ", "@@", "-x"), 3, "names no path"),
        (patch("*** Update File: a", " x", "y"), 4, "'y' is not a line of a hunk…with '@@'"),
    ],
)
def test_parse_errors_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(PatchSyntaxError) as caught:
        parse_patch(text)
    assert caught.value.line == line
    assert in_order(caught.value.message, message), caught.value.message
    # And the tool says the same, in validate
    verdict = apply_patch_tool.validate({"input": text}, tool_context(Path("/")))
    assert verdict.message == f"The patch is not valid: line {line}: {caught.value.message}"


# --- all or none, across files ----------------------------------------------------------


@pytest.mark.spec("F11")
def test_a_later_file_that_does_not_match_leaves_every_file_as_it_was(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given three files, one to delete (read), and a patch whose last hunk is stale
    write_tree(workspace, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"})
    read_whole(ctx, "c.txt")
    before = snapshot(workspace)
    text = patch(
        "*** Update File: a.txt", "@@", "-a", "+A",
        "*** Add File: new/n.txt", "+n",
        "*** Delete File: c.txt",
        "*** Update File: b.txt", "@@", "-not b", "+B",
    )  # fmt: skip
    # When it is applied
    with pytest.raises(ToolError, match=r"Update File b.txt: hunk 1 of 1"):
        apply_patch_tool.execute({"input": text}, ctx)
    # Then every file is byte-identical, mtimes too, and nothing was created
    assert snapshot(workspace) == before


@pytest.mark.spec("F11")
def test_a_write_that_fails_midway_is_rolled_back(
    workspace: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given files to update, to create in new directories, to delete
    write_tree(workspace, {"a.txt": "a\n", "b.txt": "b\n", "gone.txt": "g\n"})
    (workspace / "a.txt").chmod(0o751)
    read_whole(ctx, "gone.txt")
    inode = (workspace / "a.txt").stat().st_ino
    before = snapshot(workspace)
    text = patch(
        "*** Update File: a.txt", "@@", "-a", "+A",
        "*** Add File: x/y/new.txt", "+n",
        "*** Delete File: gone.txt",
        "*** Update File: b.txt", "@@", "-b", "+B",
    )  # fmt: skip
    # When the disk fills up at the third write (b.txt), after a.txt and x/y/new.txt
    real = patch_commit.write_atomic_at
    calls: list[str] = []

    def failing(dir_fd: int, name: str, data: bytes) -> os.stat_result:
        calls.append(name)
        if name == "b.txt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(dir_fd, name, data)

    monkeypatch.setattr(patch_commit, "write_atomic_at", failing)
    with pytest.raises(ToolError) as caught:
        apply_patch_tool.execute({"input": text}, ctx)
    # Then the error says what failed and that it was undone
    assert caught.value.message == (
        "b.txt cannot be written: No space left on device. Nothing was changed: the "
        "files already written were put back."
    )
    assert calls == ["a.txt", "new.txt", "b.txt"]
    # And every file is as it was — the same inode, mode and mtime — the new file and
    # its directories are gone, the deleted file was never deleted, no backup is left
    assert snapshot(workspace) == before
    assert (workspace / "a.txt").stat().st_ino == inode


@pytest.mark.spec("F11")
def test_a_delete_that_fails_puts_back_the_files_written_and_deleted(
    workspace: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two files to delete and one to update
    write_tree(workspace, {"a.txt": "a\n", "d1.txt": "1\n", "d2.txt": "2\n"})
    read_whole(ctx, "d1.txt")
    read_whole(ctx, "d2.txt")
    before = snapshot(workspace)
    text = patch(
        "*** Delete File: d1.txt", "*** Delete File: d2.txt",
        "*** Update File: a.txt", "@@", "-a", "+A",
    )  # fmt: skip
    real = os.unlink

    def failing(path: Any, *, dir_fd: int | None = None) -> None:
        if path == "d2.txt":
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        real(path, dir_fd=dir_fd)

    # When the second delete fails (after a.txt was written and d1.txt deleted)
    monkeypatch.setattr(patch_commit.os, "unlink", failing)
    with pytest.raises(ToolError, match=r"^d2.txt cannot be written: Input/output error. Nothing"):
        apply_patch_tool.execute({"input": text}, ctx)
    monkeypatch.undo()
    # Then both are as they were
    assert snapshot(workspace) == before


# --- what guards what -----------------------------------------------------------------


@pytest.mark.spec("F11")
def test_update_needs_no_read_its_context_is_the_guard(workspace: Path, ctx: ToolContext) -> None:
    # Given a file never read
    (workspace / "a.py").write_text("x = 1\ny = 2\n")
    text = patch("*** Update File: a.py", "@@", " x = 1", "-y = 2", "+y = 3")
    # Then the patch applies
    assert apply(ctx, text) == "Success. Updated the following files:\nM a.py"
    # But once the file changed in a context line, the same kind of patch is refused
    (workspace / "a.py").write_text("x = 100\ny = 3\n")
    again = patch("*** Update File: a.py", "@@", " x = 1", "-y = 3", "+y = 4")
    with pytest.raises(ToolError) as caught:
        apply(ctx, again)
    message = caught.value.message
    assert message.startswith("Update File a.py: hunk 1 of 1 (line 3 of the patch) does not match")
    assert (
        "The nearest place is line 1, where 1 of its 2 context and removed lines match" in message
    )
    assert "     1\tx = 100\n     2\ty = 3" in message
    assert (workspace / "a.py").read_text() == "x = 100\ny = 3\n"


@pytest.mark.spec("F3")
@pytest.mark.parametrize("operation", ["delete", "add", "move"])
def test_F3_what_a_patch_does_not_show_needs_a_whole_fresh_read(
    workspace: Path, ctx: ToolContext, operation: str
) -> None:
    # Given a file the operation destroys
    path = workspace / "t.txt"
    path.write_text("precious\n")
    (workspace / "src.txt").write_text("s\n")
    text = {
        "delete": patch("*** Delete File: t.txt"),
        "add": patch("*** Add File: t.txt", "+new"),
        "move": patch("*** Update File: src.txt", "*** Move to: t.txt", "@@", "-s", "+S"),
    }[operation]
    args = {"input": text}
    # When it was never read: code 2, in validate and in execute
    verdict = apply_patch_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_NOT_READ)
    assert "the patch does not show what is lost" in verdict.message
    with pytest.raises(ToolError, match="has not been read") as caught:
        apply_patch_tool.execute(args, ctx)
    assert caught.value.details["validation_code"] == CODE_NOT_READ
    assert caught.value.details["read_first"] == {"path": "t.txt"}
    # When it was read, then changed: code 3
    read_whole(ctx, "t.txt")
    path.write_text("precious, edited by the user\n")
    verdict = apply_patch_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_STALE)
    with pytest.raises(ToolError, match="changed since it was read") as caught:
        apply_patch_tool.execute(args, ctx)
    assert caught.value.details == {"validation_code": CODE_STALE}
    assert path.read_text() == "precious, edited by the user\n"
    # When it was read whole and is unchanged: it goes through
    read_whole(ctx, "t.txt")
    assert apply(ctx, text).startswith("Success.")


@pytest.mark.spec("F5")
def test_F5_the_register_after_a_patch(workspace: Path, ctx: ToolContext) -> None:
    # Given a file read, a file never read, a file read to be deleted, one read to move
    write_tree(
        workspace, {"read.txt": "r\n", "unread.txt": "u\n", "gone.txt": "g\n", "m.txt": "m\n"}
    )
    for name in ("read.txt", "gone.txt", "m.txt"):
        read_whole(ctx, name)
    apply(
        ctx,
        patch(
            "*** Update File: read.txt", "@@", "-r", "+R",
            "*** Update File: unread.txt", "@@", "-u", "+U",
            "*** Delete File: gone.txt",
            "*** Update File: m.txt", "*** Move to: moved.txt", "@@", "-m", "+M",
            "*** Add File: added.txt", "+a",
        ),
    )  # fmt: skip

    def fresh(name: str) -> bool:
        stamp = ctx.files.get(workspace / name)
        return (
            stamp is not None
            and not stamp.partial
            and stamp.content_hash == content_hash((workspace / name).read_bytes())
        )

    # Then what the model knows whole is stamped: read and updated, moved, added
    assert fresh("read.txt") and fresh("moved.txt") and fresh("added.txt")
    # And what it saw only hunks of is not; what is gone has no stamp
    assert ctx.files.get(workspace / "unread.txt") is None
    assert ctx.files.get(workspace / "gone.txt") is None
    assert ctx.files.get(workspace / "m.txt") is None


# --- what the model and the user see ------------------------------------------------------


@pytest.mark.spec("P7", "H3")
def test_the_preview_is_the_diff_of_every_file(workspace: Path, ctx: ToolContext) -> None:
    write_tree(workspace, {"a.py": "one\ntwo\n", "old.py": "x\n", "gone.txt": "g\n"})
    read_whole(ctx, "gone.txt")
    text = patch(
        "*** Add File: new.txt", "+hello",
        "*** Update File: a.py", "@@", " one", "-two", "+2",
        "*** Update File: old.py", "*** Move to: pkg/new.py", "@@", "-x", "+y",
        "*** Delete File: gone.txt",
    )  # fmt: skip
    diff = apply_patch_tool.preview({"input": text}, ctx).text
    assert diff == (
        "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n"
        "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
        "--- a/old.py\n+++ b/pkg/new.py\n@@ -1 +1 @@\n-x\n+y\n"
        "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-g\n"
    )
    # And each file's part is difflib's diff of it
    assert (
        "".join(difflib.unified_diff(["one\n", "two\n"], ["one\n", "2\n"], "a/a.py", "b/a.py"))
        in diff
    )
    assert read_tree(workspace) == {"a.py": "one\ntwo\n", "old.py": "x\n", "gone.txt": "g\n"}
    # The result lists the files as Codex does: added, updated (moved), deleted
    assert apply_patch_tool.execute({"input": text}, ctx) == (
        "Success. Updated the following files:\nA new.txt\nM a.py\n"
        "M pkg/new.py (moved from old.py)\nD gone.txt"
    )


@pytest.mark.spec("F11")
def test_crlf_bom_and_a_moved_file_s_mode_are_kept(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "win.txt").write_bytes(codecs.BOM_UTF8 + b"one\r\ntwo\r\nthree\r\n")
    (workspace / "run.sh").write_text("echo old\n")
    (workspace / "run.sh").chmod(0o750)
    apply(
        ctx,
        patch(
            "*** Update File: win.txt", "@@", " one", "-two", "+2", "+2b",
            "*** Update File: run.sh", "*** Move to: bin/run.sh", "@@", "-echo old", "+echo new",
        ),
    )  # fmt: skip
    assert (workspace / "win.txt").read_bytes() == codecs.BOM_UTF8 + b"one\r\n2\r\n2b\r\nthree\r\n"
    assert stat.S_IMODE((workspace / "bin" / "run.sh").stat().st_mode) == 0o750
    assert (workspace / "bin" / "run.sh").read_text() == "echo new\n"
    assert sorted(p.name for p in workspace.iterdir()) == ["bin", "win.txt"]


@pytest.mark.spec("F11")
def test_a_whitespace_near_miss_is_quoted(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "s.py").write_text("if  ready :\n    go( )\n")
    with pytest.raises(ToolError) as caught:
        apply(ctx, patch("*** Update File: s.py", "@@", " if ready:", "-    go()", "+    stop()"))
    assert (
        "except for whitespace inside them, at line 1; the file has:\nif  ready :\n    go( )\n"
        in (caught.value.message)
    )


@pytest.mark.spec("F11")
def test_a_file_that_is_not_utf8_is_refused(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "l.txt").write_bytes("café\n".encode("latin-1"))
    with pytest.raises(ToolError, match=r"Update File l.txt: it is not UTF-8 text"):
        apply(ctx, patch("*** Update File: l.txt", "@@", "-caf", "+x"))


# --- confinement: exactly like write ------------------------------------------------------


@pytest.mark.spec("X4")
@pytest.mark.parametrize("header", ["Add File", "Update File", "Delete File", "Move to"])
def test_paths_outside_the_roots_are_refused(
    workspace: Path, outside: Path, ctx: ToolContext, header: str
) -> None:
    (workspace / "out").symlink_to(outside)
    (workspace / "in.txt").write_text("top secret\n")
    for raw in (
        "../outside/secret.txt",
        str(outside / "secret.txt"),
        "out/secret.txt",
        "/proc/self/environ",
    ):
        if header == "Move to":
            body = ["*** Update File: in.txt", f"*** Move to: {raw}", "@@", "-top secret", "+x"]
        elif header == "Add File":
            body = [f"*** Add File: {raw}", "+x"]
        elif header == "Update File":
            body = [f"*** Update File: {raw}", "@@", "-top secret", "+x"]
        else:
            body = [f"*** Delete File: {raw}"]
        args = {"input": patch(*body)}
        verdict = apply_patch_tool.validate(args, ctx)
        assert re.match(rf"{header} {re.escape(raw)}: Access denied", verdict.message), (
            verdict.message
        )
        with pytest.raises(ToolError, match="Access denied"):
            apply_patch_tool.execute(args, ctx)
        with pytest.raises(ToolError, match="Access denied"):
            apply_patch_tool.preview(args, ctx)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert (workspace / "in.txt").read_text() == "top secret\n"


@pytest.mark.spec("F11", "S1")
def test_it_declares_what_edit_declares_and_names_its_files(
    workspace: Path, ctx: ToolContext
) -> None:
    from toolpool.tools import edit_tool

    spec, edit_spec = ToolSpec(apply_patch_tool), ToolSpec(edit_tool)
    text = patch("*** Update File: a", "*** Move to: b/c", "@@", "-x", "*** Delete File: ../out")
    args = {"input": text}
    edit_args = {"path": "a", "old_string": "a", "new_string": "b"}
    assert spec.read_only(args) is edit_spec.read_only(edit_args) is False
    assert spec.concurrency_safe(args) is edit_spec.concurrency_safe(edit_args) is False
    assert spec.interrupt_behavior(args) == edit_spec.interrupt_behavior(edit_args)
    assert spec.permissions == edit_spec.permissions == ("write",)
    # Its stamps travel with the call: every path inside the roots, resolved
    assert spec.file_paths(args, ctx) == [
        workspace.resolve() / "a",
        workspace.resolve() / "b" / "c",
    ]
    assert spec.file_paths({"input": "not a patch"}, ctx) == []


# --- a property: a patch made from (old, new) gives new; a stale one changes nothing ------

_LINE = st.text(st.sampled_from("abcxyz _-:()\t"), max_size=12)


@st.composite
def old_and_new(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    # Lines unique even as the loosest match compares them: a hunk then matches at
    # one place only, the place it was made from.
    old = draw(st.lists(_LINE, max_size=30, unique_by=lambda s: s.strip()))
    new: list[str] = []
    fresh = iter(f"new {n}" for n in range(1000))
    for line in old:
        choice = draw(st.sampled_from(["keep", "keep", "keep", "drop", "change", "insert"]))
        if choice == "keep":
            new.append(line)
        elif choice == "change":
            new.append(next(fresh))
        elif choice == "insert":
            new.extend([next(fresh), line])
    if draw(st.booleans()):
        new.append(next(fresh))
    return old, new


def patch_from(path: str, old: list[str], new: list[str]) -> str:
    """A patch as a model would write it: every changed region with 3 lines of context."""
    body = [f"*** Update File: {path}"]
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(3):
        body.append("@@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                body.extend(" " + line for line in old[i1:i2])
                continue
            body.extend("-" + line for line in old[i1:i2])
            body.extend("+" + line for line in new[j1:j2])
        if group[-1][2] == len(old):
            body.append("*** End of File")
    return patch(*body)


@pytest.mark.spec("F11")
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pair=old_and_new(), data=st.data())
def test_a_patch_from_old_and_new_gives_new_and_a_stale_one_changes_nothing(
    tmp_path: Path, pair: tuple[list[str], list[str]], data: st.DataObject
) -> None:
    old, new = pair
    assume(old != new)
    workspace = Path(tempfile.mkdtemp(dir=tmp_path))
    ctx = tool_context(workspace)
    text = patch_from("f.txt", old, new)
    path = workspace / "f.txt"
    # Given the file as the patch was made from it, Then the patch gives exactly new
    path.write_text("".join(f"{line}\n" for line in old))
    apply(ctx, text)
    assert path.read_text() == "".join(f"{line}\n" for line in new)
    # Given the file changed in one of the lines the patch expects (context or removed)
    expected = [line[1:] for line in text.split("\n")[2:-1] if line[:1] in (" ", "-")]
    assume(expected)
    stale = list(old)
    target = data.draw(st.sampled_from(expected))
    stale[old.index(target)] = "changed by someone else"
    path.write_text("".join(f"{line}\n" for line in stale))
    before = snapshot(workspace)
    # Then the patch is refused and changes nothing
    with pytest.raises(ToolError, match=r"does not match the file"):
        apply(ctx, text)
    assert snapshot(workspace) == before


# --- through a real daemon: the built-ins run in workers, stamps travel ------


@pytest.mark.spec("F11", "F5", "P7")
def test_a_session_applies_a_multi_file_patch_and_a_multi_edit(
    tmp_path: Path, workspace: Path
) -> None:
    from toolpool import Client, ToolCall, ToolUpdate, UpdateKind

    from .daemon_support import running_daemon

    # Given a daemon that loads both tools, and a workspace
    write_tree(workspace, {"app.py": "x = 1\ny = 2\n", "gone.txt": "old\n", "lib.py": "a\n"})
    text = patch(
        "*** Update File: app.py", "@@", " x = 1", "-y = 2", "+y = 3",
        "*** Add File: pkg/new.py", "+n = 0",
        "*** Delete File: gone.txt",
    )  # fmt: skip
    stale = patch("*** Add File: other.py", "+o", "*** Update File: lib.py", "@@", "-gone", "+b")
    with (
        running_daemon(tmp_path) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
        client.session(workspace) as session,
    ):
        # When the model reads what it deletes, then patches three files, then
        # multi-edits the file the patch added (no read: the patch wrote it whole)
        session.submit([ToolCall("r", "read", {"path": "gone.txt"})]).results()
        turn = session.submit(
            [
                ToolCall("p", "apply_patch", {"input": text}),
                ToolCall(
                    "m",
                    "multi_edit",
                    {
                        "path": "pkg/new.py",
                        "edits": [
                            {"old_string": "n = 0", "new_string": "n = 1"},
                            {"old_string": "n = 1", "new_string": "n = 2\nm = 3"},
                        ],
                    },
                ),
                ToolCall("s", "apply_patch", {"input": stale}),
            ]
        )
        events = list(turn)
        results = {r.call_id: r for r in turn.results()}
    # Then the patch and the multi_edit succeeded, each with its preview first
    assert results["p"].text == (
        "Success. Updated the following files:\nA pkg/new.py\nM app.py\nD gone.txt"
    ), results["p"].text
    assert results["m"].text.startswith("Edited pkg/new.py: 2 edits applied in order"), results[
        "m"
    ].text
    previews = {
        e.call_id: e.data
        for e in events
        if isinstance(e, ToolUpdate) and e.kind is UpdateKind.PREVIEW
    }
    assert "+++ b/pkg/new.py\n" in previews["p"] and "+++ /dev/null\n" in previews["p"]
    assert (
        previews["m"]
        == "--- a/pkg/new.py\n+++ b/pkg/new.py\n@@ -1 +1,2 @@\n-n = 0\n+n = 2\n+m = 3\n"
    )
    # And the stale patch was refused whole: the file it would add is not there
    assert results["s"].is_error
    assert results["s"].text.startswith("Update File lib.py: hunk 1 of 1"), results["s"].text
    assert read_tree(workspace) == {
        "app.py": "x = 1\ny = 3\n",
        "lib.py": "a\n",
        "pkg/new.py": "n = 2\nm = 3\n",
    }
