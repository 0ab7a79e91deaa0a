"""A session's workspace changes, out of its layers (SPEC B8–B10): which paths differ
from where it started (or a checkpoint), as a git-format patch, written out to a
directory or tarball, or applied to the host directory it came from.

- ``tree``: a tree read without following symlinks, and what layers say may differ;
- ``compare``: the differences, as ``Change`` records;
- ``patch``: a git-format patch (text hunks, binary patches) that ``git apply`` takes;
- ``export``: the workspace written to a directory or a tarball;
- ``commit``: the changes applied to the host, checked first, undone on failure.

A leaf: the standard library only. The pool gives it the trees (``pool/branches.py``).
"""

from toolpool.changes.commit import BaseMarks, CommitConflict, commit
from toolpool.changes.compare import Change, ChangeKind, EntryType, compare
from toolpool.changes.export import export, tar_mode
from toolpool.changes.patch import PatchTooLarge, git_patch
from toolpool.changes.tree import Tree, candidates, touched

__all__ = [
    "BaseMarks",
    "Change",
    "ChangeKind",
    "CommitConflict",
    "EntryType",
    "PatchTooLarge",
    "Tree",
    "candidates",
    "commit",
    "compare",
    "export",
    "git_patch",
    "tar_mode",
    "touched",
]
