"""Paths in tool messages (SPEC E4): workspace-relative inside the workspace, however
the model spelled them, absolute outside it (extra roots, the scratch dir, a refused
target), and never a form that names another file."""

from __future__ import annotations

import base64
import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolpool import FileReadRegister, ToolContext, ToolError
from toolpool.cancel import CancelToken
from toolpool.tools import bash, edit_tool, glob_tool, grep_tool, ls_tool, read_tool, write_tool
from toolpool.tools.support.paths import display_in, quote

from .tool_support import read_whole, text, tool_context

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def outcome(tool: Any, args: dict[str, Any], ctx: ToolContext) -> str:
    """What the model reads of a call: validate's refusal, or execute's text or error."""
    validate = getattr(tool, "validate", None)
    if validate is not None:
        verdict = validate(args, ctx)
        if not verdict.ok:
            return str(verdict.message)
    try:
        return text(tool.execute(args, ctx))
    except ToolError as exc:
        return exc.message


def make_tree(root: Path) -> None:
    sub = root / "sub"
    sub.mkdir()
    (sub / "a.txt").write_text("alpha\nbeta\n")
    (sub / "empty.txt").write_text("")
    (sub / "bin.dat").write_bytes(b"\0\1\2")
    (sub / "logo.png").write_bytes(PNG)


BETA = {"old_string": "beta", "new_string": "b"}
# (tool, arguments with {p} for the spelled path of sub/<name>, the file's name, what
# the message says with {shown} for the path as displayed)
CASES = [
    ("read", {"path": "{p}"}, "nope.txt", "Path does not exist: {shown}."),
    ("read", {"path": "{p}"}, "bin.dat", "{shown} is a binary file"),
    ("read", {"path": "{p}"}, "empty.txt", "{shown} is empty."),
    ("read", {"path": "{p}"}, "logo.png", "Image {shown} (image/png"),
    ("read", {"path": "{p}", "offset": 9}, "a.txt", "{shown} has 2 lines; offset 9"),
    ("read", {"path": "{p}"}, "", "{shown} is a directory with 4 entries"),
    ("ls", {"path": "{p}"}, "a.txt", "{shown} is a file, not a directory"),
    ("ls", {"path": "{p}"}, "nope", "Path does not exist: {shown}."),
    ("ls", {"path": "{p}"}, "", "{shown}/\n"),
    ("glob", {"pattern": "*.rs", "path": "{p}"}, "", "No files match *.rs in {shown}."),
    ("glob", {"pattern": "*.txt", "path": "{p}"}, "a.txt", "{shown} is a file, not a directory"),
    ("glob", {"pattern": "a.*", "path": "{p}"}, "", "{shown}/a.txt"),
    ("grep", {"pattern": "zeta", "path": "{p}"}, "", "No matches for zeta in {shown}."),
    ("grep", {"pattern": "beta", "path": "{p}"}, "", "Found 1 file\n{shown}/a.txt"),
    ("grep", {"pattern": "beta", "path": "{p}"}, "a.txt", "Found 1 file\n{shown}"),
    ("grep", {"pattern": "beta", "path": "{p}", "output_mode": "count"}, "", "{shown}/a.txt:1"),
    ("grep", {"pattern": "beta", "path": "{p}", "output_mode": "content"}, "a.txt",
     "{shown}:2:beta"),
    ("grep", {"pattern": "beta", "path": "{p}"}, "nope", "Path does not exist: {shown}."),
    ("edit", {"path": "{p}", **BETA}, "a.txt", "File {shown} has not been read yet."),
    ("edit", {"path": "{p}", **BETA}, "nope.txt", "File does not exist: {shown}."),
    ("edit", {"path": "{p}", **BETA}, "", "{shown} is not a regular file."),
    ("write", {"path": "{p}", "content": "new\n"}, "a.txt", "File {shown} has not been read yet."),
    ("write", {"path": "{p}", "content": "new\n"}, "", "{shown} exists and is not a file."),
    ("write", {"path": "{p}", "content": "new\n"}, "new.txt", "Created {shown} (1 line, 4 bytes)."),
]  # fmt: skip
TOOLS = {t.name: t for t in (read_tool, ls_tool, glob_tool, grep_tool, edit_tool, write_tool)}


def _call(case: tuple[str, dict[str, Any], str, str], spelled: str) -> tuple[Any, dict[str, Any]]:
    name, args, _, _ = case
    return TOOLS[name], {k: spelled if v == "{p}" else v for k, v in args.items()}


