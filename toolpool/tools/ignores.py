"""The directories a tree walk skips by default: version control, dependencies, caches
and virtual environments — large, generated, and never what the model is looking for.

Used by ``ls`` and by the near-name suggestions of ``read`` and ``edit``. (``glob``
and ``grep`` follow ``.gitignore`` instead, through ripgrep.)
"""

from __future__ import annotations

import os

DEFAULT_IGNORED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".venv",
        "venv",
    }
)


def skipped_by_default(entry: os.DirEntry[str]) -> bool:
    """Whether a walk leaves this directory entry out: an ignored directory by name, or
    a virtual environment under any name (a directory holding ``pyvenv.cfg``)."""
    try:
        if not entry.is_dir(follow_symlinks=False):
            return False
    except OSError:
        return False
    return entry.name in DEFAULT_IGNORED_DIRS or os.path.isfile(
        os.path.join(entry.path, "pyvenv.cfg")
    )
