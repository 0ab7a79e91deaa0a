"""Confining a command a tool starts (bash): bubblewrap, then the exec wrapper.

    with confined(["bash", "-c", cmd], workspace=ws, network=False) as box:
        process = subprocess.Popen(box.argv, pass_fds=box.pass_fds, env=box.env, ...)
        box.started()
    if not box.wait_ready(timeout):  # False: the sandbox failed before the command
        ...                          # (may be started again: START_ATTEMPTS, SPEC X12)
    ...
    failure = box.failure(exit_code, output_head)  # the sandbox's own, or None

Each layer is applied when the active profile has it:
- bubblewrap: a new user namespace as our own uid (every capability set empty, no
  further user namespaces), a read-only view of /, the roots (workspace and ``writable``)
  read-write, a private /tmp (a tmpfs of ``tmp_bytes``) and /run, every hidden path
  of the policy (runtime dir, deny_read) masked, the interpreter and toolpool bound
  back wherever they are installed (X1); its own PID, IPC and UTS namespaces
  (ending bubblewrap ends every process inside, setsid daemons included), its own
  network namespace (empty offline, outbound-only online when the helper exists),
  dies with its parent, and the command seccomp filter, read from a memfd;
- without bubblewrap, the exec wrapper (confine_exec.py): every capability dropped,
  Landlock write rules (and TCP rules offline) and the seccomp filter. Under
  bubblewrap Landlock would add nothing that the read-only mounts and the empty
  network namespace do not already do, and its Python start-up would double the cost
  of a call, so it is not used there.

The environment is the policy's allowlist (X9), never the worker's.
The mount arguments are mounts.py's; the doctor's check of all this is selfcheck.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.errors import ToolError
from toolpool.sandbox import confine_exec, linux, seccomp
from toolpool.sandbox.mounts import HOST_ROOT, PRIVATE_HOME, bwrap_mounts
from toolpool.sandbox.network import NetworkSetupError, OutboundNetwork
from toolpool.sandbox.policy import Policy, active_policy
from toolpool.sandbox.profile import SandboxProfile, active_profile

# Device files every shell writes to; Landlock needs a rule for each.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
DEFAULT_TMP_BYTES = 256 * 1024 * 1024
NETWORK_SETUP_SECONDS = 10.0  # pasta connecting a network-allowed command's namespace
# A sandbox that fails before its command starts (bubblewrap under load: "loopback:
# Failed RTM_NEWADDR: No child processes") ran nothing of it: it is started again
# before the failure is reported (SPEC X12). A tool that retries counts it here: its
# worker reports the count with the call's usage (the pool's own shells count theirs).
# Three attempts: such failures come in runs (the bench's confinement scenario met two
# bubblewrap failures back to back; two network-allowed commands starting side by side
# saw pasta fail ~1 start in 8, twice in a row ~1 in 60, and 0 of 120 with a third
# attempt). Each retry waits a moment first: the next start then mostly succeeds.
START_ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 0.05
_retries = 0
_retries_lock = threading.Lock()


def count_retry() -> None:
    """A confined command's start is being retried (its sandbox failed before it)."""
    global _retries
    with _retries_lock:
        _retries += 1


def sandbox_retries() -> int:
    """How many confined starts this process retried so far (``count_retry``)."""
    return _retries


