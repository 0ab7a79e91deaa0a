"""One background shell as a process: its command as it runs (``ShellProcess``: in the
session's sandbox, ``shell_spawn.py``, or in a sandbox of its own, ``OwnSandbox``,
started by ``launch``), and what a dead daemon's shells left (``remove_stale_shells``);
the supervisor's record of it is ``shell_record.py``.

Either way it gets what a worker would have given a foreground command: its own
cgroup, made as a worker's is (``WorkerProcesses.new_cgroup``: the call's
``CgroupLimits``, the workers' CPU quota), and the call's rlimits
(``toolpool.sandbox.limits.rlimits``, the one mapping). In a sandbox of its own it is
confined as a foreground command is there (``toolpool.sandbox.command.confined``:
bubblewrap, seccomp, Landlock, network as the session allows), and the exec wrapper
gives it the cgroup, the rlimits and, without bubblewrap, an empty network namespace
(``confine_exec.py --cgroup --rlimit --unshare-net``) before it execs the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from toolpool.protocol import CallContext
from toolpool.sandbox import confine_exec
from toolpool.sandbox.cgroups import WorkerCgroup
from toolpool.sandbox.command import Confinement, confined
from toolpool.sandbox.limits import Limits, memory_by_rlimit, rlimits
from toolpool.sandbox.mounts import HOST_ROOT
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.terminate import (
    CgroupMembers,
    MarkedProcesses,
    ProcessGroup,
    ProcessSet,
    ProcessTree,
    Together,
    environment_marks,
)
from toolpool.tools.support.shell_state import SavedShell

SHELL_MARK = "TOOLPOOL_SHELL"  # in every shell's environment: "<daemon pid>:<shell id>"
READY_TIMEOUT = 10.0  # seconds a sandbox has to start its command (after the network's)
ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"}  # as a foreground command's


class ShellProcess(Protocol):
    """A shell's command as it runs, wherever it was started."""

    @property
    def pid(self) -> int:
        """Its top process as the daemon sees it (status shows it)."""
        ...

    @property
    def exited(self) -> bool:
        """Whether its exit was seen (its clean-up then reads the counters)."""
        ...

    @property
    def root(self) -> int | None:
        """The pid everything of it runs under, for X2 (``confines``) while it runs;
        None where the session's sandbox already counts it as confined."""
        ...

    def watch(self, on_exit: Callable[[int], None]) -> None:
        """(On the event loop.) Call ``on_exit(exit code)`` there once it exited."""
        ...

    def members(self, *, with_root: bool) -> ProcessSet:
        """Every process of it; ``with_root`` only before its exit was seen."""
        ...

    def release(self) -> None:
        """(In a thread, once its processes were ended.) Let go of what it holds."""
        ...

    def failure(self, code: int, output_head: str) -> str | None:
        """Why its sandbox failed to start it, once it exited; None if it ran."""
        ...

    def lost(self) -> str | None:
        """What ended it, when it was not its own exit (its sandbox ended)."""
        ...


@dataclass(eq=False)
class OwnSandbox:
    """A shell's command in a sandbox of its own: bubblewrap (or the exec wrapper)
    as this process's child, watched by a pidfd."""

    process: subprocess.Popen[bytes]
    box: Confinement
    cgroup: WorkerCgroup | None
    mark: str

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    @property
    def root(self) -> int | None:
        return self.process.pid

    def bring_up(self) -> bool | None:
        """(In a thread.) Connect a network-allowed one's namespace (pasta), then wait
        for its sandbox to start the command: ``Confinement.wait_ready``'s answer."""
        self.box.started()
        return self.box.wait_ready(READY_TIMEOUT)

    def watch(self, on_exit: Callable[[int], None]) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(self.process.pid)

        def exited() -> None:  # reaped here, on the loop: the pidfd says it is over
            loop.remove_reader(pidfd)
            os.close(pidfd)
            on_exit(self.process.wait())

        loop.add_reader(pidfd, exited)

    def members(self, *, with_root: bool) -> ProcessSet:
        """In bubblewrap's PID namespace nothing outlives bubblewrap, so its tree is
        all there is; else its process group and, where a cgroup holds them, the
        cgroup, or without one every process with its mark. ``with_root`` only
        before it is reaped: after, its pid may be another's."""
        sets: list[ProcessSet] = []
        if with_root:
            sets.append(ProcessTree(self.process.pid))
        if "bwrap" not in self.box.layers:
            sets.append(ProcessGroup(self.process.pid))
        if self.cgroup is not None:
            sets.append(CgroupMembers(self.cgroup.procs_files()))
        elif "bwrap" not in self.box.layers:
            sets.append(MarkedProcesses(SHELL_MARK, self.mark))
        return Together(*sets)

    def release(self) -> None:
        """Nothing: bubblewrap's end was all of it (``failure`` reads what it said)."""

    def failure(self, code: int, output_head: str) -> str | None:
        return self.box.failure(code, output_head)

    def lost(self) -> str | None:
        return None  # bubblewrap ends as its command does: its exit is the command's


