"""Where the file tools may reach: the workspace, extra roots, the scratch dir (reading
only) — and nothing else, however the path is spelled (SPEC F1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolpool import ToolError
from toolpool.tools import FILE_TOOLS, write_tool
from toolpool.tools.support.paths import Access, display, resolve

from .tool_support import read_whole, text, tool_context


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("a.txt", "a.txt"),
        ("./sub/../a.txt", "a.txt"),
        ("sub/b.txt", "sub/b.txt"),
        ("sub/new/deeper.txt", "sub/new/deeper.txt"),  # not there yet: write may create it
    ],
)
def test_relative_paths_are_relative_to_the_workspace(
    workspace: Path, spelling: str, expected: str
) -> None:
    # Given a workspace with a file and a subdirectory
    (workspace / "a.txt").write_text("a")
    (workspace / "sub").mkdir()
    ctx = tool_context(workspace)
    # When a relative path is resolved
    resolved = resolve(spelling, ctx, Access.WRITE)
    # Then it names the file under the workspace, and is displayed relative to it
    assert resolved == workspace.resolve() / expected
    assert display(resolved, ctx) == expected


@pytest.mark.spec("F1")
def test_absolute_paths_inside_the_workspace_are_fine(workspace: Path) -> None:
    (workspace / "a.txt").write_text("a")
    ctx = tool_context(workspace)
    resolved = resolve(str(workspace.resolve() / "a.txt"), ctx, Access.READ)
    assert display(resolved, ctx) == "a.txt"
    assert display(workspace.resolve(), ctx) == "."


@pytest.mark.spec("F1")
@pytest.mark.parametrize("access", list(Access))
@pytest.mark.parametrize(
    "spelling",
    ["../outside/secret.txt", "sub/../../outside/secret.txt", "ABSOLUTE", "/etc/passwd"],
)
def test_paths_escaping_the_workspace_are_refused(
    workspace: Path, outside: Path, access: Access, spelling: str
) -> None:
    # Given a path that leads out of the workspace, by ".." or absolutely
    (workspace / "sub").mkdir()
    ctx = tool_context(workspace)
    raw = str(outside / "secret.txt") if spelling == "ABSOLUTE" else spelling
    # When it is resolved, Then it is refused with a message that says why
    with pytest.raises(ToolError, match=r"Access denied: .* outside the workspace") as caught:
        resolve(raw, ctx, access)
    assert str(workspace.resolve()) in caught.value.message


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("link", "through"),
    [("link.txt", "link.txt"), ("linkdir", "linkdir/secret.txt"), ("linkdir", "linkdir/new.txt")],
)
def test_symlinks_pointing_out_are_refused(
    workspace: Path, outside: Path, link: str, through: str
) -> None:
    # Given symlinks inside the workspace that point outside it (to a file, to a dir)
    target = outside / "secret.txt" if link == "link.txt" else outside
    (workspace / link).symlink_to(target)
    ctx = tool_context(workspace)
    # When a path through them is resolved — even one that does not exist yet
    # Then it is refused, and the message names the symlink
    with pytest.raises(ToolError, match=r"is a symlink .* that points outside"):
        resolve(through, ctx, Access.WRITE)


@pytest.mark.spec("F1")
def test_symlinks_inside_the_workspace_resolve_to_their_target(workspace: Path) -> None:
    (workspace / "real.txt").write_text("x")
    (workspace / "alias.txt").symlink_to(workspace / "real.txt")
    ctx = tool_context(workspace)
    assert resolve("alias.txt", ctx, Access.READ) == workspace.resolve() / "real.txt"


@pytest.mark.spec("F1")
def test_dangling_symlink_to_outside_cannot_be_written_through(
    workspace: Path, outside: Path
) -> None:
    # Given a symlink to a file outside that does not exist yet
    (workspace / "trap.txt").symlink_to(outside / "planted.txt")
    ctx = tool_context(workspace)
    # When write is asked to create it, Then it is refused and nothing appears outside
    verdict = write_tool.validate({"path": "trap.txt", "content": "x"}, ctx)
    assert not verdict.ok
    assert "points outside" in verdict.message
    assert not (outside / "planted.txt").exists()


@pytest.mark.spec("F1")
@pytest.mark.parametrize("access", list(Access))
def test_extra_roots_are_allowed(workspace: Path, outside: Path, access: Access) -> None:
    # Given a session with an extra root
    ctx = tool_context(workspace, extra_roots=[outside])
    # When a path in it is resolved, by absolute path or by "..", Then it is allowed
    secret = (outside / "secret.txt").resolve()
    assert resolve(str(outside / "secret.txt"), ctx, access) == secret
    assert resolve("../outside/secret.txt", ctx, access) == secret
    # And tool output names it by its absolute path
    assert display(secret, ctx) == str(secret)


@pytest.mark.spec("F1")
def test_the_scratch_dir_is_readable_but_not_writable(workspace: Path, tmp_path: Path) -> None:
    # Given a session scratch dir outside the workspace, holding a spill file
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "spill.txt").write_text("long output\n")
    ctx = tool_context(workspace, scratch_dir=scratch)
    # Then reading tools may reach it, writing tools may not
    assert "long output" in read_whole(ctx, str(scratch / "spill.txt"))
    with pytest.raises(ToolError, match=r"Access denied"):
        resolve(str(scratch / "spill.txt"), ctx, Access.WRITE)


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("tool_name", "args"),
    [
        ("read", {"path": "../outside/secret.txt"}),
        ("glob", {"pattern": "*.txt", "path": "../outside"}),
        ("grep", {"pattern": "secret", "path": "../outside"}),
        ("ls", {"path": "../outside"}),
        ("edit", {"path": "../outside/secret.txt", "old_string": "top", "new_string": "no"}),
        ("write", {"path": "../outside/secret.txt", "content": "gone"}),
    ],
)
def test_every_file_tool_refuses_an_escape(
    workspace: Path, outside: Path, tool_name: str, args: dict[str, Any]
) -> None:
    # Given each file tool, and arguments that point outside the workspace
    (tool,) = [t for t in FILE_TOOLS if t.name == tool_name]
    ctx = tool_context(workspace)
    # When it executes, Then it refuses, and the secret is neither shown nor changed
    with pytest.raises(ToolError, match=r"Access denied") as caught:
        text(tool.execute(args, ctx))
    assert "top secret" not in caught.value.message
    assert (outside / "secret.txt").read_text() == "top secret\n"


@pytest.mark.spec("F1")
@pytest.mark.parametrize("spelling", ["", "   ", "a\0b"])
def test_empty_and_nul_paths_are_refused(workspace: Path, spelling: str) -> None:
    with pytest.raises(ToolError, match=r"empty|NUL"):
        resolve(spelling, tool_context(workspace), Access.READ)
