"""glob and grep against raw ripgrep on a real tree nobody here wrote — packages of
the installed standard library — plus .gitignore, hidden files, caps, failures and
cancellation (SPEC F1)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from toolpool import Cancelled, CancelSource, ToolError
from toolpool.cancel import CancelToken
from toolpool.registry import ToolSpec
from toolpool.tools import GlobTool, GrepTool, glob_tool, grep_tool
from toolpool.tools.support.ripgrep import run_ripgrep

from .tool_support import copy_stdlib, raw_rg, tool_context


@pytest.fixture(scope="module")
def stdlib_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace holding copies of json/, email/ and asyncio/ from the stdlib."""
    return copy_stdlib(tmp_path_factory.mktemp("stdlib"))


def body(output: str) -> list[str]:
    """The tool's result lines without its header ("Found …") line."""
    lines = output.split("\n")
    return lines[1:] if lines[0].startswith("Found ") else lines


# --- glob -------------------------------------------------------------------------


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("pattern", "path"),
    [("**/*.py", None), ("*.py", "email"), ("mime/*.py", "email"), ("**/__init__.py", None)],
)
def test_glob_lists_what_rg_files_lists(stdlib_tree: Path, pattern: str, path: str | None) -> None:
    # Given the stdlib tree as workspace
    args: dict[str, Any] = {"pattern": pattern}
    if path:
        args["path"] = path
    # When glob runs
    out = GlobTool(max_results=10_000).execute(args, tool_context(stdlib_tree))
    # Then it lists exactly the files raw `rg --files --glob` lists there, as
    # workspace-relative paths
    cwd = stdlib_tree / path if path else stdlib_tree
    prefix = f"{path}/" if path else ""
    expected = {prefix + line for line in raw_rg(["--files", "--glob", pattern], cwd)}
    assert expected
    assert set(out.split("\n")) == expected


@pytest.mark.spec("F1")
def test_glob_agrees_with_pathlib_on_a_tree_without_ignore_files(stdlib_tree: Path) -> None:
    out = GlobTool(max_results=10_000).execute({"pattern": "**/*.py"}, tool_context(stdlib_tree))
    expected = {str(p.relative_to(stdlib_tree)) for p in stdlib_tree.rglob("*.py")}
    assert set(out.split("\n")) == expected


@pytest.mark.spec("F1")
def test_glob_sorts_newest_first_and_caps_with_a_note(workspace: Path) -> None:
    # Given 5 files modified at distinct times, oldest first by name
    for i in range(5):
        path = workspace / f"f{i}.txt"
        path.write_text("")
        os.utime(path, ns=(0, (1_000 + i) * 1_000_000_000))
    # When glob is capped at 3 (and its description tells the model so)
    capped = GlobTool(max_results=3)
    assert "at most 3;" in capped.description
    out = capped.execute({"pattern": "*.txt"}, tool_context(workspace))
    # Then the 3 newest come first, and a note counts the others
    lines = out.split("\n")
    assert lines[:3] == ["f4.txt", "f3.txt", "f2.txt"]
    assert lines[3].startswith("[5 files match; showing the 3 most recently modified, 2 left out")


@pytest.mark.spec("F1")
def test_glob_respects_gitignore_outside_git_even_for_matching_files(workspace: Path) -> None:
    # Given a workspace (not a git repository) whose .gitignore excludes a directory
    # and a single file that the pattern would match
    (workspace / ".gitignore").write_text("build/\nsrc/generated.py\n")
    for name in ("src/app.py", "src/generated.py", "build/out.py"):
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text("")
    # When glob looks for Python files
    out = glob_tool.execute({"pattern": "**/*.py"}, tool_context(workspace))
    # Then the ignored ones are left out (rg's --glob alone would let the file through)
    assert out == "src/app.py"
    assert "src/generated.py" in raw_rg(["--files", "--no-require-git", "-g", "**/*.py"], workspace)


