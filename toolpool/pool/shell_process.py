"""One background shell as a process: the supervisor's record of it (``Shell``), how its
confined command is started (``launch``), which processes are its (``Shell.members``),
what is done once it exited (``clean_up``), and what a dead daemon's shells left
(``remove_stale_shells``).

It is confined as a foreground command is (``toolpool.sandbox.command.confined``:
bubblewrap, seccomp, Landlock, network as the session allows); what a worker would
have given the command besides — its own cgroup (the call's memory and process
limits, the workers' CPU quota), the call's rlimits, an empty network namespace
without bubblewrap — the exec wrapper gives it (``confine_exec.py --cgroup --rlimit
--unshare-net``) before it execs the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.background import ShellInfo, ShellState
from toolpool.pool import shell_bounds
from toolpool.pool.shell_bounds import LimitEnd
from toolpool.pool.shell_output import OutputFile
from toolpool.protocol import CallContext
from toolpool.sandbox import confine_exec
from toolpool.sandbox.cgroups import CallAccounting, CgroupTree, WorkerCgroup
from toolpool.sandbox.command import Confinement, confined
from toolpool.sandbox.limits import Limits
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
    terminate,
)
from toolpool.tools.shell_state import SavedShell

LEFTOVER_GRACE = 0.5  # for what a shell that exited left running
DRAIN_AFTER_EXIT = 1.0  # seconds its output is read on after it exited
SHELL_MARK = "TOOLPOOL_SHELL"  # in every shell's environment: "<daemon pid>:<shell id>"
SHOWN_COMMAND_CHARS = 80


@dataclass(eq=False)
class Shell:
    """One background shell as the supervisor keeps it."""

    id: str
    session_id: str
    command: str
    process: subprocess.Popen[bytes]
    box: Confinement
    output: OutputFile
    cgroup: WorkerCgroup | None
    limits: Limits
    mark: str
    client: Hashable | None  # whose session it is, as the daemon said (caps per client)
    started: float  # Unix time
    deadline: float  # monotonic
    done: asyncio.Future[None]
    reader: threading.Thread
    stop_reading: threading.Event = field(default_factory=threading.Event)
    starting: asyncio.Future[bool | None] | None = None  # the sandbox's start, looked at
    accounting: CallAccounting | None = None
    state: ShellState = ShellState.RUNNING
    exit_code: int | None = None
    ended: float | None = None
    reason: str = ""
    limit: LimitEnd | None = None  # the limit that ended it, if one did
    read_at: int = 0  # the output's bytes before it were read

    def info(self) -> ShellInfo:
        return ShellInfo(
            shell_id=self.id,
            command=self.command,
            state=self.state,
            pid=self.process.pid,
            started=self.started,
            output_path=str(self.output.path),
            output_bytes=self.output.written,
            truncated=self.output.truncated,
            exit_code=self.exit_code,
            ended=self.ended,
            reason=self.reason,
            limit=self.limit.name if self.limit is not None else "",
            limit_value=self.limit.value if self.limit is not None else None,
        )

    def listing(self) -> dict[str, object]:
        """What ``status`` shows of it."""
        command = " ".join(self.command.split())
        if len(command) > SHOWN_COMMAND_CHARS:
            command = command[: SHOWN_COMMAND_CHARS - 1] + "…"
        return {
            "shell_id": self.id,
            "command": command,
            "state": self.state.value,
            "pid": self.process.pid,
            "started": round(self.started, 3),
            "output_bytes": self.output.written,
            "exit_code": self.exit_code,
        }

    def members(self, *, with_root: bool) -> ProcessSet:
        """Every process of the shell. In bubblewrap's PID namespace nothing outlives
        bubblewrap, so its tree is all there is; else its process group and, where a
        cgroup holds them, the cgroup, or without one every process with its mark.
        ``with_root`` only before it is reaped: after, its pid may be another's."""
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


