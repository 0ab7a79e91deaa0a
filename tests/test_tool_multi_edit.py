"""multi_edit: several exact replacements in one file, in order, written once, all or
none; edit's guard (F3, F5), edit's messages with the failing edit's index, edit's
preview (P7)."""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path
from typing import Any

import pytest

from toolpool import ToolError
from toolpool.file_reads import content_hash
from toolpool.registry import ToolSpec
from toolpool.tool import ToolContext
from toolpool.tools.multi_edit import multi_edit_tool
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE

from .tool_support import read_whole, tool_context


def edits(*pairs: tuple[str, str] | tuple[str, str, bool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pair in pairs:
        edit: dict[str, Any] = {"old_string": pair[0], "new_string": pair[1]}
        if len(pair) == 3:
            edit["replace_all"] = pair[2]
        out.append(edit)
    return out


def multi_edit(ctx: ToolContext, path: str, *pairs: Any) -> str:
    """Validate, then execute, as the pipeline does (preview aside)."""
    args = {"path": path, "edits": edits(*pairs)}
    verdict = multi_edit_tool.validate(args, ctx)
    if not verdict.ok:
        raise ToolError(verdict.message, details={"validation_code": verdict.code})
    return multi_edit_tool.execute(args, ctx)


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return tool_context(workspace)


@pytest.mark.spec("F10")
def test_edits_apply_in_order_each_to_the_text_the_ones_before_left(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given a file that was read
    (workspace / "app.py").write_text("def f():\n    return 1\n\nx = f()\nprint(x)\n")
    read_whole(ctx, "app.py")
    # When the second edit matches only what the first one wrote, and the third
    # renames everywhere
    out = multi_edit(
        ctx,
        "app.py",
        ("return 1", "return helper()"),
        ("return helper()", "return helper() + 1"),
        ("x", "value", True),
    )
    # Then all three applied, in order, and the file was written once with the result
    assert (workspace / "app.py").read_text() == (
        "def f():\n    return helper() + 1\n\nvalue = f()\nprint(value)\n"
    )
    assert out == (
        "Edited app.py: 3 edits applied in order (edits[0] at line 2, edits[1] at line 2, "
        "edits[2] at 2 places)."
    )


@pytest.mark.spec("F10")
@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        # the third edit's text is not in the file at all
        (
            (("a = 1", "a = 2"), ("b = 2", "b = 3"), ("zzz", "y")),
            r"^edits\[2\]: old_string was not found in m.py\. Read",
        ),
        # the second is ambiguous
        (
            (("a = 1", "a = 2"), ("= 2", "= 9")),
            r"^edits\[1\]: old_string occurs 2 times in m.py \(lines 1, 2\)",
        ),
        # the second looks for what the first replaced
        (
            (("a = 1", "a = 10"), ("a = 1\n", "a = 5\n")),
            r"^edits\[1\]: old_string was not found.*"
            r"It was in the file before edits\[0\] changed it",
        ),
        # whitespace near miss, as edit reports it
        (
            (("a = 1", "a = 2"), ("b  =  2", "b = 3")),
            r"^edits\[1\]: .*except for whitespace or indentation, at line 2",
        ),
    ],
)
def test_a_failing_edit_is_named_by_its_index_and_nothing_is_written(
    workspace: Path, ctx: ToolContext, pairs: Any, message: str
) -> None:
    # Given a file read whole, its bytes and mtime noted
    path = workspace / "m.py"
    path.write_text("a = 1\nb = 2\n")
    read_whole(ctx, "m.py")
    before = path.stat()
    # When a later edit fails
    with pytest.raises(ToolError) as caught:
        multi_edit(ctx, "m.py", *pairs)
    # Then the error names it, and the earlier edits were not written either
    assert re.search(message, caught.value.message, re.S), caught.value.message
    assert path.read_text() == "a = 1\nb = 2\n"
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in workspace.iterdir()) == ["m.py"]


@pytest.mark.spec("F10", "T4")
@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ((("a", "b"), ("same", "same")), "edits[1]: old_string and new_string are the same"),
        ((("", "text"),), "edits[0]: old_string is empty. To create a file"),
    ],
)
def test_pointless_edits_are_refused_in_validate_by_index(
    workspace: Path, ctx: ToolContext, pairs: Any, message: str
) -> None:
    (workspace / "a.txt").write_text("a same\n")
    read_whole(ctx, "a.txt")
    verdict = multi_edit_tool.validate({"path": "a.txt", "edits": edits(*pairs)}, ctx)
    assert not verdict.ok
    assert verdict.message.startswith(message)


@pytest.mark.spec("F10")
def test_the_schema_asks_for_at_least_one_edit_and_known_keys() -> None:
    spec = ToolSpec(multi_edit_tool)
    assert not spec.checker.check({"path": "a", "edits": []}).ok
    assert not spec.checker.check(
        {"path": "a", "edits": [{"old_string": "a", "new_string": "b", "extra": 1}]}
    ).ok
    assert spec.checker.check({"path": "a", "edits": [{"old_string": "a", "new_string": "b"}]}).ok