@pytest.mark.spec("F1")
def test_glob_includes_hidden_files_but_not_the_git_directory(workspace: Path) -> None:
    for name in (".github/workflows/ci.yml", ".git/config.yml", "app.yml"):
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text("")
    out = glob_tool.execute({"pattern": "**/*.yml"}, tool_context(workspace))
    assert sorted(out.split("\n")) == [".github/workflows/ci.yml", "app.yml"]


@pytest.mark.spec("F1")
def test_glob_with_no_match_and_on_a_file(workspace: Path) -> None:
    (workspace / "a.txt").write_text("")
    ctx = tool_context(workspace)
    assert glob_tool.execute({"pattern": "*.rs"}, ctx) == "No files match *.rs in the workspace."
    with pytest.raises(ToolError, match=r"a.txt is a file, not a directory"):
        glob_tool.execute({"pattern": "*", "path": "a.txt"}, ctx)


@pytest.mark.spec("F1")
def test_glob_reaches_extra_roots_by_absolute_path(workspace: Path, stdlib_tree: Path) -> None:
    ctx = tool_context(workspace, extra_roots=[stdlib_tree])
    out = glob_tool.execute({"pattern": "*.py", "path": str(stdlib_tree / "json")}, ctx)
    assert str(stdlib_tree.resolve() / "json" / "decoder.py") in out.split("\n")


# --- grep against raw rg ------------------------------------------------------------

CASES = [
    # (tool arguments, the raw rg flags that mean the same)
    ({"pattern": "import"}, ["--files-with-matches"]),
    ({"pattern": "UTF-8", "-i": True}, ["--files-with-matches", "-i"]),
    ({"pattern": "def \\w+", "glob": "*parser*"}, ["--files-with-matches", "-g", "*parser*"]),
    ({"pattern": "class ", "output_mode": "count", "type": "py"}, ["--count", "-t", "py"]),
    ({"pattern": "utf-?8", "output_mode": "count", "-i": True}, ["--count", "-i"]),
    ({"pattern": "raise ValueError", "output_mode": "content"}, ["-n"]),
    ({"pattern": "raise ValueError", "output_mode": "content", "-n": False}, ["-N"]),
    (
        {"pattern": "def __init__", "output_mode": "content", "glob": "*.py", "-C": 2},
        ["-n", "-g", "*.py", "-C", "2"],
    ),
    ({"pattern": "^class ", "output_mode": "content", "-A": 1, "-B": 3}, ["-n", "-A1", "-B3"]),
    (
        {"pattern": 'def \\w+\\(self\\):\\n\\s+"""', "output_mode": "content", "multiline": True},
        ["-n", "-U", "--multiline-dotall"],
    ),
    (
        {"pattern": "^def .*?:$.*?return", "output_mode": "count", "multiline": True},
        ["--count", "-U", "--multiline-dotall"],
    ),
]


@pytest.mark.spec("F1")
@pytest.mark.parametrize(("args", "flags"), CASES)
@pytest.mark.parametrize("path", [None, "email"])
def test_grep_matches_equal_raw_rg(
    stdlib_tree: Path, args: dict[str, Any], flags: list[str], path: str | None
) -> None:
    # Given the stdlib tree as workspace, and a search in all of it or in email/
    if path:
        args = {**args, "path": path}
    # When grep runs
    out = GrepTool(max_output_chars=10_000_000).execute(args, tool_context(stdlib_tree))
    # Then its lines are raw rg's for the same flags, paths made workspace-relative
    cwd = stdlib_tree / path if path else stdlib_tree
    prefix = f"{path}/" if path else ""
    raw = raw_rg(
        ["--with-filename", "--no-heading", "--sort=path", *flags, "--", args["pattern"]], cwd
    )
    expected = [line if line == "--" else prefix + line for line in raw]
    assert expected, "a case that matches nothing proves nothing"
    mode = args.get("output_mode", "files_with_matches")
    if mode == "content":
        assert out.split("\n") == expected
    else:  # files come newest first, counts by path: compare as sets
        assert sorted(body(out)) == sorted(expected)


