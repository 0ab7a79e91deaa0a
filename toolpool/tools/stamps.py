"""The file tools' side of the file-read register (SPEC F2, F3, F5).

``read`` records a stamp of what it read; ``edit`` and ``write`` check again at
execute time, against the bytes they are about to replace, that those are the bytes
the model read (the pipeline's ``validate`` ran earlier, and the file may have moved
since); after writing they record a stamp of what they wrote.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.file_reads import CODE_NOT_READ, CODE_STALE, FileReadStamp, content_hash
from toolpool.tool import ToolContext
from toolpool.tools.paths import display


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A file's bytes with its mtime and size as they were *before* the bytes were
    read: a change made during the read then shows as a moved mtime, never hidden."""

    data: bytes
    mtime_ns: int
    size: int

    @classmethod
    def take(cls, path: Path) -> Snapshot:
        """Read ``path``. Raises OSError as ``open`` does."""
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return cls(f.read(), st.st_mtime_ns, st.st_size)

    @classmethod
    def written(cls, data: bytes, st: os.stat_result) -> Snapshot:
        """What a write left behind: ``data``, with the stat of the file written."""
        return cls(data, st.st_mtime_ns, st.st_size)

    def stamp(self, *, partial: bool) -> FileReadStamp:
        return FileReadStamp(
            time.time(), self.mtime_ns, self.size, content_hash(self.data), partial
        )


def record(ctx: ToolContext, path: Path, snapshot: Snapshot, *, partial: bool) -> None:
    """F2/F5: remember in the session's register what the model now knows of ``path``."""
    ctx.files.record(path, snapshot.stamp(partial=partial))


def ensure_unchanged_since_read(ctx: ToolContext, path: Path, current: bytes | None) -> None:
    """F3 once more, at execute time, against ``current`` (the bytes about to be
    replaced; None when the file does not exist, which needs no read).

    Raises a ToolError whose details carry the F3 code: 2 when the file was never
    read or only partly, 3 when its content is not what was read.
    """
    if current is None:
        return
    shown = display(path, ctx)
    stamp = ctx.files.get(path)
    if stamp is None or stamp.partial:
        how = "has not been read" if stamp is None else "was only partly read"
        raise ToolError(
            f"File {shown} {how}. Read the whole file first before writing to it.",
            details={"validation_code": CODE_NOT_READ},
        )
    if content_hash(current) != stamp.content_hash:
        raise ToolError(
            f"File {shown} changed since it was read (by the user, a linter or another "
            "program); nothing was written. Read it again before writing to it.",
            details={"validation_code": CODE_STALE},
        )
