"""Starting one command in a session sandbox: the client of spawner.c (SPEC V2).

    command = spawn(box.socket_path, ["bash", "-c", cmd], env=env, cwd=str(ws),
                    stdin=r, stdout=w, stderr=w, cgroup_procs=own_cgroup_procs(),
                    rlimits=current_rlimits(), extra_fds=[state_w])
    if command.wait_ready(timeout=5) is False:
        print(command.failure)          # it failed before the command ran
    code = command.wait()               # shell convention: 128 + signal
    command.close()                     # ends whatever it left running

One connection per command. The helper clones the command an init of its own, in
new PID and mount namespaces nested in the session's; the init joins the cgroups
whose ``cgroup.procs`` we pass (opened here, so the kernel checks the write against
us), mounts its own /proc and starts the command with every layer on. Closing the
connection, or ``kill()``, ends the init and so, by the kernel, every process of the
command: setsid, nohup and double-forked ones included. Each reply carries the
init's pid as this process sees it (SCM_CREDENTIALS), which ``pid`` is.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolpool.sandbox import linux
from toolpool.sandbox.cgroups import discover

_MAGIC = 0x31535054  # "TPS1", as spawner.c
_HEADER = struct.Struct("<8I")
_RLIMIT = struct.Struct("<IIQQ")
_CHUNK = 32 * 1024  # payload bytes per message (well under the socket's buffer)
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_IGNORE_SIGXFSZ = 1  # the request's flag, as spawner.c
SEND_SECONDS = 10.0  # the request's own sending; a helper that does not read is gone


class SpawnError(OSError):
    """The request could not be handed to the sandbox (it is gone, or refused it)."""


def _limit(value: int) -> int:
    return 2**64 - 1 if value == resource.RLIM_INFINITY else value


_RLIMITS = sorted({getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")})


def current_rlimits() -> dict[int, tuple[int, int]]:
    """Every rlimit of this process: what a child of ours would inherit."""
    return {number: resource.getrlimit(number) for number in _RLIMITS}


_own_procs: tuple[int, list[Path]] = (0, [])  # (our pid, our cgroup.procs files)


def own_cgroup_procs() -> list[int]:
    """The ``cgroup.procs`` of this process's own cgroup in every hierarchy where it
    may place processes, opened for writing (close them when done): a command that
    joins them is counted and limited as our own child would be (SPEC X7). Where they
    are is looked up once per process (a worker stays in its cgroups; reading the
    mount table costs more than the rest of a start), and again if one is gone."""
    global _own_procs
    pid = os.getpid()
    for fresh in (False, True):
        if fresh or _own_procs[0] != pid:
            _own_procs = (pid, [h.own / "cgroup.procs" for h in discover()])
        opened: list[int] = []
        try:
            for procs in _own_procs[1]:
                opened.append(os.open(procs, os.O_WRONLY | os.O_CLOEXEC))
        except BaseException as exc:
            for fd in opened:
                os.close(fd)
            if fresh or not isinstance(exc, FileNotFoundError):
                raise
            continue
        return opened
    raise AssertionError("unreachable: the second look returns or raises")


class SpawnedCommand:
    """One command started in a session sandbox; see the module docstring."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.pid: int | None = None  # the init's pid here, once it replied
        self._pidfd: int | None = None
        self.ready: bool | None = None
        self.failure: str | None = None  # why it failed before the command
        self.returncode: int | None = None
        self.exit_reported = False  # the init said how the command ended
        self._gone = False  # the init's end of the connection closed

    def fileno(self) -> int:
        """Readable whenever a reply (ready, failure, exit) or the end arrived."""
        return self._sock.fileno()

    def _receive(self, timeout: float | None) -> bool:
        """Take one reply if one comes within ``timeout``; False when none did."""
        if self._gone:
            return False
        if not linux.readable(self._sock, timeout):
            return False
        try:
            data, ancillary, _, _ = self._sock.recvmsg(
                1024, socket.CMSG_SPACE(_CREDS.size), socket.MSG_DONTWAIT
            )
        except BlockingIOError:
            return True
        except OSError:
            data, ancillary = b"", []
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = _CREDS.unpack(value[: _CREDS.size])[0]
                if self.pid is None and pid > 0:
                    self.pid = pid
                    with contextlib.suppress(OSError):
                        self._pidfd = os.pidfd_open(pid)
        if not data:
            self._gone = True
            if self.ready is None:
                self.ready, self.failure = False, "the sandbox ended before the command started"
            if self.returncode is None:
                self.returncode = 128 + 9  # ended with its namespace, never reported
            return True
        kind_byte, body = data[:1], data[1:]
        if kind_byte == b"R":
            self.ready = True
        elif kind_byte == b"F":
            self.ready, self.failure = False, body.decode(errors="replace")
        elif kind_byte == b"X" and len(body) == 4:
            self.returncode = _exit_code(struct.unpack("<i", body)[0])
            self.exit_reported = True
            if self.ready is None:
                self.ready = True
        return True

    def wait_ready(self, timeout: float | None) -> bool | None:
        """True: the command was started (every layer on, exec'd); False: it failed
        before the command (``failure`` says why; nothing of it ran); None: neither
        within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.ready is None and not self._gone:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not self._receive(left) and left == 0:
                break
        return self.ready

    def poll(self) -> int | None:
        """The command's exit code (128 + signal when a signal ended it), or None."""
        while self.returncode is None and self._receive(0):
            continue
        return self.returncode

    def ended(self) -> bool:
        """Whether its init, and so every process of the command, is gone: the kernel
        ends the processes of a PID namespace before its init's exit shows."""
        if self._pidfd is None:  # closed, or its init was gone when its pid came
            return self._gone or self.pid is not None
        return linux.readable(self._pidfd, 0)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code once the command ended; None if not within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not self._receive(left) and left == 0:
                break
        return self.returncode

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the command (its init forwards it)."""
        with contextlib.suppress(OSError):
            self._sock.send(b"S" + struct.pack("<i", sig), socket.MSG_DONTWAIT)

    def kill(self) -> None:
        """End every process of the command now (its init exits: the kernel ends its
        PID namespace)."""
        with contextlib.suppress(OSError):
            self._sock.send(b"K", socket.MSG_DONTWAIT)
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self, wait: bool = True) -> None:
        """End whatever of the command still runs and let go of the connection;
        with ``wait``, return once its init (so every process of it) is gone."""
        self._sock.close()
        if self._pidfd is not None:
            if wait:
                linux.readable(self._pidfd, SEND_SECONDS)
            os.close(self._pidfd)
            self._pidfd = None

    def __enter__(self) -> SpawnedCommand:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def spawn(
    socket_path: Path,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    stdin: int,
    stdout: int,
    stderr: int,
    cgroup_procs: Sequence[int] = (),
    rlimits: Mapping[int, tuple[int, int]] | None = None,
    extra_fds: Sequence[int] = (),
    ignore_sigxfsz: bool = False,
) -> SpawnedCommand:
    """Start ``argv`` in the session sandbox serving ``socket_path``: ``env`` exactly
    as given, in ``cwd``, with these stdio fds, joined to the cgroups whose
    ``cgroup.procs`` fds are given, with ``rlimits`` (resource → soft, hard), and
    ``extra_fds`` as its fd 3, 4, …; with ``ignore_sigxfsz``, SIGXFSZ ignored (a
    write past RLIMIT_FSIZE fails with EFBIG). The caller keeps (and closes) its fds.
    Raises SpawnError when the sandbox cannot be reached."""
    if not argv:
        raise ValueError("argv is empty")
    limits = rlimits or {}
    strings = [cwd, *argv, *(f"{k}={v}" for k, v in env.items())]
    if any("\0" in s for s in strings):
        raise ValueError("a NUL byte in argv, env or cwd")
    payload = b"".join(_RLIMIT.pack(r, 0, _limit(s), _limit(h)) for r, (s, h) in limits.items())
    payload += b"".join(os.fsencode(s) + b"\0" for s in strings)
    flags = _IGNORE_SIGXFSZ if ignore_sigxfsz else 0
    counts = (len(cgroup_procs), len(extra_fds), len(argv), len(env), len(limits))
    header = _HEADER.pack(_MAGIC, *counts, flags, len(payload))
    fds = [stdin, stdout, stderr, *cgroup_procs, *extra_fds]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.settimeout(SEND_SECONDS)
        sock.connect(str(socket_path))
        sock.sendmsg(
            [header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        )
        for at in range(0, len(payload), _CHUNK):
            sock.sendall(payload[at : at + _CHUNK])
        sock.settimeout(None)
    except OSError as exc:
        sock.close()
        raise SpawnError(f"cannot reach the session sandbox at {socket_path}: {exc}") from exc
    return SpawnedCommand(sock)
