"""edit and write: exact replacement, line endings and BOM kept, helpful refusals,
atomic writes, and the read-before-write invariant at validate and at execute time
(SPEC F1, F3, F5, T4)."""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client, ToolCall, ToolError
from toolpool.client import ApprovalRequested
from toolpool.file_reads import Freshness, content_hash
from toolpool.registry import ToolSpec
from toolpool.tool import ToolContext
from toolpool.tools import edit_tool, read_tool, write_tool
from toolpool.tools.support import read_copies
from toolpool.tools.support.stale import MAX_DIFF_CHARS, MAX_DIFF_LINES
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE

from .daemon_support import running_daemon
from .tool_support import read_whole, tool_context


def edit(
    ctx: ToolContext, path: str, old: str, new: str, *, replace_all: bool | None = None
) -> str:
    """Validate, then execute an edit, as the pipeline does (preview aside)."""
    args: dict[str, Any] = {"path": path, "old_string": old, "new_string": new}
    if replace_all is not None:
        args["replace_all"] = replace_all
    verdict = edit_tool.validate(args, ctx)
    if not verdict.ok:
        raise ToolError(verdict.message, details={"validation_code": verdict.code})
    return edit_tool.execute(args, ctx)


def read_then_edit(ctx: ToolContext, path: str, old: str, new: str, **kw: Any) -> str:
    read_whole(ctx, path)
    return edit(ctx, path, old, new, **kw)


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return tool_context(workspace)


# --- edit: exact replacement ---------------------------------------------------------


@pytest.mark.spec("F1")
def test_edit_replaces_exactly_once_and_shows_the_result(workspace: Path, ctx: ToolContext) -> None:
    # Given a file that was read
    (workspace / "app.py").write_text("def f():\n    return 1\n\nprint(f())\n")
    # When one line is edited
    out = read_then_edit(ctx, "app.py", "    return 1", "    return 2")
    # Then the file holds the change, and the result shows the lines around it
    assert (workspace / "app.py").read_text() == "def f():\n    return 2\n\nprint(f())\n"
    assert out == (
        "Edited app.py. Lines 1-4 now read:\n"
        "     1\tdef f():\n     2\t    return 2\n     3\t\n     4\tprint(f())"
    )


@pytest.mark.spec("F1")
def test_edit_replace_all_replaces_every_occurrence(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "m.py").write_text("old_name = 1\nprint(old_name)\nold_name += 1\n")
    out = read_then_edit(ctx, "m.py", "old_name", "new_name", replace_all=True)
    assert (workspace / "m.py").read_text() == "new_name = 1\nprint(new_name)\nnew_name += 1\n"
    assert out == "Edited m.py: replaced 3 occurrences."


