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

Eviction looks at the directory (a stat of every copy) only when the bound may have
been passed: each process remembers the total it saw at its last look and what it
kept since, and looks again when that would pass ``MAX_COPIES_BYTES`` or when it
kept ``RESCAN_BYTES`` since (other processes of the session keep copies too, which
only a look sees). So the copies of a session stay within ``MAX_COPIES_BYTES`` plus
at most ``RESCAN_BYTES`` per process keeping them, and a keep costs one write, not
a scan of every copy the session has.
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
RESCAN_BYTES = 4 * 1024 * 1024
_MAX_DIRECTORIES = 256  # sessions remembered (a worker serves many, one after another)

# Per copies directory: [the total seen at this process's last look, bytes kept since].
_seen: dict[Path, list[int]] = {}


def keep(scratch_dir: Path | None, data: bytes) -> None:
    """Keep a copy of ``data`` under its hash; quietly nothing when it cannot be."""
    if scratch_dir is None or len(data) > MAX_COPY_BYTES:
        return
    directory = scratch_dir / COPIES_DIR
    name = content_hash(data)
    temp: Path | None = None
    seen = _seen.get(directory)
    try:
        if seen is None:
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
        _account(directory, seen, len(data))
    except OSError:
        _seen.pop(directory, None)  # the directory may be gone: make it anew next time
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


def _account(directory: Path, seen: list[int] | None, size: int) -> None:
    """Count a copy of ``size`` bytes just kept; evict when the bound may be passed."""
    if seen is not None:
        total, since = seen[0], seen[1] + size
        if total + since <= MAX_COPIES_BYTES and since < RESCAN_BYTES:
            seen[1] = since
            return
    if seen is None and len(_seen) >= _MAX_DIRECTORIES:
        del _seen[next(iter(_seen))]  # the longest remembered
    _seen[directory] = [_evict(directory), 0]


def _evict(directory: Path) -> int:
    """Remove the least recently kept copies while they hold over MAX_COPIES_BYTES;
    the bytes left."""
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
    return total