@pytest.mark.spec("E4")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2] or 'dir'}-{c[3][:24]}")
@pytest.mark.parametrize("spelling", ["relative", "absolute", "out-and-back"])
def test_a_message_names_a_workspace_path_relative_to_it(
    workspace: Path, case: tuple[str, dict[str, Any], str, str], spelling: str
) -> None:
    # Given a file under the workspace, spelled relative, absolute, or by a ".." out
    # of the workspace and back in
    make_tree(workspace)
    relative = "sub/" + case[2] if case[2] else "sub"
    spelled = {
        "relative": relative,
        "absolute": str(workspace.resolve() / relative),
        "out-and-back": f"../{workspace.name}/{relative}",
    }[spelling]
    ctx = tool_context(workspace)
    tool, args = _call(case, spelled)
    # When the tool answers
    message = outcome(tool, args, ctx)
    # Then the message names the path relative to the workspace, never absolute
    assert case[3].format(shown=relative) in message
    assert str(workspace.resolve()) not in message


@pytest.mark.spec("E4")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2] or 'dir'}-{c[3][:24]}")
def test_a_message_names_a_path_in_an_extra_root_absolutely(
    workspace: Path, tmp_path: Path, case: tuple[str, dict[str, Any], str, str]
) -> None:
    # Given the same tree in an extra root, outside the workspace
    extra = tmp_path / "extra"
    extra.mkdir()
    make_tree(extra)
    relative = "sub/" + case[2] if case[2] else "sub"
    absolute = str(extra.resolve() / relative)
    ctx = tool_context(workspace, extra_roots=[extra])
    tool, args = _call(case, absolute)
    # When the tool answers, the message names it by its absolute path
    assert case[3].format(shown=absolute) in outcome(tool, args, ctx)


@pytest.mark.spec("E4")
def test_read_before_write_refusals_and_summaries_are_relative(workspace: Path) -> None:
    # Given a file read only in part, then whole, then changed behind the model's back
    make_tree(workspace)
    ctx = tool_context(workspace)
    absolute = str(workspace.resolve() / "sub/a.txt")
    read_tool.execute({"path": absolute, "limit": 1}, ctx)
    edit = {"path": absolute, "old_string": "beta", "new_string": "gamma"}
    assert "File sub/a.txt was only partly read" in outcome(edit_tool, edit, ctx)
    read_whole(ctx, absolute)
    (workspace / "sub/a.txt").write_text("alpha\nbeta\nmore\n")
    assert "File sub/a.txt has been modified since it was read" in outcome(edit_tool, edit, ctx)
    # (validate passed, then the file changed before execute: the execute-time check)
    read_whole(ctx, absolute)
    assert edit_tool.validate(edit, ctx).ok
    (workspace / "sub/a.txt").write_text("alpha\nbeta\nagain\n")
    with pytest.raises(ToolError, match=r"^File sub/a.txt changed since it was read"):
        edit_tool.execute(edit, ctx)
    # When it is read again and edited, the preview, the summary and old_string's
    # refusal name it relative to the workspace too
    read_whole(ctx, absolute)
    preview = edit_tool.preview(edit, ctx)
    assert preview.startswith("--- a/sub/a.txt\n+++ b/sub/a.txt\n")
    assert outcome(edit_tool, edit, ctx).startswith("Edited sub/a.txt. Lines 1-3 now read:")
    missing = {"path": absolute, "old_string": "delta", "new_string": "x"}
    assert "old_string was not found in sub/a.txt." in outcome(edit_tool, missing, ctx)
    write = {"path": absolute, "content": "new\n"}
    assert write_tool.preview(write, ctx).startswith("--- a/sub/a.txt\n+++ b/sub/a.txt\n")
    assert outcome(write_tool, write, ctx) == "Replaced the content of sub/a.txt (1 line, 4 bytes)."
    new = {"path": str(workspace.resolve() / "made.txt"), "content": "x\n"}
    assert write_tool.preview(new, ctx).startswith("--- /dev/null\n+++ b/made.txt\n")


