"""Where a user's daemon lives: a private runtime directory and its endpoint file.

Shared by the daemon (which writes them) and the client (which reads them); knows
nothing else of either. The directory is ``$TOOLPOOL_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/toolpool``, else ``/tmp/toolpool-<uid>``; it must be owned by the
user and closed to everyone else (mode 0700), because whoever can open the socket in
it can run commands as the user.

The client trusts nothing it finds there until it checked it (SPEC X10,
``read_trusted_endpoint``): the directory, the endpoint file and the socket it names must
be the user's own and writable by no one else. Sessions' scratch directories live in
``scratch-<daemon pid>`` inside it (SPEC X8, ``private_dir``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError

SOCKET_NAME = "daemon.sock"
ENDPOINT_NAME = "daemon.json"
PID_NAME = "daemon.pid"
SCRATCH_PREFIX = "scratch-"  # + the daemon's pid: its sessions' scratch directories
SPILL_PREFIX = "spill-"  # + the daemon's pid: frames waiting for clients that do not read
# The audit log's path, written by the last daemon started here with one (SPEC R1): what
# ``toolpool audit`` reads when no configuration names a log. Left when it stops.
AUDIT_NAME = "audit-log"


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def spill_name(call_id: str, suffix: str) -> str:
    """A fresh file name for a call's spill file: the call id (the model's choice, so
    anything: "../x") cut to letters, digits, ``_`` and ``-``, and a random part, so
    that no id names a path elsewhere or an earlier call's file."""
    return f"{_UNSAFE_NAME.sub('_', call_id)[:64] or 'call'}-{uuid.uuid4().hex[:8]}{suffix}"


class RuntimeDirError(ToolpoolError):
    """The runtime directory is not private to this user."""


class PathSettingError(ToolpoolError, ValueError):
    """A path a setting names cannot be used (made, opened): the message names the
    setting, the path and why (SPEC E8) — a configuration error, never a raw OS one."""


@contextlib.contextmanager
def path_setting(setting: str, path: Path, doing: str) -> Iterator[None]:
    """Within it, an OSError about ``path`` (or a RuntimeDirError) is a
    PathSettingError: ``runtime_dir = '/x': it cannot be made: Permission denied``."""
    try:
        yield
    except OSError as exc:
        where = "" if exc.filename in (None, str(path)) else f" ({exc.filename})"
        why = exc.strerror or str(exc)
        raise PathSettingError(f"{setting} = {str(path)!r}: {doing}: {why}{where}") from None
    except RuntimeDirError as exc:
        raise PathSettingError(f"{setting} = {str(path)!r}: {exc}") from None


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


def private_dir(path: Path) -> Path:
    """Create directory ``path`` with mode 0700 (its parent must exist) or take the
    existing one if it is ours; either way check it after: a real directory (not a
    symlink), owned by us, mode 0700."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"{path} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def running_pid(runtime: Path) -> int | None:
    """The pid in the pid file, when that process is alive and is a toolpool daemon."""
    try:
        pid = int((runtime / PID_NAME).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"toolpool" in cmdline else None


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rfind(b")") + 2 : state.rfind(b")") + 3] != b"Z"


def last_audit_log(directory: Path) -> Path | None:
    """The audit log of the last daemon started in ``directory`` with one (SPEC R1),
    once the directory is checked (ours, X10); None when there was none."""
    try:
        check_trusted_dir(directory)
        return Path((directory / AUDIT_NAME).read_text().strip()) or None
    except FileNotFoundError:
        return None


def read_endpoint(directory: Path) -> dict[str, Any] | None:
    """The endpoint file a running daemon wrote, or None."""
    try:
        data = json.loads((directory / ENDPOINT_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# What the client checks before it trusts the runtime directory (SPEC X10). Others may
# read or search the directory without harm to the client (the daemon closes it to
# them, 0700, at every start): only a directory or file that someone else owns or may
# write to can hold an endpoint file or a socket they put there.
_WRITABLE_BY_OTHERS = 0o022
MAX_ENDPOINT_BYTES = 64 * 1024


def _untrusted(path: Path, st: os.stat_result, what: str, fix: str) -> str | None:
    me = os.getuid()
    if st.st_uid != me:
        return f"{path} ({what}) belongs to uid {st.st_uid}, not to you (uid {me}); {fix}"
    if st.st_mode & _WRITABLE_BY_OTHERS:
        mode = oct(stat.S_IMODE(st.st_mode))
        return f"{path} ({what}, uid {st.st_uid}) is writable by others (mode {mode}); {fix}"
    return None


def check_trusted_dir(path: Path, what: str = "runtime dir") -> None:
    """``path`` is a directory (not a symlink) of ours that no one else may write to.
    Raises FileNotFoundError when it does not exist, RuntimeDirError when untrusted."""
    st = os.lstat(path)
    fix = (
        "toolpool will not use it: remove it, or set TOOLPOOL_RUNTIME_DIR to a directory "
        "of your own (the daemon makes it mode 0700)"
    )
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise RuntimeDirError(f"{path} ({what}, uid {st.st_uid}) is {kind}; {fix}")
    problem = _untrusted(path, st, what, fix)
    if problem:
        raise RuntimeDirError(problem)


def read_trusted_endpoint(directory: Path) -> dict[str, Any] | None:
    """The endpoint file in ``directory`` once the directory, the file and the ipc
    socket it names are checked (ours, writable by no one else, no symlinks); None
    when there is no directory or no endpoint file. Raises RuntimeDirError."""
    try:
        check_trusted_dir(directory)
    except FileNotFoundError:
        return None
    path = directory / ENDPOINT_NAME
    fix = "remove it (toolpool daemon stop; rm it if no daemon runs) and start the daemon again"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            owner = os.lstat(path).st_uid
            raise RuntimeDirError(
                f"{path} (endpoint file, uid {owner}) is a symlink; {fix}"
            ) from None
        raise RuntimeDirError(f"cannot open the endpoint file {path}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise RuntimeDirError(f"{path} (endpoint file) is not a regular file; {fix}")
        problem = _untrusted(path, st, "endpoint file", fix)
        if problem:
            raise RuntimeDirError(problem)
        try:
            data = json.loads(f.read(MAX_ENDPOINT_BYTES))
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    ipc = data.get("ipc")
    if isinstance(ipc, str) and ipc.startswith("ipc://"):
        check_trusted_socket(Path(ipc.removeprefix("ipc://")))
    return data


def check_trusted_socket(path: Path) -> None:
    """The daemon's ipc socket: a socket (not a symlink) of ours that no one else may
    write to, in a directory that passes ``check_trusted_dir``. A missing socket is
    left to the connection to report."""
    try:
        check_trusted_dir(path.parent, "the daemon socket's directory")
    except FileNotFoundError:
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    fix = "toolpool will not connect to it: stop that daemon, remove the file, start again"
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a socket"
        raise RuntimeDirError(f"{path} (daemon socket, uid {st.st_uid}) is {kind}; {fix}")
    problem = _untrusted(path, st, "daemon socket", fix)
    if problem:
        raise RuntimeDirError(problem)
