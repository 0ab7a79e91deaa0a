"""What Anthropic's text editor can undo (``undo_edit``, SPEC F18): the content each
file had before each change the editor made to it in this session, newest last.

Kept in the session's scratch directory (``editor/``, mode 0700, files 0600: no other
user and no other session reads them, X8), one directory per file (named by a hash
of its path), the last ``MAX_VERSIONS`` versions of each, each at most
``MAX_VERSION_BYTES`` (a change of a bigger file cannot be undone: the file's history
is dropped, so that an undo never skips back past it); gone with the session.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from toolpool.runtime import private_dir

MAX_VERSIONS = 10
MAX_VERSION_BYTES = 8 * 1024 * 1024
_DIGITS = 8


class EditHistory:
    """The versions of one file kept for ``undo_edit``."""

    def __init__(self, scratch_dir: Path, path: Path) -> None:
        self._root = scratch_dir / "editor"
        self._directory = self._root / hashlib.sha256(os.fsencode(path)).hexdigest()[:32]

    def _versions(self) -> list[str]:
        try:
            names = os.listdir(self._directory)
        except FileNotFoundError:
            return []
        return sorted(name for name in names if name.isdigit() and len(name) == _DIGITS)

    def push(self, data: bytes) -> None:
        """Keep ``data`` as the newest version (the oldest beyond MAX_VERSIONS go); a
        version over MAX_VERSION_BYTES drops the file's history instead."""
        if len(data) > MAX_VERSION_BYTES:
            for old in self._versions():
                with contextlib.suppress(FileNotFoundError):
                    (self._directory / old).unlink()
            return
        private_dir(self._root)
        private_dir(self._directory)
        versions = self._versions()
        number = int(versions[-1]) + 1 if versions else 1
        name = self._directory / f"{number:0{_DIGITS}d}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(name, flags, 0o600), "wb") as f:
            f.write(data)
        for old in versions[: max(len(versions) + 1 - MAX_VERSIONS, 0)]:
            with contextlib.suppress(FileNotFoundError):
                (self._directory / old).unlink()

    def empty(self) -> bool:
        """Whether no version is kept (a look at names only)."""
        return not self._versions()

    def last(self) -> bytes | None:
        """The newest version; None when there is none."""
        versions = self._versions()
        if not versions:
            return None
        fd = os.open(self._directory / versions[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def drop_last(self) -> None:
        """Forget the newest version (it was restored)."""
        versions = self._versions()
        if versions:
            with contextlib.suppress(FileNotFoundError):
                (self._directory / versions[-1]).unlink()
