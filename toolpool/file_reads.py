"""The session's file-read register (SPEC F2) and the read-before-write check (F3).

``read`` records a stamp for every file it reads; ``edit`` and ``write`` ask the
register whether the file was read in full and has not changed since. One register
per session, shared by read, edit and write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from toolpool.tool import ValidationResult

# F3's refusal codes (docs/spec.md): 2 never (or only partly) read, 3 changed since.
CODE_NOT_READ = 2
CODE_STALE = 3


READ_AGAIN = "Read it again before writing to it."


def modified_since_read(name: str) -> str:
    """The first sentence of F3's code-3 refusal in ``validate``."""
    return f"File {name} has been modified since it was read, either by the user or by a linter."


def content_hash(data: bytes) -> str:
    """The register's content token: a BLAKE2b digest (fast, and collisions are moot)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class FileReadStamp:
    """What the session knew of a file when it read it (F2)."""

    read_at: float
    mtime_ns: int
    size: int
    content_hash: str
    partial: bool

    @classmethod
    def of(cls, path: str | os.PathLike[str], data: bytes, *, partial: bool) -> FileReadStamp:
        """Stamp ``path`` whose full content is ``data``, read just now."""
        st = os.stat(path)
        return cls(time.time(), st.st_mtime_ns, st.st_size, content_hash(data), partial)

    def to_dict(self) -> dict[str, Any]:
        return {
            "read_at": self.read_at,
            "mtime_ns": self.mtime_ns,
            "size": self.size,
            "content_hash": self.content_hash,
            "partial": self.partial,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileReadStamp:
        return cls(
            read_at=float(data["read_at"]),
            mtime_ns=int(data["mtime_ns"]),
            size=int(data["size"]),
            content_hash=str(data["content_hash"]),
            partial=bool(data["partial"]),
        )


class Freshness(Enum):
    """Where a file stands with respect to the register."""

    NEVER_READ = "never read"
    PARTIAL = "only partly read"
    CHANGED = "changed since it was read"
    FRESH = "read and unchanged"


class FileReadRegister:
    """Path → stamp, safe to use from several threads. Keys are resolved paths."""

    def __init__(self) -> None:
        self._stamps: dict[str, FileReadStamp] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(path: str | os.PathLike[str]) -> str:
        try:
            return os.path.realpath(path)
        except OSError:  # a link swapped mid-way (EINVAL from readlink): as spelled
            return os.path.abspath(path)

    def record(self, path: str | os.PathLike[str], stamp: FileReadStamp) -> None:
        with self._lock:
            self._stamps[self.key(path)] = stamp

    def get(self, path: str | os.PathLike[str]) -> FileReadStamp | None:
        with self._lock:
            return self._stamps.get(self.key(path))

    def forget(self, path: str | os.PathLike[str]) -> None:
        with self._lock:
            self._stamps.pop(self.key(path), None)

    def mark_partial(self, path: str | os.PathLike[str], *, since: float) -> bool:
        """Make the stamp of ``path`` a partial one if it is whole and was recorded at
        or after ``since`` (a read whose output the model got only part of: SPEC L4);
        True when it did. An older stamp is another call's and stays."""
        stamp = self.get(path)
        if stamp is None or stamp.partial or stamp.read_at < since:
            return False
        self.record(path, dataclasses.replace(stamp, partial=True))
        return True

    def freshness(
        self, path: str | os.PathLike[str], at: str | os.PathLike[str] | None = None
    ) -> Freshness:
        """Compare the file on disk with its stamp. Cheap: a stat, and a hash only
        when the mtime or size moved (a file touched but unchanged is still fresh).
        ``at``: where the file is looked at when not at ``path`` (through the fd of
        its directory: in a session's overlay of its workspace, SPEC V14)."""
        stamp = self.get(path)
        path = path if at is None else at
        if stamp is None:
            return Freshness.NEVER_READ
        if stamp.partial:
            return Freshness.PARTIAL
        try:
            st = os.stat(path)
            if st.st_mtime_ns == stamp.mtime_ns and st.st_size == stamp.size:
                return Freshness.FRESH
            if st.st_size != stamp.size:
                return Freshness.CHANGED
            data = Path(path).read_bytes()
        except OSError:
            return Freshness.CHANGED  # deleted or unreadable since the read
        return Freshness.FRESH if content_hash(data) == stamp.content_hash else Freshness.CHANGED

    def check_before_write(
        self,
        path: str | os.PathLike[str],
        *,
        shown: Callable[[], str] | None = None,
        at: str | os.PathLike[str] | None = None,
    ) -> ValidationResult:
        """F3: the check edit and write run in ``validate``.

        A file that does not exist needs no read. Otherwise: never or partly read →
        code 2; changed since → code 3; read and unchanged → passes. A refusal names
        the file as ``shown()`` gives it (the tools give its workspace-relative form,
        SPEC E4; called only for a refusal), else as ``path``.
        """
        if not os.path.lexists(path if at is None else at):
            return ValidationResult.passed()
        freshness = self.freshness(path, at)
        if freshness is Freshness.FRESH:
            return ValidationResult.passed()
        name = os.fspath(path) if shown is None else shown()
        match freshness:
            case Freshness.NEVER_READ:
                return ValidationResult.failed(
                    f"File {name} has not been read yet. Read it first before writing to it.",
                    CODE_NOT_READ,
                )
            case Freshness.PARTIAL:
                return ValidationResult.failed(
                    f"File {name} was only partly read (offset/limit, or its output was cut). "
                    "Read the whole file before writing to it.",
                    CODE_NOT_READ,
                )
            case Freshness.CHANGED:
                return ValidationResult.failed(
                    f"{modified_since_read(name)} {READ_AGAIN}", CODE_STALE
                )

    def rejudge(self) -> None:
        """Every stamp judged by content from now on (a rewind put files back with the
        times they had then, B2): the next check hashes the file, whatever its mtime."""
        with self._lock:
            self._stamps = {
                path: dataclasses.replace(stamp, mtime_ns=-1)
                for path, stamp in self._stamps.items()
            }

    def copy(self) -> FileReadRegister:
        """A register of its own with the same stamps (a fork's, B3)."""
        other = FileReadRegister()
        with self._lock:
            other._stamps = dict(self._stamps)
        return other

    def __iter__(self) -> Iterator[tuple[str, FileReadStamp]]:
        with self._lock:
            return iter(list(self._stamps.items()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._stamps)

    def __repr__(self) -> str:
        with self._lock:
            partial = sum(s.partial for s in self._stamps.values())
            return f"<FileReadRegister {len(self._stamps)} files ({partial} partial)>"


class RecordingRegister(FileReadRegister):
    """A register that remembers what changed in it: what a worker holds for one
    call, seeded with the stamps the coordinator sent, its changes sent back."""

    def __init__(self, stamps: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__()
        for path, stamp in (stamps or {}).items():
            super().record(path, FileReadStamp.from_dict(stamp))
        self.changes: dict[str, FileReadStamp | None] = {}

    def record(self, path: str | os.PathLike[str], stamp: FileReadStamp) -> None:
        super().record(path, stamp)
        self.changes[self.key(path)] = stamp

    def forget(self, path: str | os.PathLike[str]) -> None:
        super().forget(path)
        self.changes[self.key(path)] = None

    def changes_dict(self) -> dict[str, dict[str, Any] | None]:
        return {p: None if s is None else s.to_dict() for p, s in self.changes.items()}


def apply_changes(
    register: FileReadRegister, changes: Mapping[str, Mapping[str, Any] | None]
) -> None:
    """Apply what a worker's RecordingRegister recorded to the session's register."""
    for path, stamp in changes.items():
        if stamp is None:
            register.forget(path)
        else:
            register.record(path, FileReadStamp.from_dict(stamp))
