"""Where a user's daemon lives: a private runtime directory and its endpoint file.

Shared by the daemon (which writes them) and the client (which reads them); knows
nothing else of either. The directory is ``$TOOLPOOL_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/toolpool``, else ``/tmp/toolpool-<uid>``; it must be owned by the
user and closed to everyone else (mode 0700), because whoever can open the socket in
it can run commands as the user.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError

SOCKET_NAME = "daemon.sock"
ENDPOINT_NAME = "daemon.json"
PID_NAME = "daemon.pid"


class RuntimeDirError(ToolpoolError):
    """The runtime directory is not private to this user."""


def runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("TOOLPOOL_RUNTIME_DIR"):
        return Path(env["TOOLPOOL_RUNTIME_DIR"])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "toolpool"
    return Path(f"/tmp/toolpool-{os.getuid()}")


def ensure_private(path: Path) -> Path:
    """Create ``path`` (mode 0700) or check that it is ours and private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"{path} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_endpoint(directory: Path) -> dict[str, Any] | None:
    """The endpoint file a running daemon wrote, or None."""
    try:
        data = json.loads((directory / ENDPOINT_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
