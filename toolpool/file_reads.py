"""The session's file-read register (SPEC F2, F13): what the session was shown of each
file, and where a file stands against it (``freshness``).

``read`` records a stamp for every file it reads; ``edit`` and ``write`` ask the
register whether the file was read in full and has not changed since (F3: the check
and its refusals are the file tools', ``tools/support/stamps.py``). One register per
session, shared by read, edit and write.

A stamp names one content of the file (its hash) and which parts of it the session
was shown (``read_coverage.py``): the reads of one content add up, and a file whose
lines were all shown, in one read or in several, is read whole. Recording a stamp of
the same content as the one held adds its parts; a stamp of another content (the
file changed) replaces it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from toolpool.read_coverage import Part, combined, covers, missing, narrowed, settled


def content_hash(data: bytes) -> str:
    """The register's content token: a BLAKE2b digest (fast, and collisions are moot)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class FileReadStamp:
    """What the session knew of a file (F2): the stat and hash of one content of it,
    when it was last read, how many lines ``read`` numbers in it (``lines``; 0 when
    no text read counted them) and the parts of it the session was shown
    (``shown``). ``partial``: those parts do not make the whole content."""

    read_at: float
    mtime_ns: int
    size: int
    content_hash: str
    lines: int = 0
    shown: tuple[Part, ...] = ()
    partial: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partial", not covers(self.shown, self.lines))

    @classmethod
    def of(
        cls, path: str | os.PathLike[str], data: bytes, *, partial: bool, call_id: str = ""
    ) -> FileReadStamp:
        """Stamp ``path`` whose full content is ``data``, read just now: shown whole,
        or (``partial``) in a part that counts no line."""
        st = os.stat(path)
        now = time.time()
        shown = () if partial else (Part(now, 1, None, call_id),)
        return cls(now, st.st_mtime_ns, st.st_size, content_hash(data), shown=shown)

    def missing_lines(self) -> list[tuple[int, int]]:
        """The lines of this content no read showed (none when it is whole, or when
        its lines were never counted)."""
        return missing(self.shown, self.lines)

    def merged(self, newer: FileReadStamp) -> FileReadStamp:
        """``newer`` with what this stamp knows added, when both name one content (a
        read of other lines of it); ``newer`` alone otherwise (the file changed)."""
        if newer.content_hash != self.content_hash:
            return newer
        return FileReadStamp(
            newer.read_at,
            newer.mtime_ns,
            newer.size,
            newer.content_hash,
            newer.lines or self.lines,
            combined(self.shown, newer.shown),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "read_at": self.read_at,
            "mtime_ns": self.mtime_ns,
            "size": self.size,
            "content_hash": self.content_hash,
            "lines": self.lines,
            "shown": [part.to_list() for part in self.shown],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileReadStamp:
        return cls(
            read_at=float(data["read_at"]),
            mtime_ns=int(data["mtime_ns"]),
            size=int(data["size"]),
            content_hash=str(data["content_hash"]),
            lines=int(data.get("lines", 0)),
            shown=tuple(Part.from_list(part) for part in data.get("shown", ())),
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
        self._unsettled: set[str] = set()  # keys whose stamps hold parts a cut may take back
        self._lock = threading.Lock()

    @staticmethod
    def key(path: str | os.PathLike[str]) -> str:
        try:
            return os.path.realpath(path)
        except OSError:  # a link swapped mid-way (EINVAL from readlink): as spelled
            return os.path.abspath(path)

    def record(self, path: str | os.PathLike[str], stamp: FileReadStamp) -> FileReadStamp:
        """Hold ``stamp`` for ``path``, with the parts already held of the same
        content added (F13); the stamp now held."""
        return self._record(self.key(path), stamp)

    def _record(self, key: str, stamp: FileReadStamp) -> FileReadStamp:
        with self._lock:
            held = self._stamps.get(key)
            now = self._stamps[key] = stamp if held is None else held.merged(stamp)
            if any(part.call_id for part in now.shown):
                self._unsettled.add(key)
            return now

    def settle(self) -> None:
        """No cut can come any more for the reads recorded so far (their turn has
        ended): the parts of each stamp they touched become their union (F13), so
        that a file read every turn keeps one part, not one a turn."""
        with self._lock:
            for key in self._unsettled:
                stamp = self._stamps.get(key)
                if stamp is None:
                    continue
                # Shown whole (the usual case): one part says so; else their union.
                parts = (Part(stamp.read_at, 1, None, ""),) if not stamp.partial else None
                self._stamps[key] = FileReadStamp(
                    stamp.read_at,
                    stamp.mtime_ns,
                    stamp.size,
                    stamp.content_hash,
                    stamp.lines,
                    parts or settled(stamp.shown),
                )
            self._unsettled.clear()

    def get(self, path: str | os.PathLike[str]) -> FileReadStamp | None:
        return self.at_key(self.key(path))

    def at_key(self, key: str) -> FileReadStamp | None:
        """The stamp held under ``key`` (what ``key`` made of a path): a caller that
        has the key already resolves the path once, not twice."""
        with self._lock:
            return self._stamps.get(key)

    def forget(self, path: str | os.PathLike[str]) -> None:
        self._forget(self.key(path))

    def _forget(self, key: str) -> None:
        with self._lock:
            self._stamps.pop(key, None)
            self._unsettled.discard(key)

    def narrow(
        self,
        path: str | os.PathLike[str],
        *,
        call_id: str,
        since: float,
        kept: tuple[int, int] | None = None,
    ) -> bool:
        """The read ``call_id`` made of ``path`` at or after ``since`` showed only the
        lines ``kept`` (None: nothing of it counts), not what it recorded: its output
        was cut (SPEC L4). Other reads' parts stay. True when the file now counts as
        partly read because of it."""
        key = self.key(path)
        with self._lock:
            stamp = self._stamps.get(key)
            if stamp is None:
                return False
            shown, changed = narrowed(stamp.shown, call_id, since, kept)
            if not changed:
                return False
            now = FileReadStamp(
                stamp.read_at, stamp.mtime_ns, stamp.size, stamp.content_hash, stamp.lines, shown
            )
            self._stamps[key] = now
            return now.partial and not stamp.partial

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
    call, seeded with the stamps the coordinator sent, its changes sent back.

    Both ways a stamp travels under its key, resolved where it was made: each
    resolution of a path is a system call per component of it, and the register's
    paths were resolved a moment ago. (A path that resolves elsewhere by now has
    another key: its stamp is not found, and the file counts as never read.)"""

    def __init__(self, stamps: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__()
        for key, stamp in (stamps or {}).items():  # the register is empty: nothing to merge
            self._stamps[key] = FileReadStamp.from_dict(stamp)
        self.changes: dict[str, FileReadStamp | None] = {}

    def _record(self, key: str, stamp: FileReadStamp) -> FileReadStamp:
        now = self.changes[key] = super()._record(key, stamp)
        return now

    def _forget(self, key: str) -> None:
        super()._forget(key)
        self.changes[key] = None

    def changes_dict(self) -> dict[str, dict[str, Any] | None]:
        return {p: None if s is None else s.to_dict() for p, s in self.changes.items()}


def apply_changes(
    register: FileReadRegister, changes: Mapping[str, Mapping[str, Any] | None]
) -> None:
    """Apply what a worker's RecordingRegister recorded to the session's register
    (under the keys it made)."""
    # Every entry read before any is applied: changes that cannot all be read
    # change nothing (ValueError, TypeError or KeyError from the first bad one).
    stamps = [
        (str(key), None if stamp is None else FileReadStamp.from_dict(stamp))
        for key, stamp in changes.items()
    ]
    for key, read in stamps:
        if read is None:
            register._forget(key)
        else:
            register._record(key, read)