@pytest.mark.spec("F1")
def test_grep_files_mode_lists_newest_first_with_a_count(workspace: Path) -> None:
    for i in range(3):
        path = workspace / f"m{i}.py"
        path.write_text("needle\n")
        os.utime(path, ns=(0, (1_000 + i) * 1_000_000_000))
    out = grep_tool.execute({"pattern": "needle"}, tool_context(workspace))
    assert out == "Found 3 files\nm2.py\nm1.py\nm0.py"


@pytest.mark.spec("F1")
def test_grep_count_mode_totals(workspace: Path) -> None:
    (workspace / "a.txt").write_text("x\nx\ny\n")
    (workspace / "b.txt").write_text("x\n")
    out = grep_tool.execute({"pattern": "x", "output_mode": "count"}, tool_context(workspace))
    assert out == "Found 3 matching lines in 2 files\na.txt:2\nb.txt:1"


@pytest.mark.spec("F1")
def test_grep_searches_a_single_file_and_names_it(workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("a = 1\nb = 2\n")
    args = {"pattern": "b =", "path": "src/app.py", "output_mode": "content"}
    assert grep_tool.execute(args, tool_context(workspace)) == "src/app.py:2:b = 2"


@pytest.mark.spec("F1")
def test_grep_patterns_may_start_with_a_dash(workspace: Path) -> None:
    (workspace / "notes.md").write_text("- item\n-- rule\n")
    args = {"pattern": "--", "output_mode": "content"}
    assert grep_tool.execute(args, tool_context(workspace)) == "notes.md:2:-- rule"


@pytest.mark.spec("F1")
def test_grep_respects_gitignore_and_searches_hidden_files(workspace: Path) -> None:
    (workspace / ".gitignore").write_text("dist/\n")
    for name in ("src/a.py", "dist/a.py", ".config/a.toml", ".git/a"):
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text("token\n")
    out = grep_tool.execute({"pattern": "token"}, tool_context(workspace))
    assert sorted(body(out)) == [".config/a.toml", "src/a.py"]


@pytest.mark.spec("F1")
def test_grep_no_match_is_not_an_error(workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello\n")
    out = grep_tool.execute({"pattern": "absent"}, tool_context(workspace))
    assert out == "No matches for absent in the workspace."


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"pattern": "(unclosed"}, "ripgrep failed: regex parse error"),
        ({"pattern": "x", "type": "no-such-type"}, "ripgrep failed: .*no-such-type"),
        ({"pattern": "x", "path": "missing/dir"}, "Path does not exist: missing/dir"),
    ],
)
def test_grep_errors_are_tool_errors_with_rgs_message(
    workspace: Path, args: dict[str, Any], message: str
) -> None:
    (workspace / "a.txt").write_text("x\n")
    with pytest.raises(ToolError, match=message):
        grep_tool.execute(args, tool_context(workspace))


@pytest.mark.spec("F1")
@pytest.mark.parametrize("tool", [glob_tool, grep_tool], ids=["glob", "grep"])
def test_a_missing_rg_names_the_package(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, tool: Any
) -> None:
    monkeypatch.setenv("PATH", str(workspace))  # an empty PATH: no rg anywhere
    with pytest.raises(ToolError, match=r"ripgrep \(rg\) is not installed.*'ripgrep' package"):
        tool.execute({"pattern": "*"}, tool_context(workspace))


# --- caps -------------------------------------------------------------------------


@pytest.mark.spec("F1")
def test_content_output_is_capped_and_says_so(stdlib_tree: Path) -> None:
    # Given a search whose output is far larger than the cap
    args = {"pattern": "def ", "output_mode": "content"}
    # When grep runs with a 2,000-character cap (and its description tells the model so)
    capped = GrepTool(max_output_chars=2_000)
    assert "capped at about 2,000 characters" in capped.description
    out = capped.execute(args, tool_context(stdlib_tree))
    # Then it stops near the cap (rg is stopped too: no process is left) and says so
    *lines, note = out.split("\n")
    assert sum(len(line) + 1 for line in lines) <= 2_000
    assert note.startswith("[Output cut at the 2,000-character output limit: there is more.")
    full = raw_rg(
        ["-n", "--with-filename", "--no-heading", "--sort=path", "--", "def "], stdlib_tree
    )
    assert lines == full[: len(lines)]