@pytest.mark.spec("E4")
def test_previews_and_refusals_in_an_extra_root_are_absolute(
    workspace: Path, tmp_path: Path
) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    target = extra.resolve() / "notes.txt"
    target.write_text("one\n")
    ctx = tool_context(workspace, extra_roots=[extra])
    edit = {"path": str(target), "old_string": "one", "new_string": "two"}
    assert outcome(edit_tool, edit, ctx).startswith(f"File {target} has not been read yet.")
    read_whole(ctx, str(target))
    # The diff header names an absolute path as it is, with no a/ or b/ before it
    assert edit_tool.preview(edit, ctx).startswith(f"--- {target}\n+++ {target}\n")
    assert outcome(edit_tool, edit, ctx).startswith(f"Edited {target}.")


@pytest.mark.spec("E4")
def test_refusals_of_paths_that_lead_out_name_the_spelling_and_the_target(
    workspace: Path, outside: Path
) -> None:
    # Given a symlink in the workspace that points outside it
    secret = outside / "secret.txt"
    (workspace / "sub").mkdir()
    (workspace / "sub/link").symlink_to(secret)
    ctx = tool_context(workspace)
    for spelled in ("sub/link", str(workspace / "sub/link"), str(workspace.resolve() / "sub/link")):
        # When a tool is pointed at it, however spelled
        message = outcome(read_tool, {"path": spelled}, ctx)
        # Then the refusal names the link relative to the workspace, the target absolutely
        assert message.startswith(
            f"Access denied: sub/link is a symlink (or lies under one) that points outside, "
            f"to {secret.resolve()}."
        )
    # And a path spelled out of the workspace is named as the model wrote it
    message = outcome(read_tool, {"path": "sub/../../x"}, ctx)
    assert message.startswith("Access denied: sub/../../x resolves to ")


@pytest.mark.spec("E4")
def test_a_workspace_that_is_a_symlink_still_gives_relative_paths(tmp_path: Path) -> None:
    # Given a workspace reached through a symlink (the session names the link)
    real = tmp_path / "real"
    real.mkdir()
    make_tree(real)
    link = tmp_path / "ws-link"
    link.symlink_to(real)
    ctx = ToolContext(
        call_id="call",
        tool_name="tool",
        session_id="session",
        workspace=link,
        files=FileReadRegister(),
        cancel_token=CancelToken(),
    )
    # Then every spelling of its files is named relative to it
    for spelled in ("sub/a.txt", str(link / "sub/a.txt"), str(real.resolve() / "sub/a.txt")):
        edit = {"path": spelled, "old_string": "beta", "new_string": "b"}
        assert outcome(edit_tool, edit, ctx).startswith("File sub/a.txt has not been read yet.")
        assert outcome(read_tool, {"path": spelled + "x"}, ctx).startswith(
            "Path does not exist: sub/a.txtx."
        )
    assert outcome(glob_tool, {"pattern": "a.txt"}, ctx) == "sub/a.txt"


@pytest.mark.spec("E4")
def test_the_spill_file_of_bash_is_named_absolutely(workspace: Path, tmp_path: Path) -> None:
    # Given a command whose output is cut: its full output is in the scratch dir
    ctx = tool_context(workspace, scratch_dir=tmp_path / "scratch")
    result = bash.execute({"command": "head -c 40000 /dev/zero | tr '\\0' x"}, ctx)
    last = result.splitlines()[-1]
    assert last.startswith("Full output (40000 characters): ")
    spill = Path(last.removeprefix("Full output (40000 characters): "))
    assert spill.is_absolute()
    assert spill.is_relative_to((tmp_path / "scratch").resolve())
    assert spill.read_text() == "x" * 40000


# A name, how a path to it in d/ is shown, how ls shows the name alone.
WEIRD = [
    ("we\nird.txt", '"d/we\\nird.txt"', '"we\\nird.txt"'),
    ("tab\there.txt", '"d/tab\\there.txt"', '"tab\\there.txt"'),
    ("rtl\u202etxt.exe", '"d/rtl\\u202etxt.exe"', '"rtl\\u202etxt.exe"'),
    # a leading space is only ambiguous at the start of a line (ls's indentation)
    (" lead.txt", "d/ lead.txt", '" lead.txt"'),
    ("trail.txt ", '"d/trail.txt "', '"trail.txt "'),
    # a quote is only ambiguous where a quoted form could start
    ('"quoted".txt', 'd/"quoted".txt', '"\\"quoted\\".txt"'),
    # a backslash is shown as it is: only a quoted form has escapes
    ("a\\n.txt", "d/a\\n.txt", "a\\n.txt"),
]


