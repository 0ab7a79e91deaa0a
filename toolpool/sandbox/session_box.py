"""One sandbox per session: namespaces, mounts and network made once (SPEC V1).

    box = SessionSandbox.start(roots=[ws], network=False, tmp_bytes=..., socket_dir=d)
    command = spawn(box.socket_path, ["bash", "-c", "..."], ...)   # spawn.py
    ...
    box.close()   # every process of it ends, pasta too; the socket is removed

bubblewrap builds the sandbox as commands get it today (mounts.py: the host's root
read-only, the roots read-write, a private /tmp of ``tmp_bytes`` — now one per
session —, /run private, the masks; its own user, PID, IPC, UTS and network
namespaces) and runs the static helper (spawner.c, built by helper_binary.py) as its
pid 1. The helper is exec'd from a descriptor of the host's file, so nothing of it
is a path inside the sandbox, whatever its root is. It keeps CAP_SYS_ADMIN and
CAP_SETPCAP in the sandbox's user namespace — to make each command's PID and mount
namespaces and then drop every capability of the command — and serves requests on
a listening socket bound here, under ``socket_dir``, which the sandbox cannot see.

Offline the network namespace is empty; network-allowed, pasta connects it once
for the session (network.py's OutboundNetwork, SPEC X3); under a network policy it
is the session's own namespace (netns.py), where only its proxy listens (N3), and
the host's pathname Unix sockets are masked (unix_sockets.py, N9).

The helper exits when the pipe it holds from us closes: at ``close()``, or when this
process dies (whichever thread started it), and the kernel then ends every process
of the sandbox with its pid 1.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.sandbox import linux, seccomp
from toolpool.sandbox.command import RETRY_PAUSE_SECONDS, START_ATTEMPTS, count_retry
from toolpool.sandbox.helper_binary import HelperBuildError, spawner_binary
from toolpool.sandbox.mounts import HOST_ROOT, bwrap_mounts, hidden_from_sandbox
from toolpool.sandbox.network import NetworkSetupError, OutboundNetwork
from toolpool.sandbox.policy import Policy, active_policy
from toolpool.sandbox.profile import SandboxProfile, active_profile
from toolpool.sandbox.unix_sockets import mask_arguments, masked_sockets

START_SECONDS = 10.0  # until the helper says it serves (pasta's connection included)
_names = itertools.count(1)


class SandboxStartError(ToolError):
    """The session sandbox could not be started; the message says why and what to do.
    ``again``: it failed before it was ready, and starting it again may succeed."""

    def __init__(self, why: str, *, again: bool = False) -> None:
        super().__init__(
            f"The session sandbox could not be started: {why}. Run `toolpool doctor` to "
            "see which confinement mechanism is broken here.",
            code="sandbox_failed",
        )
        self.again = again


class SessionSandbox:
    """A running session sandbox: ``socket_path`` for spawn.py, ``pid`` its holder's
    host pid. Use from one thread at a time; ``close()`` ends it (idempotent)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        holder: int,
        socket_path: Path,
        lifeline: int,
        network: OutboundNetwork | None,
    ) -> None:
        self._process = process
        self.pid = holder
        self._holder_fd = os.pidfd_open(holder)
        self.socket_path = socket_path
        self._lifeline = lifeline
        self._network = network
        self._closed = False

    @classmethod
    def start(
        cls,
        *,
        roots: Sequence[Path],
        network: bool,
        tmp_bytes: int,
        socket_dir: Path,
        policy: Policy | None = None,
        profile: SandboxProfile | None = None,
        root: Sequence[str] = HOST_ROOT,
        views: Mapping[str, str] | None = None,
        enter: Sequence[str] = (),
        netns: int | None = None,
        unix_sockets: Sequence[str] | None = None,
    ) -> SessionSandbox:
        """Start a session sandbox with ``roots`` writable (the first is the
        workspace), each bound from its ``views`` entry where it has one (V14), under
        ``enter`` (into the namespaces its layers are mounted in, V17). ``netns``: a
        policy session's network namespace (an fd, netns.py) to run in instead of a
        new one (N3); ``unix_sockets``: then the pathname sockets outside the roots
        that stay reachable, every other one masked (N9). A
        start that fails before the helper is ready is tried again,
        up to START_ATTEMPTS in all (SPEC X12). Raises SandboxStartError."""
        policy = policy or active_policy()
        profile = profile or active_profile()
        if not roots:
            raise SandboxStartError("no root was given (the workspace comes first)")
        if not profile.active("bwrap"):
            raise SandboxStartError("bubblewrap is off here (it builds the session sandbox)")
        if not hidden_from_sandbox(socket_dir, roots, policy):
            raise SandboxStartError(
                f"the socket directory {socket_dir} would be visible inside the sandbox"
            )
        try:
            helper = spawner_binary()
        except HelperBuildError as exc:
            raise SandboxStartError(str(exc)) from exc
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return cls._start_once(
                    helper,
                    roots,
                    network,
                    tmp_bytes,
                    socket_dir,
                    policy,
                    profile,
                    root,
                    views,
                    enter,
                    netns,
                    unix_sockets,
                )
            except SandboxStartError as exc:
                if not exc.again or attempt == START_ATTEMPTS:
                    raise
            count_retry()
            time.sleep(RETRY_PAUSE_SECONDS)
        raise AssertionError("unreachable")  # the loop returns or raises

    @classmethod
    def _start_once(
        cls,
        helper: Path,
        roots: Sequence[Path],
        network: bool,
        tmp_bytes: int,
        socket_dir: Path,
        policy: Policy,
        profile: SandboxProfile,
        root: Sequence[str],
        views: Mapping[str, str] | None,
        enter: Sequence[str],
        netns: int | None = None,
        unix_sockets: Sequence[str] | None = None,
    ) -> SessionSandbox:
        # Short: a socket's path must fit in 108 bytes, whatever socket_dir is.
        path = socket_dir / f"{os.getpid():x}.{next(_names):x}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        opened: list[int] = []  # descriptors to close once the holder has them
        process: subprocess.Popen[bytes] | None = None
        net: OutboundNetwork | None = None
        lifeline_w = -1
        try:
            listener.bind(str(path))
            os.chmod(path, 0o600)
            listener.listen(128)
            ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
            lifeline_r, lifeline_w = os.pipe2(os.O_CLOEXEC)
            binary = os.open(helper, os.O_RDONLY | os.O_CLOEXEC)
            opened += [ready_r, ready_w, lifeline_r, binary]
            filter_fd = -1
            if profile.active("seccomp"):
                filter_fd = seccomp.bpf_fd("command")
                opened.append(filter_fd)
            argv = [*enter, *_bwrap_argv(roots, tmp_bytes, policy, root, views, bool(enter))]
            pass_fds = [listener.fileno(), ready_w, lifeline_r, binary]
            pass_fds += [filter_fd] if filter_fd >= 0 else []
            if netns is not None:
                # Into the session's namespace first: bubblewrap then keeps it.
                nsenter = shutil.which("nsenter") or "nsenter"
                argv = [nsenter, f"--net=/proc/self/fd/{netns}", *argv]
                pass_fds.append(netns)
            if unix_sockets is not None:
                argv += mask_arguments(masked_sockets(roots, policy, unix_sockets))
            info_r = info_w = -1
            if network:
                net = OutboundNetwork()
                argv += net.bwrap_args()
                pass_fds += net.pass_fds()
            else:
                if netns is None:
                    argv.append("--unshare-net")
                info_r, info_w = os.pipe2(os.O_CLOEXEC)
                opened += [info_r, info_w]
                argv += ["--info-fd", str(info_w)]
                # bubblewrap holds a reader of its own: were we to die as it writes
                # there, SIGPIPE would end it before it let the sandbox's pid 1 go on,
                # and that would wait for it forever (the helper closes the copy).
                pass_fds += [info_w, info_r]
            argv += ["--", f"/proc/self/fd/{binary}", str(listener.fileno())]
            argv += [str(filter_fd), str(ready_w), str(lifeline_r)]
            process = subprocess.Popen(
                argv,
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for fd in (ready_w, lifeline_r, binary, filter_fd):
                if fd >= 0:
                    os.close(fd)
                    opened.remove(fd)
            if net is not None:
                net.start(START_SECONDS)
                holder = net.child_pid
            else:
                os.close(info_w)
                opened.remove(info_w)
            _wait_ready(ready_r, process)
            if net is None:
                holder = _read_info(info_r)
            assert holder is not None
            box = cls(process, holder, path, lifeline_w, net)
            # The helper alone holds the listening socket now: when it ends, so does
            # the socket, and a command asked of it then is refused at once (ECONNREFUSED,
            # or its queued connection reset), not left to wait for a ready byte.
            listener.close()
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.close(lifeline_w)
            if net is not None:
                net.close(wait=True)
            why = _failure(process)
            listener.close()
            with contextlib.suppress(OSError):
                path.unlink()
            if isinstance(exc, NetworkSetupError):
                raise SandboxStartError(f"the outbound network: {exc}", again=exc.again) from exc
            if isinstance(exc, _NotReady):
                raise SandboxStartError(f"bubblewrap failed ({why})", again=True) from exc
            if isinstance(exc, OSError):
                raise SandboxStartError(str(exc)) from exc
            raise
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return box

    def alive(self) -> bool:
        """Whether the holder (and so the sandbox) still runs."""
        if self._closed:
            return False
        return not linux.readable(self._holder_fd, 0)

    def close(self) -> None:
        """End every process of the sandbox (pasta too), reap them, remove the socket.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        os.close(self._lifeline)  # the holder exits on this alone
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self._holder_fd, signal.SIGKILL)
        _reap(self._process)
        if self._process.stderr is not None:
            self._process.stderr.close()
        os.close(self._holder_fd)
        if self._network is not None:
            self._network.close(wait=True)
            self._network = None
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

    def __enter__(self) -> SessionSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NotReady(Exception):
    """The holder ended (or bubblewrap failed) before it said it serves."""


def _bwrap_argv(
    roots: Sequence[Path],
    tmp_bytes: int,
    policy: Policy,
    root: Sequence[str],
    views: Mapping[str, str] | None,
    entered: bool = False,
) -> list[str]:
    """bubblewrap's command line, but the network part and the helper's own. In the
    namespaces of a session's layers (``entered``, V17) the commands are uid 0 there,
    so that what the daemon's user owns — an image it unpacked — is root's for them."""
    uid, gid = (0, 0) if entered else (os.getuid(), os.getgid())
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--unshare-pid", "--as-pid-1"]
    argv += ["--unshare-ipc", "--unshare-uts", "--uid", str(uid), "--gid", str(gid)]
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
    argv += ["--cap-add", "CAP_SYS_RESOURCE"]  # to set max_user_namespaces to 0
    argv += bwrap_mounts(roots, policy, tmp_bytes, root, views)
    return [*argv, "--chdir", str(roots[0])]


def _wait_ready(ready: int, process: subprocess.Popen[bytes]) -> None:
    """Until the holder's ready byte; _NotReady when it ends without one."""
    if not linux.readable(ready, START_SECONDS):
        process.kill()
        raise _NotReady()
    if os.read(ready, 1) != b"1":
        raise _NotReady()


def _read_info(info: int) -> int:
    """The holder's host pid, from bubblewrap's --info-fd (written before the ready
    byte, so all of it is there)."""
    data = b""
    while chunk := os.read(info, 4096):
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])
    raise OSError("bubblewrap did not report its child")


def _failure(process: subprocess.Popen[bytes] | None) -> str:
    """What bubblewrap said on its way out (the process is reaped)."""
    if process is None:
        return "it did not start"
    if process.poll() is None:
        process.kill()
    _reap(process)
    said = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.stderr is not None:
        process.stderr.close()
    lines = said.strip().splitlines()
    return lines[-1] if lines else f"exit status {process.returncode}"


def _reap(process: subprocess.Popen[bytes]) -> None:
    """Wait for bubblewrap to end, on a pidfd (Popen.wait's timeout polls coarsely);
    it ends as soon as its child, the holder, has."""
    with contextlib.suppress(OSError):
        fd = os.pidfd_open(process.pid)
        try:
            if not linux.readable(fd, START_SECONDS):
                process.kill()
        finally:
            os.close(fd)
    process.wait()
