"""Starting the unpack process for one layer and reading its verdict.

The layer is unpacked by ``python -m toolpool.images.unpack`` (never in the daemon, never
on its event loop): a process of its own, in a session of its own, under the rlimits of
``UnpackLimits``, killed when it outlives ``timeout``. It gets the layer's fd (the blob
or the outer tar, with the byte range) and no other. A process killed by a limit
(CPU's SIGXCPU, the hard limit's SIGKILL, the timeout) is ``limit_exceeded`` too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolpool.images.errors import ImageError
from toolpool.images.formats import LayerSource
from toolpool.sandbox.policy import DEFAULT_PATH

XattrKind = Literal["trusted", "user"]


# The default bound on one layer (its uncompressed tar, what it writes).
MAX_LAYER_BYTES = 16 << 30


@dataclass(frozen=True, slots=True)
class UnpackLimits:
    """The bounds one layer's unpack runs under. ``max_bytes`` bounds both the layer's
    uncompressed tar and what it writes (a sparse file counts at its full size);
    ``max_entries`` its members; the rest are the unpack process's rlimits and a wall
    clock guard."""

    max_bytes: int = MAX_LAYER_BYTES
    max_entries: int = 500_000
    cpu_seconds: int = 600
    address_space: int = 1 << 30
    open_files: int = 64
    timeout: float = 3600.0


@dataclass(frozen=True, slots=True)
class UnpackReport:
    """What one unpack made: members read, bytes on disk, device nodes/fifos skipped."""

    entries: int
    bytes: int
    skipped: int


def run_unpack(
    layer: LayerSource, dest: Path, limits: UnpackLimits, xattr: XattrKind, owners: bool
) -> UnpackReport:
    """Unpack ``layer`` into the empty directory ``dest``; ImageError when refused."""
    job = {
        "fd": layer.blob.fd,
        "offset": layer.blob.offset,
        "size": layer.blob.size,
        "compression": layer.compression,
        "digest": layer.digest,
        "diff_id": layer.diff_id,
        "dest": str(dest),
        "xattr": xattr,
        "owners": owners,
        "max_bytes": limits.max_bytes,
        "max_entries": limits.max_entries,
        "cpu_seconds": limits.cpu_seconds,
        "address_space": limits.address_space,
        "open_files": limits.open_files,
    }
    package_parent = str(Path(__file__).resolve().parents[2])  # where toolpool is
    env = {"PATH": DEFAULT_PATH, "PYTHONPATH": package_parent, "LANG": "C.UTF-8"}
    process = subprocess.Popen(
        [sys.executable, "-s", "-m", "toolpool.images.unpack"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(layer.blob.fd,),
        env=env,
        cwd="/",
        start_new_session=True,
    )
    try:
        out, err = process.communicate(json.dumps(job).encode(), timeout=limits.timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise ImageError(
            f"unpacking layer {layer.diff_id} took longer than {limits.timeout} s",
            code="limit_exceeded",
        ) from None
    finally:
        if process.poll() is None:  # interrupted in the daemon: the unpack goes too
            process.kill()
            process.wait()
    return _verdict(layer, process.returncode, out, err, limits)


def _verdict(
    layer: LayerSource, returncode: int, out: bytes, err: bytes, limits: UnpackLimits
) -> UnpackReport:
    where = f"layer {layer.diff_id} ({layer.blob.name})"
    if returncode == -signal.SIGXCPU:
        raise ImageError(
            f"unpacking {where} used more than {limits.cpu_seconds} s of CPU",
            code="limit_exceeded",
        )
    if returncode == -signal.SIGKILL:
        raise ImageError(
            f"unpacking {where} was killed (past its CPU limit of {limits.cpu_seconds} s, "
            "or out of memory)",
            code="limit_exceeded",
        )
    try:
        report: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {returncode}"]
        raise ImageError(f"unpacking {where} failed: {last[0]}") from None
    if not report.get("ok"):
        raise ImageError(f"{where}: {report['message']}", code=report["code"])
    return UnpackReport(int(report["entries"]), int(report["bytes"]), int(report["skipped"]))


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all beneath it, whatever modes a layer gave its directories
    (an unprivileged owner cannot empty a directory it may not write)."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        os.chmod(path, 0o700)
        for top, dirs, _files in os.walk(path):
            for name in dirs:
                inner = os.path.join(top, name)
                if not os.path.islink(inner):  # os.walk lists a symlink to a directory here
                    os.chmod(inner, 0o700)
        shutil.rmtree(path)
    else:
        path.unlink()