@dataclass(slots=True)
class Confinement:
    """How to start a confined command, and how to read what its sandbox said."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    layers: tuple[str, ...]
    env: dict[str, str]
    _status_fd: int | None = None  # the exec wrapper's "every layer is on" pipe
    _status: str | None = None
    _ready: bool | None = None  # what ``wait_ready`` found, once it found it
    _head: str = ""  # the first byte of the ready pipe, read by ``wait_ready``
    _network: OutboundNetwork | None = None  # the outbound-only namespace (X3)
    _network_started: bool = False
    _fds: list[int] = field(default_factory=list)

    def started(self) -> None:
        """Call once the process is spawned: the parent's copies of the descriptors
        it inherited are closed (so that the ready pipe ends with it), and a
        network-allowed command's namespace is connected before it may start.
        Raises ToolError (``sandbox_failed``) when that fails: kill the process."""
        self._close_inherited()
        if self._network is not None and not self._network_started:
            self._network_started = True
            try:
                self._network.start(NETWORK_SETUP_SECONDS)
            except NetworkSetupError as exc:
                raise NetworkNotConnected(exc) from exc

    def wait_ready(self, timeout: float | None) -> bool | None:
        """After ``started()``: whether the sandbox started the command (True: every
        layer in place, the command runs) or ended without starting it (False: it
        wrote no ready byte, so nothing of the command ran, and starting it again is
        safe); None when neither happened within ``timeout`` seconds (ask again).
        True at once without a sandbox."""
        if self._status_fd is None or self._ready is not None:
            return True if self._ready is None else self._ready
        if not linux.readable(self._status_fd, timeout):
            return None
        try:
            first = os.read(self._status_fd, 1)
        except OSError:
            first = b""
        self._head = first.decode(errors="replace")
        self._ready = first == b"1"
        return self._ready

    def finish(self) -> None:
        """Call once the process has ended: reads what the wrapper said and lets the
        network helper go (idempotent)."""
        self._close_inherited()
        if self._network is not None:
            self._network.close()
            self._network = None
        if self._status_fd is not None:
            self._status = self._head + _read_all(self._status_fd)
            self._status_fd = None

    def _close_inherited(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def failure(self, exit_code: int, output_head: str) -> str | None:
        """Why the sandbox itself failed to start the command, or None when the
        command ran (its exit code is its own). Call after the process ended."""
        self.finish()
        # The command inherits the pipe and may write to it too: only "nothing at all"
        # means the sandbox failed before it.
        if self._status is None or self._status.startswith("1"):
            return None
        lines = output_head.strip().splitlines()
        if lines and lines[0].startswith("toolpool sandbox:"):
            return _explain("the exec wrapper", lines[0])
        mechanism = "bubblewrap" if "bwrap" in self.layers else "the exec wrapper"
        return _explain(mechanism, lines[-1] if lines else f"exit status {exit_code}")


def _read_all(fd: int) -> str:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


class NetworkNotConnected(ToolError):
    """A network-allowed command's namespace could not be connected; its command
    never ran. ``again``: it may be started again (SPEC X12)."""

    def __init__(self, exc: NetworkSetupError) -> None:
        super().__init__(_explain("the outbound network", str(exc)), code="sandbox_failed")
        self.again = exc.again


def _explain(mechanism: str, why: str) -> str:
    return (
        f"The sandbox could not start the command: {mechanism} failed ({why}). "
        "Run `toolpool doctor` to see which confinement mechanism is broken here; "
        "an operator can switch one off with sandbox_disabled = [...]."
    )


def _bwrap(
    argv: Sequence[str],
    roots: Sequence[Path],
    cwd: Path,
    network: bool,
    profile: SandboxProfile,
    policy: Policy,
    tmp_bytes: int | None,
    box: Confinement,
    pass_fds: list[int],
    root: Sequence[str],
    views: Mapping[str, str] | None = None,
) -> list[str]:
    """bubblewrap's command line. The command runs in a new user namespace as our own
    uid, so every capability set (bounding included) is empty and cannot be regained,
    and it may make no user namespace of its own (X5); ``sh`` writes the ready byte
    and execs it."""
    outer = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--unshare-pid"]
    outer += ["--unshare-ipc", "--unshare-uts", "--unshare-user"]
    outer += ["--uid", str(os.getuid()), "--gid", str(os.getgid()), "--disable-userns"]
    outer += ["--cap-drop", "ALL"]
    outer += bwrap_mounts(roots, policy, tmp_bytes or DEFAULT_TMP_BYTES, root, views)
    if not network:
        outer.append("--unshare-net")
    elif profile.active("netns-outbound"):
        # Its own namespace, outbound only: this host's services stay out of reach.
        try:
            box._network = OutboundNetwork()
        except NetworkSetupError as exc:
            raise ToolError(
                _explain("the outbound network", str(exc)), code="sandbox_failed"
            ) from exc
        outer += box._network.bwrap_args()  # after the mounts: it binds a resolv.conf
        pass_fds += box._network.pass_fds()
    if profile.active("seccomp"):
        fd = seccomp.bpf_fd("command")
        box._fds.append(fd)
        pass_fds.append(fd)
        outer += ["--seccomp", str(fd)]
    ready = f'printf 1 >/proc/self/fd/{pass_fds[0]} && exec "$@"'
    start = ["/bin/sh", "-c", ready, "toolpool-sandbox", *argv]
    return [*outer, "--chdir", str(cwd), "--", *start]


def _wrapper(
    argv: Sequence[str],
    roots: Sequence[Path],
    network: bool,
    profile: SandboxProfile,
    box: Confinement,
    pass_fds: list[int],
) -> tuple[list[str], list[str]]:
    """Without bubblewrap, the exec wrapper does what it can: capabilities dropped,
    Landlock write (and TCP) rules, the seccomp filter."""
    wrapper = ["--ready-fd", str(pass_fds[0])]
    layers = []
    if os.geteuid() == 0:
        wrapper.append("--drop-caps")
        layers.append("no capabilities")
    if profile.active("landlock"):
        for root in [*roots, Path("/tmp")]:  # /tmp is shared here, but needed
            wrapper += ["--rw", str(root)]
        wrapper += [arg for d in _DEVICES if os.path.exists(d) for arg in ("--rw", d)]
        if not network:
            wrapper.append("--no-network")
        layers.append("landlock")
    if profile.active("seccomp"):
        fd = seccomp.bpf_fd("command")
        box._fds.append(fd)
        pass_fds.append(fd)
        wrapper += ["--seccomp", f"/proc/self/fd/{fd}"]
        layers.append("seccomp")
    command = [sys.executable, "-I", "-S", confine_exec.__file__, *wrapper, "--", *argv]
    return command, layers


@contextlib.contextmanager
def confined(
    argv: Sequence[str],
    *,
    workspace: Path,
    writable: Sequence[Path] = (),
    network: bool = False,
    profile: SandboxProfile | None = None,
    policy: Policy | None = None,
    tmp_bytes: int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    root: Sequence[str] = HOST_ROOT,
    views: Mapping[str, str] | None = None,
) -> Iterator[Confinement]:
    """The argv that runs ``argv`` confined, its environment and the descriptors it
    must inherit; they are closed when the block ends (start the process inside it,
    in ``cwd`` — the workspace unless given —, and call ``started()``). ``root``:
    bubblewrap's arguments that mount / (the host's, read-only, unless given);
    ``views``: what is bound at a root instead of the root (its session's overlay of
    it, V14), which only bubblewrap can do."""
    profile = profile or active_profile()
    policy = policy or active_policy()
    roots = [workspace, *writable]
    use_bwrap = profile.active("bwrap")
    layers: list[str] = []
    box = Confinement([], (), (), {})
    box.env = policy.environment({"HOME": PRIVATE_HOME if use_bwrap else str(workspace)})
    box.env.update(env or {})
    nothing = not use_bwrap and not any(profile.active(m) for m in ("landlock", "seccomp"))
    if nothing and os.geteuid() != 0:
        # No layer would apply (and no capability to drop): the command as it is.
        box.argv, box.layers = list(argv), ()
        yield box
        return
    try:
        pass_fds: list[int] = []
        # Whoever starts the command says when every layer is in place; no word means
        # the sandbox failed before the command started (sandbox_failed, X1).
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        box._status_fd = ready_r
        box._fds.append(ready_w)
        pass_fds.append(ready_w)
        if use_bwrap:
            start_in = cwd or workspace
            command = _bwrap(
                argv,
                roots,
                start_in,
                network,
                profile,
                policy,
                tmp_bytes,
                box,
                pass_fds,
                root,
                views,
            )
            layers += ["bwrap", "user namespace, no capabilities"]
            if box._network is not None:
                layers.append("outbound-only network")
            if profile.active("seccomp"):
                layers.append("seccomp")
        elif views:
            raise ToolError(
                "This session's workspace is an overlay, which only bubblewrap can give "
                "a command (it is off here).",
                code="sandbox_failed",
            )
        else:
            command, layers = _wrapper(argv, roots, network, profile, box, pass_fds)
        box.argv = command
        box.pass_fds = tuple(pass_fds)
        box.layers = tuple(layers)
        yield box
    except BaseException:
        box.finish()
        raise
    finally:
        box._close_inherited()
