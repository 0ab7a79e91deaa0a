"""Copies of what the model read, so that a stale refusal can show what changed
(SPEC F9).

The register keeps stamps (hashes), not contents. Each whole read (and each write,
which the model knows the content of) keeps a copy of the file's bytes in the
session's scratch directory, ``reads/<content hash>``: content-addressed, so a file
read ten times is one copy, and any worker of the session — or the daemon, which
validates — finds it from the stamp alone. Copies are best effort and bounded: files
over ``MAX_COPY_BYTES`` get none, and past ``MAX_COPIES_BYTES`` the least recently
kept go first. Without a copy, the refusal falls back to the current content or
to a plain refusal. The directory goes with the session's scratch (SPEC X8).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from toolpool.file_reads import content_hash

COPIES_DIR = "reads"
MAX_COPY_BYTES = 1024 * 1024
MAX_COPIES_BYTES = 32 * 1024 * 1024


def keep(scratch_dir: Path | None, data: bytes) -> None:
    """Keep a copy of ``data`` under its hash; quietly nothing when it cannot be."""
    if scratch_dir is None or len(data) > MAX_COPY_BYTES:
        return
    directory = scratch_dir / COPIES_DIR
    name = content_hash(data)
    temp: Path | None = None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.utime(directory / name)  # kept already: now the most recent
            return
        except FileNotFoundError:
            pass
        temp = directory / f".{name}.{secrets.token_hex(4)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(data)
        # Renamed whole: a worker reading the copy meanwhile sees all of it or nothing.
        os.replace(temp, directory / name)
        _evict(directory)
    except OSError:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def load(scratch_dir: Path | None, hash_: str) -> bytes | None:
    """The copy kept of the content whose hash is ``hash_``, None when there is none
    (never kept, evicted, or not that content any more)."""
    if scratch_dir is None or not hash_.isalnum():
        return None
    try:
        fd = os.open(scratch_dir / COPIES_DIR / hash_, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with open(fd, "rb") as f:
        data = f.read(MAX_COPY_BYTES + 1)
    return data if content_hash(data) == hash_ else None


def _evict(directory: Path) -> None:
    """Remove the least recently kept copies while they hold over MAX_COPIES_BYTES."""
    copies = []
    for entry in os.scandir(directory):
        if not entry.name.startswith("."):
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                copies.append((st.st_mtime_ns, st.st_size, entry.path))
    total = sum(size for _, size, _ in copies)
    for _, size, path in sorted(copies):
        if total <= MAX_COPIES_BYTES:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size
