"""The ``glob`` tool: files by name pattern, newest first, through ``rg --files``."""

from __future__ import annotations

import os
from pathlib import Path
from string import Template
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext
from toolpool.tools.support.kinds import ReadingTool
from toolpool.tools.support.paths import (
    Access,
    Resolved,
    display,
    display_in,
    open_path,
    real_workspace,
    stat_beneath,
)
from toolpool.tools.support.ripgrep import run_ripgrep
from toolpool.tools.support.suggest import missing_file

DEFAULT_MAX_RESULTS = 100

DESCRIPTION = Template(
    """\
Find files by name with a glob pattern, e.g. "**/*.py", "src/**/test_*.ts", \
"*.{json,yaml}". Use it instead of find or ls -R in bash; to search file contents, \
use grep.

- Patterns follow .gitignore rules: a pattern without a slash matches file names at \
any depth ("*.py" finds every Python file); one with a slash is relative to the \
searched directory; "**" spans directories.
- path: the directory to search (default: the workspace).
- Files ignored by .gitignore are left out; hidden files are included, the .git \
directory is not.
- Matches come newest first (by modification time), at most $cap; the output says how \
many more there were. Paths are relative to the workspace."""
)


class GlobTool(ReadingTool):
    """Read-only and concurrency-safe (SPEC F1). At most ``max_results`` paths."""

    name = "glob"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": 'Glob pattern, e.g. "**/*.py".'},
            "path": {
                "type": "string",
                "description": "Directory to search in. Default: the workspace.",
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def __init__(self, max_results: int = DEFAULT_MAX_RESULTS) -> None:
        self.max_results = max_results
        self.description = DESCRIPTION.substitute(cap=f"{max_results:,}")

    def label(self) -> str:
        return "Glob"

    def activity(self, args: Arguments) -> str:
        return f"Finding {args.get('pattern', '')}"

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        with open_path(args.get("path") or ".", ctx, Access.READ) as target:
            root = target.path
            directory = _open_directory(target, ctx)
            try:
                return self._glob(args["pattern"], root, directory, ctx)
            finally:
                os.close(directory)

    def _glob(self, pattern: str, root: Path, directory: int, ctx: ToolContext) -> str:
        matched, problem = _list_files(root, directory, ctx, [f"--glob={pattern}"])
        if matched:
            # rg lets a --glob match override .gitignore (for files whose directory is
            # not ignored); keeping only files that plain `rg --files` lists makes
            # .gitignore win, as this tool promises.
            listed, listing_problem = _list_files(root, directory, ctx, [])
            matched = sorted(set(matched) & set(listed))
            problem = problem or listing_problem
        if not matched:
            where = display(root, ctx)
            found = f"No files match {pattern} in {'the workspace' if where == '.' else where}."
            return f"{found}\n[rg: {problem}]" if problem else found
        newest_first = sorted(matched, key=lambda rel: (-_mtime(directory, rel), rel))
        shown = newest_first[: self.max_results]
        workspace = real_workspace(ctx)
        lines = [display_in(root / rel, workspace) for rel in shown]
        if len(newest_first) > len(shown):
            lines.append(
                f"[{len(newest_first)} files match; showing the {len(shown)} most recently "
                f"modified, {len(newest_first) - len(shown)} left out. Narrow the pattern "
                "or the path to see them.]"
            )
        if problem:
            lines.append(f"[rg: {problem}]")
        return "\n".join(lines)


def _open_directory(target: Resolved, ctx: ToolContext) -> int:
    """An fd of the directory to search, or a ToolError saying what is there instead."""
    shown = display(target.path, ctx)
    try:
        fd = target.open(os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:
        raise missing_file(target.path, ctx) from None
    except NotADirectoryError:
        raise ToolError(f"{shown} is a file, not a directory to search in.") from None
    except OSError as exc:
        raise ToolError(f"{shown} cannot be accessed: {exc.strerror}.") from None
    return fd


def _list_files(
    root: Path, directory: int, ctx: ToolContext, extra: list[str]
) -> tuple[list[str], str]:
    """The files ``rg --files`` lists under ``root`` (relative to it), and the error
    rg reported for some of them (an unreadable directory…), if any."""
    files: list[str] = []

    def take(line: str) -> bool:
        if line:
            files.append(line)
        return True

    # No path argument: rg lists the working directory, with paths relative to it,
    # and --glob patterns are anchored there. NUL-ended: a name may hold a newline.
    outcome = run_ripgrep(
        ["--files", "--null", *extra], root, ctx, take, cwd_fd=directory, separator=b"\0"
    )
    if outcome.code == 2 and not files:
        raise ToolError(f"ripgrep failed: {outcome.stderr or 'exit code 2'}")
    return files, outcome.stderr if outcome.code == 2 else ""


def _mtime(directory: int, rel: str) -> int:
    """The mtime of ``rel`` below ``directory``, looked up without following links."""
    try:
        return stat_beneath(directory, rel).st_mtime_ns
    except OSError:  # deleted since it was listed, or swapped for a link
        return 0