def launch(
    context: CallContext,
    limits: Limits,
    command: str,
    cgroup: WorkerCgroup | None,
    mark: str,
    profile: SandboxProfile,
    policy: Policy,
    root: Sequence[str] = HOST_ROOT,
    views: Mapping[str, str] | None = None,
) -> tuple[OwnSandbox, int]:
    """Start ``command`` in a sandbox of its own: its process (``bring_up()`` is the
    caller's to call) and the read end of its output pipe. Call it from the event
    loop's thread, which lives as long as the daemon: bubblewrap's parent-death
    signal follows the thread that forked it."""
    workspace = Path(context.workspace)
    env = {**ENV, SHELL_MARK: mark}
    with confined(
        ["bash", "-c", command],
        workspace=workspace,
        writable=tuple(Path(p) for p in context.extra_roots),
        network=context.allow_network,
        profile=profile,
        policy=policy,
        tmp_bytes=limits.tmp_bytes,
        env=env,
        cwd=(cwd := start_cwd(context)),
        root=root,
        views=views,
    ) as box:
        # A worker of a network-less session lives in an empty network namespace,
        # and so do its commands; bubblewrap makes its own, else the wrapper does.
        unshare = not context.allow_network and "bwrap" not in box.layers
        argv = [*_launcher(cgroup, limits, unshare and profile.active("netns")), *box.argv]
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            process = subprocess.Popen(
                argv,
                cwd="/" if views else cwd,  # bubblewrap goes there: maybe only in a view
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=box.pass_fds,
                env=box.env,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
    return OwnSandbox(process, box, cgroup, mark), read_fd


def start_cwd(context: CallContext) -> Path:
    """Where the session's last foreground command ended, as its next one would
    start (SPEC V10)."""
    workspace = Path(context.workspace)
    if context.scratch_dir is None:
        return workspace
    roots = tuple(Path(p) for p in context.extra_roots)
    view = Path(context.workspace_view) if context.workspace_view else None
    saved = SavedShell.of_session(
        Path(context.scratch_dir), workspace, roots, persistent=False, view=view
    )
    return saved.start_cwd()


def _launcher(cgroup: WorkerCgroup | None, limits: Limits, unshare_net: bool) -> list[str]:
    """The exec wrapper that gives the command what a worker would have: its
    cgroup, the call's rlimits."""
    argv = [sys.executable, "-I", "-S", confine_exec.__file__]
    for procs in cgroup.procs_files() if cgroup is not None else ():
        argv += ["--cgroup", str(procs)]
    for name, (soft, hard) in rlimits(limits, address_space=memory_by_rlimit(cgroup)).items():
        argv += ["--rlimit", f"{name}={soft}" if soft == hard else f"{name}={soft}:{hard}"]
    if unshare_net:
        argv.append("--unshare-net")
    return [*argv, "--"]


def remove_stale_shells(alive: Callable[[int], bool]) -> list[int]:
    """Kill the processes of shells whose daemon is no longer running (SPEC L7),
    found by their mark: what bubblewrap's parent-death signal and the stale cgroups
    did not end (a machine without either). Their pids, for the log."""
    killed = []
    for pid, mark in environment_marks(SHELL_MARK).items():
        daemon = mark.partition(":")[0]
        if daemon.isdigit() and not alive(int(daemon)) and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