@pytest.mark.spec("F10")
def test_a_missing_file_points_to_write(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "config.toml").write_text("")
    verdict = multi_edit_tool.validate({"path": "config.tml", "edits": edits(("a", "b"))}, ctx)
    assert verdict.message == (
        "File does not exist: config.tml. Did you mean config.toml? multi_edit changes "
        "existing files; to create one, use write."
    )


@pytest.mark.spec("F10")
def test_crlf_and_bom_are_kept(workspace: Path, ctx: ToolContext) -> None:
    # Given a CRLF file with a byte order mark
    (workspace / "win.txt").write_bytes(codecs.BOM_UTF8 + b"first\r\nsecond\r\nthird\r\n")
    read_whole(ctx, "win.txt")
    # When the model edits across line breaks, writing \n
    multi_edit(ctx, "win.txt", ("first\nsecond", "1st\n2nd"), ("third", "3rd\nextra"))
    # Then every line still ends in CRLF, and the BOM stays
    assert (workspace / "win.txt").read_bytes() == (
        codecs.BOM_UTF8 + b"1st\r\n2nd\r\n3rd\r\nextra\r\n"
    )


@pytest.mark.spec("P7", "H3")
def test_the_preview_is_the_unified_diff_of_the_whole_change(
    workspace: Path, ctx: ToolContext
) -> None:
    (workspace / "a.py").write_text("one\ntwo\nthree\nfour\n")
    read_whole(ctx, "a.py")
    args = {"path": "a.py", "edits": edits(("two", "2"), ("four", "4"))}
    diff = multi_edit_tool.preview(args, ctx)
    assert diff == "--- a/a.py\n+++ b/a.py\n@@ -1,4 +1,4 @@\n one\n-two\n+2\n three\n-four\n+4\n"
    assert (workspace / "a.py").read_text() == "one\ntwo\nthree\nfour\n"  # nothing written


@pytest.mark.spec("F3")
def test_F3_a_file_not_read_is_refused_with_code_2(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "a.txt").write_text("x\n")
    args = {"path": "a.txt", "edits": edits(("x", "y"))}
    verdict = multi_edit_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_NOT_READ)
    with pytest.raises(ToolError, match=r"has not been read") as caught:
        multi_edit_tool.execute(args, ctx)
    assert caught.value.details["validation_code"] == CODE_NOT_READ
    assert caught.value.details["read_first"] == {"path": "a.txt"}
    assert (workspace / "a.txt").read_text() == "x\n"


@pytest.mark.spec("F3")
def test_F3_a_change_between_validate_and_execute_is_refused_with_code_3(
    workspace: Path, ctx: ToolContext
) -> None:
    path = workspace / "a.txt"
    path.write_text("version 1\n")
    read_whole(ctx, "a.txt")
    args = {"path": "a.txt", "edits": edits(("version", "v"), ("1", "one"))}
    assert multi_edit_tool.validate(args, ctx).ok
    st = path.stat()
    path.write_text("version 2\n")  # same size and mtime: only the hash can tell
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ToolError, match=r"changed since it was read") as caught:
        multi_edit_tool.execute(args, ctx)
    assert caught.value.details == {"validation_code": CODE_STALE}
    assert path.read_text() == "version 2\n"


@pytest.mark.spec("F5")
def test_F5_after_a_multi_edit_the_next_one_needs_no_read(
    workspace: Path, ctx: ToolContext
) -> None:
    path = workspace / "a.py"
    path.write_text("a = 1\nb = 2\n")
    read_whole(ctx, "a.py")
    multi_edit(ctx, "a.py", ("a = 1", "a = 10"))
    stamp = ctx.files.get(path)
    assert stamp is not None and not stamp.partial
    assert stamp.content_hash == content_hash(path.read_bytes())
    multi_edit(ctx, "a.py", ("b = 2", "b = 20"), ("a = 10", "a = 11"))
    assert path.read_text() == "a = 11\nb = 20\n"


@pytest.mark.spec("X4")
def test_paths_are_confined_like_edit(workspace: Path, outside: Path, ctx: ToolContext) -> None:
    (workspace / "out").symlink_to(outside)
    for raw in ("../outside/secret.txt", str(outside / "secret.txt"), "out/secret.txt"):
        verdict = multi_edit_tool.validate({"path": raw, "edits": edits(("top", "x"))}, ctx)
        assert verdict.message.startswith("Access denied"), raw
        with pytest.raises(ToolError, match="Access denied"):
            multi_edit_tool.execute({"path": raw, "edits": edits(("top", "x"))}, ctx)
    assert (outside / "secret.txt").read_text() == "top secret\n"


@pytest.mark.spec("F10", "S1")
def test_it_declares_what_edit_declares() -> None:
    from toolpool.tools import edit_tool

    spec, edit_spec = ToolSpec(multi_edit_tool), ToolSpec(edit_tool)
    args = {"path": "a", "edits": edits(("a", "b"))}
    edit_args = {"path": "a", "old_string": "a", "new_string": "b"}
    assert spec.read_only(args) is edit_spec.read_only(edit_args) is False
    assert spec.concurrency_safe(args) is edit_spec.concurrency_safe(edit_args) is False
    assert spec.interrupt_behavior(args) == edit_spec.interrupt_behavior(edit_args)
    assert multi_edit_tool.permissions() == ["write"]