@pytest.mark.spec("F1")
def test_edit_refuses_an_ambiguous_old_string_with_the_count_and_lines(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given a file where the text occurs three times
    (workspace / "m.py").write_text("x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n")
    read_whole(ctx, "m.py")
    # When it is edited without replace_all
    with pytest.raises(ToolError) as caught:
        edit(ctx, "m.py", "x = 1", "x = 9")
    # Then the error gives the count and the lines, and says how to choose
    assert caught.value.message.startswith("old_string occurs 3 times in m.py (lines 1, 3, 5).")
    assert "replace_all" in caught.value.message
    assert (workspace / "m.py").read_text() == "x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n"


@pytest.mark.spec("F1")
def test_edit_not_found_says_so(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "a.py").write_text("alpha\n")
    read_whole(ctx, "a.py")
    with pytest.raises(ToolError, match=r"old_string was not found in a.py. Read the file again"):
        edit(ctx, "a.py", "beta", "gamma")


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    "old",
    [
        "if ready:\n  go()",  # indentation differs (the file has 4 spaces)
        "if ready :\n    go( )",  # spacing differs inside the lines
        "ready:\n\tgo()",  # a tab for spaces, starting inside the first line
    ],
)
def test_edit_not_found_hints_at_whitespace_and_quotes_the_file(
    workspace: Path, ctx: ToolContext, old: str
) -> None:
    # Given a file, and an old_string that differs from it only in whitespace
    (workspace / "a.py").write_text("x = 0\nif ready:\n    go()\n")
    read_whole(ctx, "a.py")
    # When it is edited
    with pytest.raises(ToolError) as caught:
        edit(ctx, "a.py", old, "pass")
    # Then the error says where the text is, and quotes the file's exact text
    message = caught.value.message
    assert "except for whitespace or indentation, at line 2" in message
    assert "the file has:\nif ready:\n    go()\n" in message


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("content", "old", "why"),
    [
        (b"one\ntwo\n", "one\r\ntwo", "old_string has CRLF"),
        (b"one\r\ntwo\nthree\r\n", "one\ntwo", "the file mixes CRLF"),
    ],
)
def test_edit_not_found_hints_at_line_endings(
    workspace: Path, ctx: ToolContext, content: bytes, old: str, why: str
) -> None:
    (workspace / "f.txt").write_bytes(content)
    read_whole(ctx, "f.txt")
    with pytest.raises(ToolError, match=rf"at line 1, except for line endings: {why}"):
        edit(ctx, "f.txt", old, "1\n2")


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("same", "same", "old_string and new_string are the same"),
        ("", "text", "old_string is empty. To create a file or replace all of it, use write."),
    ],
)
def test_edit_refuses_pointless_arguments_in_validate(
    workspace: Path, ctx: ToolContext, old: str, new: str, message: str
) -> None:
    (workspace / "a.txt").write_text("same\n")
    read_whole(ctx, "a.txt")
    verdict = edit_tool.validate({"path": "a.txt", "old_string": old, "new_string": new}, ctx)
    assert not verdict.ok
    assert verdict.message.startswith(message)


@pytest.mark.spec("F1")
def test_edit_of_a_missing_file_points_to_write(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "config.toml").write_text("")
    args = {"path": "config.tml", "old_string": "a", "new_string": "b"}
    verdict = edit_tool.validate(args, ctx)
    assert verdict.message == (
        "File does not exist: config.tml. Did you mean config.toml? edit changes existing "
        "files; to create one, use write."
    )
    with pytest.raises(ToolError, match=r"To create a file, use write"):
        edit_tool.execute(args, ctx)


@pytest.mark.spec("F1")
def test_edit_refuses_files_that_are_not_utf8(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    read_whole(ctx, "latin1.txt")
    with pytest.raises(ToolError, match=r"not UTF-8 text.*Use write"):
        edit(ctx, "latin1.txt", "caf", "bar")


# --- edit: what the model does not see is kept ------------------------------------------


@pytest.mark.spec("F1")
def test_edit_keeps_crlf_line_endings(workspace: Path, ctx: ToolContext) -> None:
    # Given a CRLF file
    (workspace / "win.txt").write_bytes(b"first\r\nsecond\r\nthird\r\n")
    # When the model edits across a line break, writing \n as it always does
    read_then_edit(ctx, "win.txt", "first\nsecond", "1st\n2nd\nextra")
    # Then every line still ends in CRLF, the new ones included
    assert (workspace / "win.txt").read_bytes() == b"1st\r\n2nd\r\nextra\r\nthird\r\n"


@pytest.mark.spec("F1")
def test_edit_keeps_a_utf8_bom(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "bom.cs").write_bytes(codecs.BOM_UTF8 + b"class A {}\n")
    read_then_edit(ctx, "bom.cs", "class A", "class B")
    assert (workspace / "bom.cs").read_bytes() == codecs.BOM_UTF8 + b"class B {}\n"


@pytest.mark.spec("F1")
def test_edit_keeps_bom_and_crlf_together(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "both.txt").write_bytes(codecs.BOM_UTF8 + b"a\r\nb\r\n")
    read_then_edit(ctx, "both.txt", "a\nb", "c\nd")
    assert (workspace / "both.txt").read_bytes() == codecs.BOM_UTF8 + b"c\r\nd\r\n"


@pytest.mark.spec("F1")
def test_edit_of_a_mixed_endings_file_leaves_other_lines_alone(
    workspace: Path, ctx: ToolContext
) -> None:
    (workspace / "mixed.txt").write_bytes(b"a\r\nb\nc\r\n")
    read_then_edit(ctx, "mixed.txt", "b", "B")
    assert (workspace / "mixed.txt").read_bytes() == b"a\r\nB\nc\r\n"


@pytest.mark.spec("F1")
def test_edit_is_atomic_and_keeps_the_file_mode(workspace: Path, ctx: ToolContext) -> None:
    # Given an executable script
    script = workspace / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o750)
    # When it is edited
    read_then_edit(ctx, "run.sh", "old", "new")
    # Then it keeps its mode, and no temporary file is left beside it
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert script.read_text() == "echo new\n"
    assert sorted(p.name for p in workspace.iterdir()) == ["run.sh"]


