"""The ``ls`` tool: a directory tree, without the directories nobody wants to see."""

from __future__ import annotations

import stat
import textwrap
from string import Template
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext
from toolpool.tools.support.kinds import ReadingTool
from toolpool.tools.support.paths import Access, display, open_path
from toolpool.tools.support.suggest import missing_file
from toolpool.tools.support.tree import list_tree

DEFAULT_MAX_ENTRIES = 1000

DESCRIPTION = Template(
    """\
List a directory as a tree: directories first (with a trailing /), then files, each \
by name; symlinks are shown with their target and not followed.

- path: the directory to list (default: the workspace).
- Always skipped: .git (and .hg, .svn), node_modules, __pycache__, tool caches \
(.mypy_cache, .pytest_cache, .ruff_cache, .tox) and virtual environments (.venv, \
venv, or any directory holding pyvenv.cfg).
- ignore: more glob patterns to skip, matched against entry names and paths \
relative to the listed directory, e.g. ["*.log", "docs/build"].
- At most $cap entries: the top levels come first, and the output says how many \
deeper entries were left out.

To find files by name prefer glob; to search contents, grep."""
)


class LsTool(ReadingTool):
    """Read-only and concurrency-safe (SPEC F1). At most ``max_entries`` entries."""

    name = "ls"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "Directory to list. Default: the workspace.",
            },
            "ignore": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Glob patterns of entries to leave out.",
            },
        },
        "additionalProperties": False,
    }

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.description = DESCRIPTION.substitute(cap=f"{max_entries:,}")

    def label(self) -> str:
        return "List"

    def activity(self, args: Arguments) -> str:
        return f"Listing {args.get('path') or '.'}"

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        with open_path(args.get("path") or ".", ctx, Access.READ) as root:
            shown = display(root.path, ctx)
            try:
                mode = root.lstat().st_mode
            except FileNotFoundError:
                raise missing_file(root.path, ctx) from None
            except OSError as exc:
                raise ToolError(f"{shown} cannot be accessed: {exc.strerror}.") from None
            if not stat.S_ISDIR(mode):
                raise ToolError(f"{shown} is a file, not a directory. Use read to see it.")
            try:
                tree = list_tree(
                    root, ctx, ignore=args.get("ignore", ()), max_entries=self.max_entries
                )
            except OSError as exc:
                raise ToolError(f"{shown} cannot be listed: {exc.strerror}.") from None
        if tree.total == 0:
            return f"{shown}/ is empty (or holds only ignored entries)."
        text = f"{shown}/\n{textwrap.indent(tree.text, '  ')}"
        if tree.shown < tree.total:
            text += (
                f"\n[{tree.total} entries; showing {tree.shown}, {tree.total - tree.shown} "
                "deeper ones left out. List a subdirectory, or add ignore patterns.]"
            )
        return text