@pytest.mark.spec("F1")
@pytest.mark.parametrize("mode", ["content", "files_with_matches", "count"])
def test_head_limit_keeps_the_first_entries(stdlib_tree: Path, mode: str) -> None:
    args = {"pattern": "import", "output_mode": mode, "head_limit": 4}
    out = grep_tool.execute(args, tool_context(stdlib_tree))
    *lines, note = body(out)
    assert len(lines) == 4
    assert note.startswith("[Output cut at head_limit=4: there is more.")


@pytest.mark.spec("F1")
def test_long_matching_lines_are_cut(workspace: Path) -> None:
    (workspace / "min.js").write_text("var a='" + "x" * 5000 + "';\n")
    out = grep_tool.execute({"pattern": "var", "output_mode": "content"}, tool_context(workspace))
    assert out.endswith("more characters]")
    assert len(out) < 2100


# --- cancellation: rg is always reaped ----------------------------------------------


@pytest.mark.spec("F1")
def test_a_cancelled_call_stops_rg(stdlib_tree: Path) -> None:
    # Given a call whose token is cancelled while rg streams its output
    token = CancelToken()
    ctx = tool_context(stdlib_tree, cancel_token=token)
    seen: list[str] = []

    def cancel_after_first(line: str) -> bool:
        seen.append(line)
        token.cancel(CancelSource.INTERRUPT)
        return True

    # When rg runs, Then Cancelled is raised with its source, and rg is reaped
    # (the autouse fixture proves that no process is left behind)
    with pytest.raises(Cancelled) as caught:
        run_ripgrep(["--files"], stdlib_tree, ctx, cancel_after_first)
    assert caught.value.source is CancelSource.INTERRUPT
    assert seen


@pytest.mark.spec("F1")
def test_a_cancel_raised_into_the_reading_thread_still_reaps_rg(stdlib_tree: Path) -> None:
    # Given a worker that delivers cancellation by raising in the tool's thread
    ctx = tool_context(stdlib_tree)

    def worker_cancels(line: str) -> bool:
        raise Cancelled(CancelSource.ABORT)

    # When it happens while rg runs, Then it propagates and rg does not outlive it
    with pytest.raises(Cancelled):
        run_ripgrep(["--files"], stdlib_tree, ctx, worker_cancels)


@pytest.mark.spec("F1")
def test_grep_runs_side_by_side_in_threads(stdlib_tree: Path) -> None:
    # Given several greps at once in threads (as safe calls run in one turn)
    results: dict[str, str] = {}

    def search(pattern: str) -> None:
        results[pattern] = grep_tool.execute({"pattern": pattern}, tool_context(stdlib_tree))

    threads = [threading.Thread(target=search, args=(p,)) for p in ("import", "class", "def")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then each gets its own complete answer
    assert sorted(results) == ["class", "def", "import"]
    for pattern, out in results.items():
        assert sorted(body(out)) == sorted(raw_rg(["-l", "--", pattern], stdlib_tree))


@pytest.mark.spec("F1", "T2", "T3")
@pytest.mark.parametrize(("tool", "label"), [(glob_tool, "Glob"), (grep_tool, "Grep")])
def test_glob_and_grep_are_read_only_and_concurrency_safe(tool: Any, label: str) -> None:
    spec = ToolSpec(tool)
    args = {"pattern": "TODO"}
    assert spec.read_only(args)
    assert spec.concurrency_safe(args)
    assert spec.label() == label
    assert "TODO" in (spec.activity(args) or "")
    assert spec.permissions == ("read",)