@pytest.mark.spec("E4")
@pytest.mark.parametrize(("name", "shown", "entry"), WEIRD)
def test_a_name_that_could_read_as_another_is_quoted_everywhere(
    workspace: Path, name: str, shown: str, entry: str
) -> None:
    # Given a file whose name holds a newline, a tab, a bidi override, space at an
    # end, a quote, or a backslash
    (workspace / "d").mkdir()
    (workspace / "d" / name).write_text("needle\n")
    (workspace / "d" / "plain.txt").write_text("needle\n")
    ctx = tool_context(workspace)
    assert quote(f"d/{name}") == shown
    assert quote(name) == entry
    # Then every tool names it by one form, on one line, that is not any other name
    files = outcome(grep_tool, {"pattern": "needle"}, ctx).splitlines()
    assert sorted(files[1:]) == sorted([shown, "d/plain.txt"])
    counts = outcome(grep_tool, {"pattern": "needle", "output_mode": "count"}, ctx)
    assert sorted(counts.splitlines()[1:]) == sorted([f"{shown}:1", "d/plain.txt:1"])
    content = outcome(grep_tool, {"pattern": "needle", "output_mode": "content", "-C": 1}, ctx)
    assert sorted(content.splitlines()) == sorted(
        ["--", f"{shown}:1:needle", "d/plain.txt:1:needle"]
    )
    assert sorted(outcome(glob_tool, {"pattern": "*"}, ctx).splitlines()) == sorted(
        [shown, "d/plain.txt"]
    )
    listing = outcome(ls_tool, {"path": "d"}, ctx).splitlines()
    assert listing[0] == "d/"
    assert sorted(listing[1:]) == sorted([f"  {entry}", "  plain.txt"])
    spelled = f"d/{name}"
    edit = {"path": spelled, "old_string": "needle", "new_string": "pin"}
    assert outcome(edit_tool, edit, ctx).startswith(f"File {shown} has not been read yet.")
    read_whole(ctx, spelled)
    assert edit_tool.preview(edit, ctx).splitlines()[0] == (
        f'--- "a/{shown[1:]}' if shown.startswith('"') else f"--- a/{shown}"
    )
    assert outcome(edit_tool, edit, ctx).startswith(f"Edited {shown}.")


@pytest.mark.spec("E4")
def test_a_name_that_is_not_utf8_is_shown_escaped(workspace: Path) -> None:
    # Given a file whose name is not UTF-8
    os.makedirs(workspace / "d")
    with open(os.path.join(os.fsencode(workspace / "d"), b"caf\xe9.txt"), "w") as f:
        f.write("x\n")
    ctx = tool_context(workspace)
    # Then ls names it with the byte escaped, in text that can be sent
    listing = outcome(ls_tool, {"path": "d"}, ctx)
    assert listing == 'd/\n  "caf\\udce9.txt"'
    listing.encode("utf-8")


@pytest.mark.spec("E4")
def test_a_spelling_with_a_newline_is_quoted_in_its_refusal(workspace: Path) -> None:
    ctx = tool_context(workspace)
    message = outcome(read_tool, {"path": "../x\nPath does not exist: a.txt"}, ctx)
    assert message.startswith('Access denied: "../x\\nPath does not exist: a.txt" resolves to')
    assert "\n" not in message


@pytest.mark.spec("E4")
@given(
    st.lists(st.sampled_from(["a", "b", "ab", " c", "d\n", "é", ".x", "-"]), max_size=4),
    st.lists(st.sampled_from(["a", "b", "ab", " c", "d\n", "é", ".x", "-"]), max_size=4),
)
def test_E4_a_path_is_named_against_the_workspace_as_its_parts_say(
    workspace_parts: list[str], path_parts: list[str]
) -> None:
    # Given a workspace and a path (real paths: absolute, normal), related or not
    workspace = PurePosixPath("/", *workspace_parts)
    for path in (PurePosixPath("/", *path_parts), workspace.joinpath(*path_parts)):
        # When a message names the path
        shown = display_in(path, workspace)  # type: ignore[arg-type]
        # Then it is what the parts say: "." for the workspace, relative under it
        # (quoted when needed), absolute elsewhere
        if path == workspace:
            assert shown == "."
        elif path.is_relative_to(workspace):
            assert shown == quote(str(path.relative_to(workspace)))
        else:
            assert shown == quote(str(path))