@pytest.mark.spec("F1")
def test_edit_through_a_symlink_changes_the_target_and_keeps_the_link(
    workspace: Path, ctx: ToolContext
) -> None:
    (workspace / "real.txt").write_text("v1\n")
    (workspace / "link.txt").symlink_to("real.txt")
    read_then_edit(ctx, "link.txt", "v1", "v2")
    assert (workspace / "link.txt").is_symlink()
    assert (workspace / "real.txt").read_text() == "v2\n"


@pytest.mark.spec("F1")
def test_edit_preview_is_a_unified_diff(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "a.py").write_text("one\ntwo\nthree\n")
    read_whole(ctx, "a.py")
    diff = edit_tool.preview({"path": "a.py", "old_string": "two", "new_string": "2"}, ctx)
    assert diff == "--- a/a.py\n+++ b/a.py\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
    assert (workspace / "a.py").read_text() == "one\ntwo\nthree\n"  # a preview changes nothing


# --- F3: read before write -----------------------------------------------------------


@pytest.mark.spec("F3", "T4")
def test_F3_edit_of_a_file_never_read_is_refused_with_code_2(
    workspace: Path, ctx: ToolContext
) -> None:
    (workspace / "a.txt").write_text("x\n")
    verdict = edit_tool.validate({"path": "a.txt", "old_string": "x", "new_string": "y"}, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_NOT_READ)
    assert "Read it first" in verdict.message
    # validate is a self-check: it neither reads into the register nor writes (T4)
    assert len(ctx.files) == 0
    assert (workspace / "a.txt").read_text() == "x\n"


@pytest.mark.spec("F3")
def test_F3_partial_read_then_edit_is_refused_with_code_2(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given a file read only in part
    (workspace / "long.txt").write_text("a\nb\nc\n")
    read_tool.execute({"path": "long.txt", "limit": 2}, ctx)
    args = {"path": "long.txt", "old_string": "a", "new_string": "z"}
    # When it is edited, Then validate refuses with code 2
    verdict = edit_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_NOT_READ)
    assert "only partly read" in verdict.message
    # And so does execute, if called without validate
    with pytest.raises(ToolError, match=r"was only partly read") as caught:
        edit_tool.execute(args, ctx)
    assert caught.value.details == {
        "validation_code": CODE_NOT_READ,
        "partly_read": True,
        "read_first": {"path": "long.txt", "offset": 3, "limit": 1},
        "missing_lines": [[3, 3]],
        "total_lines": 3,
    }
    assert (
        caught.value.message
        == verdict.message
        == (
            "File long.txt was only partly read: line 3 of its 3 lines was never shown. "
            'Read it first: read(path="long.txt", offset=3, limit=1).'
        )
    )
    assert (workspace / "long.txt").read_text() == "a\nb\nc\n"


