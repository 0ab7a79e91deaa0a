"""The ls tool: a tree, without what nobody wants to see, capped top levels first
(SPEC F1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolpool import ToolError
from toolpool.registry import ToolSpec
from toolpool.tools import LsTool, ls_tool

from .tool_support import tool_context


def make_tree(root: Path, *files: str) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


@pytest.mark.spec("F1")
def test_a_tree_with_directories_first(workspace: Path) -> None:
    # Given a small project
    make_tree(workspace, "README.md", "src/app.py", "src/util/io.py", "tests/test_app.py")
    # When it is listed
    out = ls_tool.execute({}, tool_context(workspace))
    # Then it comes back as an indented tree: directories first, each level by name
    assert out == "\n".join(
        [
            "./",
            "  src/",
            "    util/",
            "      io.py",
            "    app.py",
            "  tests/",
            "    test_app.py",
            "  README.md",
        ]
    )


@pytest.mark.spec("F1")
def test_default_ignores_leave_out_vcs_dependencies_caches_and_virtualenvs(
    workspace: Path,
) -> None:
    # Given a project full of directories nobody wants listed — among them a virtual
    # environment under an unusual name, known by its pyvenv.cfg
    make_tree(
        workspace,
        "app.py",
        ".git/HEAD",
        "node_modules/left-pad/index.js",
        "__pycache__/app.cpython-311.pyc",
        ".venv/bin/python",
        "venv/bin/python",
        "env-3.11/pyvenv.cfg",
        "env-3.11/lib/site.py",
        ".mypy_cache/x.json",
        ".github/workflows/ci.yml",
    )
    # When the workspace is listed
    out = ls_tool.execute({}, tool_context(workspace))
    # Then only the project's own entries appear (hidden ones included)
    assert out == "./\n  .github/\n    workflows/\n      ci.yml\n  app.py"


@pytest.mark.spec("F1")
def test_ignore_globs_match_names_and_relative_paths(workspace: Path) -> None:
    make_tree(workspace, "a.py", "debug.log", "docs/build/x.html", "docs/index.md")
    out = ls_tool.execute({"ignore": ["*.log", "docs/build"]}, tool_context(workspace))
    assert out == "./\n  docs/\n    index.md\n  a.py"


@pytest.mark.spec("F1")
def test_a_subdirectory_is_listed_under_its_workspace_path(workspace: Path) -> None:
    make_tree(workspace, "src/pkg/mod.py")
    out = ls_tool.execute({"path": "src"}, tool_context(workspace))
    assert out == "src/\n  pkg/\n    mod.py"


@pytest.mark.spec("F1")
def test_symlinks_are_shown_with_their_target_and_not_followed(workspace: Path) -> None:
    make_tree(workspace, "real/inside.txt")
    (workspace / "alias").symlink_to(workspace / "real")
    out = ls_tool.execute({}, tool_context(workspace))
    assert out == f"./\n  real/\n    inside.txt\n  alias -> {workspace / 'real'}"


@pytest.mark.spec("F1")
def test_the_cap_keeps_the_top_levels_and_counts_what_it_left_out(workspace: Path) -> None:
    # Given a tree of 3 top-level directories holding 4 files each (15 entries)
    for top in ("a", "b", "c"):
        make_tree(workspace, *(f"{top}/f{i}.txt" for i in range(4)))
    # When it is listed with a cap of 5 entries
    capped = LsTool(max_entries=5)
    assert "At most 5 entries" in capped.description
    out = capped.execute({}, tool_context(workspace))
    # Then the three top-level directories are shown first, then the first deeper ones,
    # and a note counts the entries left out
    lines = out.split("\n")
    assert lines[:6] == ["./", "  a/", "    f0.txt", "    f1.txt", "  b/", "  c/"]
    assert lines[6] == (
        "[15 entries; showing 5, 10 deeper ones left out. List a subdirectory, or add "
        "ignore patterns.]"
    )


@pytest.mark.spec("F1")
def test_an_empty_directory_and_a_file_are_told_apart(workspace: Path) -> None:
    (workspace / "empty").mkdir()
    (workspace / "file.txt").write_text("x")
    ctx = tool_context(workspace)
    assert "empty/ is empty" in ls_tool.execute({"path": "empty"}, ctx)
    with pytest.raises(ToolError, match=r"file.txt is a file, not a directory. Use read"):
        ls_tool.execute({"path": "file.txt"}, ctx)
    with pytest.raises(ToolError, match=r"Path does not exist: nowhere"):
        ls_tool.execute({"path": "nowhere"}, ctx)


@pytest.mark.spec("F1", "T2", "T3")
def test_ls_is_read_only_and_concurrency_safe() -> None:
    spec = ToolSpec(ls_tool)
    assert spec.read_only({})
    assert spec.concurrency_safe({})
    assert spec.label() == "List"
    assert spec.activity({"path": "src"}) == "Listing src"
    assert spec.permissions == ("read",)