def shell_cgroup(
    tree: CgroupTree | None, shell_id: str, limits: Limits, cpus: float
) -> WorkerCgroup | None:
    """The shell's own cgroup under the pool's tree, with the call's memory and
    process limits and the workers' CPU quota; None without cgroups."""
    if tree is None:
        return None
    cgroup = tree.create(f"shell-{shell_id}")
    try:
        cgroup.set_memory(limits.memory_bytes)
        cgroup.set_pids(limits.processes)
        cgroup.set_cpu(cpus)
    except OSError:
        cgroup.remove()
        raise
    return cgroup


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
) -> tuple[subprocess.Popen[bytes], Confinement, int]:
    """Start ``command`` confined: its process, its sandbox (``started()`` is the
    caller's to call) and the read end of its output pipe. Call it from the event
    loop's thread, which lives as long as the daemon: bubblewrap's parent-death
    signal follows the thread that forked it."""
    workspace = Path(context.workspace)
    env = {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb", SHELL_MARK: mark}
    with confined(
        ["bash", "-c", command],
        workspace=workspace,
        writable=tuple(Path(p) for p in context.extra_roots),
        network=context.allow_network,
        profile=profile,
        policy=policy,
        tmp_bytes=limits.tmp_bytes,
        env=env,
        cwd=(cwd := _start_cwd(context, workspace)),
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
    return process, box, read_fd


def _start_cwd(context: CallContext, workspace: Path) -> Path:
    """Where the session's last foreground command ended, as its next one would
    start (SPEC V10)."""
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
    cgroup, the call's rlimits (RLIMIT_AS where no memory cgroup bounds it)."""
    argv = [sys.executable, "-I", "-S", confine_exec.__file__]
    for procs in cgroup.procs_files() if cgroup is not None else ():
        argv += ["--cgroup", str(procs)]
    cpu = max(1, math.ceil(limits.cpu_seconds))
    rlimits: dict[str, int | str] = {
        "CORE": 0,
        "NOFILE": limits.open_files,
        "FSIZE": limits.file_size_bytes,
        # SIGXCPU at the soft limit: a death by it names cpu_seconds (shell_bounds),
        # where a SIGKILL alone reads as any kill; the kernel's SIGKILL a second after
        # ends a command that ignores it.
        "CPU": f"{cpu}:{cpu + 1}",
    }
    if cgroup is None or "memory" not in cgroup.controllers:
        rlimits["AS"] = limits.memory_bytes
    for name, value in rlimits.items():
        argv += ["--rlimit", f"{name}={value}"]
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


def clean_up(shell: Shell, code: int) -> tuple[str | None, LimitEnd | None]:
    """(In a thread, once the shell's process exited.) Read the last output, end what
    the command left running, close the output; why the sandbox failed to start it,
    if it did, and the limit its cgroup says ended it, if one did."""
    shell.reader.join(DRAIN_AFTER_EXIT)
    shell.stop_reading.set()
    terminate(shell.members(with_root=False), grace=LEFTOVER_GRACE)
    if shell.cgroup is not None:
        shell.cgroup.kill_all()
        for _ in _retries():  # members take a moment to leave once killed
            if not CgroupMembers(shell.cgroup.procs_files()).pids():
                break
    shell.reader.join()
    cpu: float | None = None
    oom = pids = 0
    if (acct := shell.accounting) is not None:
        cpu, oom, pids = acct.cpu_seconds(), acct.oom_kills(), acct.pids_refusals()
        acct.close()
    # Without a cgroup there are no counters, but RLIMIT_CPU's SIGXCPU still tells.
    limit = shell_bounds.at_exit(shell.limits, code, cpu, oom, pids)
    failure = shell.box.failure(code, shell.output.head(4096))
    shell.output.close()
    return failure, limit


def _retries(times: int = 20, pause: float = 0.05) -> Iterator[None]:
    for _ in range(times):
        yield
        time.sleep(pause)