@pytest.mark.spec("F3")
def test_F3_external_change_after_read_is_refused_with_code_3(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given a file that was read, then changed by someone else
    path = workspace / "a.txt"
    path.write_text("mine\n")
    read_whole(ctx, "a.txt")
    path.write_text("theirs, longer\n")
    # When it is edited, Then it is refused with code 3
    verdict = edit_tool.validate({"path": "a.txt", "old_string": "t", "new_string": "T"}, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_STALE)
    assert verdict.message.startswith("File a.txt has been modified since it was read")


@pytest.mark.spec("F3")
@pytest.mark.parametrize("tool", ["edit", "write"])
def test_F3_a_change_between_validate_and_execute_is_refused_not_overwritten(
    workspace: Path, ctx: ToolContext, tool: str
) -> None:
    # Given a file read whole, and an edit (or write) that passes validate
    path = workspace / "a.txt"
    path.write_text("version 1\n")
    read_whole(ctx, "a.txt")
    if tool == "edit":
        chosen: Any = edit_tool
        args = {"path": "a.txt", "old_string": "version", "new_string": "v"}
    else:
        chosen = write_tool
        args = {"path": "a.txt", "content": "mine\n"}
    assert chosen.validate(args, ctx).ok
    # When the file changes before execute — same size, same mtime, so only the
    # content hash can tell
    st = path.stat()
    path.write_text("version 2\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # Then execute refuses with code 3, and the other change survives
    with pytest.raises(ToolError, match=r"changed since it was read") as caught:
        chosen.execute(args, ctx)
    assert caught.value.details == {"validation_code": CODE_STALE}
    assert path.read_text() == "version 2\n"


@pytest.mark.spec("F3")
def test_F3_a_file_that_appears_between_validate_and_execute_is_not_overwritten(
    workspace: Path, ctx: ToolContext
) -> None:
    args = {"path": "new.txt", "content": "mine\n"}
    assert write_tool.validate(args, ctx).ok  # does not exist yet: no read needed
    (workspace / "new.txt").write_text("someone else's\n")
    with pytest.raises(ToolError, match=r"has not been read") as caught:
        write_tool.execute(args, ctx)
    assert caught.value.details == {
        "validation_code": CODE_NOT_READ,
        "partly_read": False,
        "read_first": {"path": "new.txt"},
    }
    assert (workspace / "new.txt").read_text() == "someone else's\n"


# --- F9: a stale refusal shows what changed ---------------------------------------------


@pytest.fixture
def kept(workspace: Path, tmp_path: Path) -> ToolContext:
    """A context with a scratch directory, where read keeps its copies (F9)."""
    return tool_context(workspace, scratch_dir=tmp_path / "scratch")


def numbered(text: str) -> str:
    return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(text.splitlines(), start=1))


@pytest.mark.spec("F9", "F3")
def test_F9_a_small_file_changed_since_read_is_shown_whole_and_the_retry_needs_no_read(
    workspace: Path, kept: ToolContext
) -> None:
    # Given a small file read, then changed by someone else
    path = workspace / "app.py"
    path.write_text("def f():\n    return 1\n")
    read_whole(kept, "app.py")
    path.write_text("def f():\n    return 2  # theirs\n")
    # When the model edits it as it read it
    verdict = edit_tool.validate(
        {"path": "app.py", "old_string": "return 1", "new_string": "return 10"}, kept
    )
    # Then the refusal (code 3) shows the diff from its read and the whole file now
    assert (verdict.ok, verdict.code) == (False, CODE_STALE)
    assert verdict.message == (
        "File app.py has been modified since it was read, either by the user or by a "
        "linter.\n\n"
        "What changed since you read it:\n"
        "--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n def f():\n"
        "-    return 1\n+    return 2  # theirs\n\n"
        "It now reads (the whole file, 2 lines):\n"
        f"{numbered(path.read_text())}\n\n"
        "This counts as a read of the file as it is now: write against this content, "
        "with no need to read it again."
    )
    # And the corrected retry goes through without another read
    assert edit(kept, "app.py", "return 2  # theirs", "return 3").startswith("Edited app.py.")
    assert path.read_text() == "def f():\n    return 3\n"


@pytest.mark.spec("F9", "F3")
def test_F9_a_change_after_the_refusal_is_refused_again(workspace: Path, kept: ToolContext) -> None:
    path = workspace / "a.txt"
    path.write_text("one\n")
    read_whole(kept, "a.txt")
    path.write_text("two\n")
    first = edit_tool.validate({"path": "a.txt", "old_string": "one", "new_string": "1"}, kept)
    assert first.code == CODE_STALE and "It now reads (the whole file, 1 line):" in first.message
    # When the file changes once more before the retry
    path.write_text("three, theirs\n")
    # Then the retry is refused again, with what changed since the refusal showed it
    with pytest.raises(ToolError) as caught:
        edit(kept, "a.txt", "two", "2")
    assert caught.value.details == {"validation_code": CODE_STALE}
    assert "-two\n+three, theirs\n" in caught.value.message
    assert path.read_text() == "three, theirs\n"


@pytest.mark.spec("F9", "F3")
def test_F9_a_big_file_gets_a_bounded_diff_and_still_needs_a_read(
    workspace: Path, kept: ToolContext
) -> None:
    # Given a 400-line file read, then 100 lines changed by someone else
    path = workspace / "big.py"
    path.write_text("".join(f"line_{n} = {n}\n" for n in range(400)))
    read_whole(kept, "big.py")
    path.write_text("".join(f"line_{n} = {n * (2 if n < 100 else 1)}\n" for n in range(400)))
    # When it is edited
    args = {"path": "big.py", "old_string": "line_399 = 399", "new_string": "last = 399"}
    verdict = edit_tool.validate(args, kept)
    # Then the refusal shows the diff, cut, with a note — not the whole file
    assert verdict.code == CODE_STALE
    head, diff = verdict.message.split("\n\nWhat changed since you read it:\n")
    diff, advice = diff.rsplit("\n\n", 1)
    assert (
        head
        == "File big.py has been modified since it was read, either by the user or by a linter."
    )
    assert advice == "Read it again before writing to it."
    assert diff.startswith("--- a/big.py\n+++ b/big.py\n@@ -1,103 +1,103 @@\n line_0 = 0\n")
    shown, note = diff.rsplit("\n", 1)
    assert len(shown.splitlines()) <= MAX_DIFF_LINES
    assert len(shown) <= MAX_DIFF_CHARS
    assert note.startswith("[diff cut: ") and note.endswith(" more lines not shown]")
    assert "It now reads" not in verdict.message
    # And since the file was not shown whole, the retry still needs a read
    assert edit_tool.validate(args, kept).code == CODE_STALE
    read_whole(kept, "big.py")
    assert edit(kept, "big.py", "line_399 = 399", "last = 399").startswith("Edited big.py.")


@pytest.mark.spec("F9", "F3")
def test_F9_without_a_copy_a_big_file_gets_the_plain_refusal(
    workspace: Path, ctx: ToolContext
) -> None:
    # ctx has no scratch directory: read keeps no copy to diff against
    path = workspace / "big.txt"
    path.write_text("x\n" * 300)
    read_whole(ctx, "big.txt")
    path.write_text("y\n" * 300)
    verdict = write_tool.validate({"path": "big.txt", "content": "z\n"}, ctx)
    assert (verdict.code, verdict.message) == (
        CODE_STALE,
        "File big.txt has been modified since it was read, either by the user or by a "
        "linter. Read it again before writing to it.",
    )


@pytest.mark.spec("F9", "F3")
@pytest.mark.parametrize("tool", ["edit", "write"])
def test_F9_a_change_between_validate_and_execute_shows_what_changed_and_counts_as_a_read(
    workspace: Path, kept: ToolContext, tool: str
) -> None:
    # Given a file read whole, and a call that passed validate
    path = workspace / "a.txt"
    path.write_text("version 1\n")
    read_whole(kept, "a.txt")
    args: dict[str, Any]
    chosen: Any
    if tool == "edit":
        chosen, args = edit_tool, {"path": "a.txt", "old_string": "version", "new_string": "v"}
    else:
        chosen, args = write_tool, {"path": "a.txt", "content": "mine\n"}
    assert chosen.validate(args, kept).ok
    # When the file changes before execute (same size and mtime: only the hash tells)
    st = path.stat()
    path.write_text("version 2\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # Then execute refuses, showing the diff and the whole file, and writes nothing
    with pytest.raises(ToolError) as caught:
        chosen.execute(args, kept)
    assert caught.value.details == {"validation_code": CODE_STALE}
    assert caught.value.message == (
        "File a.txt changed since it was read (by the user, a linter or another program); "
        "nothing was written.\n\n"
        "What changed since you read it:\n"
        "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-version 1\n+version 2\n\n"
        "It now reads (the whole file, 1 line):\n     1\tversion 2\n\n"
        "This counts as a read of the file as it is now: write against this content, "
        "with no need to read it again."
    )
    assert path.read_text() == "version 2\n"
    # And the retry goes through without a read
    assert chosen.validate(args, kept).ok
    chosen.execute(args, kept)
    assert path.read_text() == ("v 2\n" if tool == "edit" else "mine\n")


@pytest.mark.spec("F9")
def test_F9_copies_are_content_addressed_private_and_bounded(
    workspace: Path, kept: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three files of 1,000 bytes read whole, one of them twice
    assert kept.scratch_dir is not None
    copies = kept.scratch_dir / read_copies.COPIES_DIR
    for name in ("a", "b", "c"):
        (workspace / name).write_text(name * 999 + "\n")
    read_whole(kept, "a")
    read_whole(kept, "a")
    read_whole(kept, "b")
    # Then each content is kept once, under its hash, readable by its owner only
    hashes = {content_hash((workspace / n).read_bytes()): n for n in "ab"}
    assert sorted(p.name for p in copies.iterdir()) == sorted(hashes)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in copies.iterdir())
    assert copies.stat().st_mode & 0o777 == 0o700
    assert read_copies.load(kept.scratch_dir, next(iter(hashes))) is not None
    # And past the bound the least recently kept copy goes first
    monkeypatch.setattr(read_copies, "MAX_COPIES_BYTES", 2500)
    os.utime(copies / next(h for h, n in hashes.items() if n == "a"), ns=(1, 1))
    read_whole(kept, "c")
    left = {hashes.get(p.name, "c") for p in copies.iterdir()}
    assert left == {"b", "c"}
    # A file over the copy limit gets none
    monkeypatch.setattr(read_copies, "MAX_COPY_BYTES", 10)
    (workspace / "d").write_text("d" * 20)
    read_whole(kept, "d")
    assert read_copies.load(kept.scratch_dir, content_hash(b"d" * 20)) is None


@pytest.mark.spec("F9")
def test_F9_keeping_a_copy_looks_at_the_others_only_when_the_bound_may_be_passed(
    workspace: Path, kept: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a process that has not kept a copy yet, counting its looks at the directory
    assert kept.scratch_dir is not None
    copies = kept.scratch_dir / read_copies.COPIES_DIR
    monkeypatch.setattr(read_copies, "_seen", {})
    looks: list[int] = []
    evict = read_copies._evict

    def counted(directory: Path) -> int:
        looks.append(len(list(directory.iterdir())))
        return evict(directory)

    monkeypatch.setattr(read_copies, "_evict", counted)
    # When it keeps twenty copies far below the bound
    for i in range(20):
        (workspace / f"f{i}").write_text(f"{i}\n" * 100)
        read_whole(kept, f"f{i}")
    # Then it looked once, at its first copy, not once per copy
    assert looks == [1]
    # And copies another process of the session keeps meanwhile are seen once this
    # process has kept RESCAN_BYTES since its last look: the bound holds within that
    monkeypatch.setattr(read_copies, "MAX_COPIES_BYTES", 12_000)
    monkeypatch.setattr(read_copies, "RESCAN_BYTES", 1_000)
    others = [copies / content_hash(f"other {i}".encode()) for i in range(10)]
    for other in others:  # another worker's 10,000 bytes, the least recently kept
        other.write_bytes(b"x" * 1_000)
        os.utime(other, ns=(1, 1))
    for i in range(20, 24):  # 300 bytes each
        (workspace / f"f{i}").write_text(f"{i}\n" * 100)
        read_whole(kept, f"f{i}")
    # f20 looks (5,100 bytes kept since the first look), finds 15,300 and evicts to
    # 11,300; f21 and f22 fit; f23 would pass 12,000 and looks again
    assert len(looks) == 3
    total = sum(p.stat().st_size for p in copies.iterdir())
    assert total <= read_copies.MAX_COPIES_BYTES
    left = {p.name for p in copies.iterdir()}
    mine = {content_hash((workspace / f"f{i}").read_bytes()) for i in range(24)}
    assert mine <= left  # the most recently kept stay
    assert sum(other.name in left for other in others) == 5  # the oldest went first


@pytest.mark.spec("F9")
def test_F9_copies_are_kept_again_after_the_directory_was_removed(
    workspace: Path, kept: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a copy kept, then its directory removed under the process's feet
    assert kept.scratch_dir is not None
    monkeypatch.setattr(read_copies, "_seen", {})
    (workspace / "a").write_text("one\n")
    read_whole(kept, "a")
    copies = kept.scratch_dir / read_copies.COPIES_DIR
    for p in copies.iterdir():
        p.unlink()
    copies.rmdir()
    # When another file is read whole: no error reaches the model, nothing is kept
    (workspace / "b").write_text("two\n")
    assert "two" in read_whole(kept, "b")
    # Then the next whole read makes the directory anew and keeps its copy
    (workspace / "c").write_text("three\n")
    read_whole(kept, "c")
    assert read_copies.load(kept.scratch_dir, content_hash(b"three\n")) == b"three\n"


# --- F5: the stamp is renewed ---------------------------------------------------------


@pytest.mark.spec("F5")
def test_F5_after_an_edit_the_next_edit_needs_no_read(workspace: Path, ctx: ToolContext) -> None:
    # Given a file read and edited once
    path = workspace / "a.py"
    path.write_text("a = 1\nb = 2\n")
    read_then_edit(ctx, "a.py", "a = 1", "a = 10")
    # Then the register describes the new content, whole and fresh
    stamp = ctx.files.get(path)
    assert stamp is not None
    assert stamp.content_hash == content_hash(path.read_bytes())
    assert not stamp.partial
    assert stamp.mtime_ns == path.stat().st_mtime_ns
    assert ctx.files.freshness(path) is Freshness.FRESH
    # And a second edit goes through without another read
    edit(ctx, "a.py", "b = 2", "b = 20")
    assert path.read_text() == "a = 10\nb = 20\n"


@pytest.mark.spec("F5")
def test_F5_after_a_write_an_edit_needs_no_read(workspace: Path, ctx: ToolContext) -> None:
    write_tool.execute({"path": "pkg/new.py", "content": "x = 1\n"}, ctx)
    edit(ctx, "pkg/new.py", "x = 1", "x = 2")
    assert (workspace / "pkg" / "new.py").read_text() == "x = 2\n"


# --- write ---------------------------------------------------------------------------


@pytest.mark.spec("F1", "F3")
def test_write_creates_a_new_file_and_its_directories_without_a_read(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given a path that does not exist, in directories that do not exist
    args = {"path": "src/pkg/mod.py", "content": "print('hi')\n"}
    # When it is written, Then no read was needed, and parents were created
    assert write_tool.validate(args, ctx).ok
    assert write_tool.preview(args, ctx) == (
        "--- /dev/null\n+++ b/src/pkg/mod.py\n@@ -0,0 +1 @@\n+print('hi')\n"
    )
    out = write_tool.execute(args, ctx)
    assert out == "Created src/pkg/mod.py (1 line, 12 bytes)."
    path = workspace / "src" / "pkg" / "mod.py"
    assert path.read_text() == "print('hi')\n"
    # And the new file gets the usual mode: 0o666 less the umask
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


@pytest.mark.spec("F3")
def test_F3_write_over_an_unread_file_is_refused_then_allowed_after_a_read(
    workspace: Path, ctx: ToolContext
) -> None:
    path = workspace / "notes.md"
    path.write_text("keep me\n")
    args = {"path": "notes.md", "content": "replaced\n"}
    verdict = write_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_NOT_READ)
    read_whole(ctx, "notes.md")
    assert write_tool.validate(args, ctx).ok
    assert write_tool.execute(args, ctx) == "Replaced the content of notes.md (1 line, 9 bytes)."
    assert path.read_text() == "replaced\n"


@pytest.mark.spec("F1")
def test_write_preview_diffs_from_the_old_content_and_keeps_the_mode(
    workspace: Path, ctx: ToolContext
) -> None:
    path = workspace / "tool.sh"
    path.write_text("echo 1\necho 2\n")
    path.chmod(0o700)
    read_whole(ctx, "tool.sh")
    args = {"path": "tool.sh", "content": "echo 1\necho two"}
    assert write_tool.preview(args, ctx) == (
        "--- a/tool.sh\n+++ b/tool.sh\n@@ -1,2 +1,2 @@\n echo 1\n-echo 2\n+echo two\n"
        "\\ No newline at end of file\n"
    )
    write_tool.execute(args, ctx)
    assert path.read_text() == "echo 1\necho two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


@pytest.mark.spec("F1")
def test_write_refuses_a_directory(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "src").mkdir()
    verdict = write_tool.validate({"path": "src", "content": "x"}, ctx)
    assert not verdict.ok
    assert verdict.message == "src exists and is not a file."


@pytest.mark.spec("F1", "T2", "T3")
@pytest.mark.parametrize(
    ("tool", "label", "activity"),
    [(edit_tool, "Edit", "Editing a.txt"), (write_tool, "Write", "Writing a.txt")],
)
def test_edit_and_write_are_neither_read_only_nor_safe(
    workspace: Path, tool: Any, label: str, activity: str
) -> None:
    spec = ToolSpec(tool)
    args = {"path": "a.txt"}
    assert not spec.read_only(args)
    assert not spec.concurrency_safe(args)
    assert spec.has_preview
    assert spec.label() == label
    assert spec.activity(args) == activity
    assert spec.permissions == ("write",)
    assert spec.file_paths(args, tool_context(workspace)) == [workspace.resolve() / "a.txt"]


# --- F9 through a real daemon ----------------------------------------------------------


@pytest.mark.spec("F9", "F3", "D1")
def test_F9_stale_refusals_through_a_daemon_across_two_workers(
    tmp_path: Path, workspace: Path
) -> None:
    big = workspace / "big.py"
    big.write_text("".join(f"v{n} = {n}\n" for n in range(300)))
    small = workspace / "small.txt"
    small.write_text("mine\n")

    def approve(request: ApprovalRequested) -> bool:
        # The user's editor saves the file while the edit waits for approval: the
        # change lands between validate (in one worker) and execute (in another)
        if request.call.id == "e1":
            big.write_text(big.read_text().replace("v150 = 150", "v150 = 'theirs'"))
        return True

    # Every call on a worker of its own: the edit cannot run where the read ran.
    flags = ("--min-workers", "2", "--max-workers", "2", "--max-calls-per-worker", "1")
    with (
        running_daemon(tmp_path, *flags) as daemon,
        Client(runtime_dir=daemon.runtime, timeout=30) as client,
        client.session(workspace, gate="ask", on_approval=approve) as session,
    ):
        (read,) = session.submit([ToolCall("r", "read", {"path": "big.py"})]).results()
        edit_args = {"path": "big.py", "old_string": "v1 = 1\n", "new_string": "one = 1\n"}
        (refused,) = session.submit([ToolCall("e1", "edit", edit_args)]).results()
        # The edit ran on another worker: it found the read's copy, and shows the diff
        assert read.details["worker"] != refused.details["worker"]
        assert refused.details["validation_code"] == CODE_STALE
        assert refused.text.startswith(
            "File big.py changed since it was read (by the user, a linter or another "
            "program); nothing was written.\n\nWhat changed since you read it:\n"
            "--- a/big.py\n+++ b/big.py\n@@ -148,7 +148,7 @@\n"
        )
        assert "\n-v150 = 150\n+v150 = 'theirs'\n" in refused.text
        assert refused.text.endswith("\n\nRead it again before writing to it.")
        # A small file changed since its read: shown whole by validate (in a worker),
        # and the retry, on another worker, needs no read
        session.submit([ToolCall("r2", "read", {"path": "small.txt"})]).results()
        small.write_text("theirs\n")
        stale, retry = session.submit(
            [
                ToolCall(
                    "e2", "edit", {"path": "small.txt", "old_string": "mine", "new_string": "x"}
                ),
                ToolCall(
                    "e3",
                    "edit",
                    {"path": "small.txt", "old_string": "theirs", "new_string": "ours"},
                ),
            ]
        ).results()
    assert stale.details["validation_code"] == CODE_STALE
    assert "-mine\n+theirs\n" in stale.text
    assert "It now reads (the whole file, 1 line):\n     1\ttheirs\n" in stale.text
    assert not retry.is_error, retry.text
    assert small.read_text() == "ours\n"
