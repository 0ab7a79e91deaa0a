"""The directories a tree walk skips by default: version control, dependencies, caches
and virtual environments — large, generated, and never what the model is looking for.

Used by ``ls`` and by the near-name suggestions of ``read`` and ``edit``. (``glob``
and ``grep`` follow ``.gitignore`` instead, through ripgrep.)
"""

from __future__ import annotations

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
