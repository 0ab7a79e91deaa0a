"""One background shell as the supervisor keeps it (``Shell``): its process, its
output file and the thread that fills it (``toolpool.spill``), its cgroup's counters,
how it ended; and what is done once its process exited (``clean_up``) or did not
start (``discard``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from toolpool.background import ShellInfo, ShellState
from toolpool.pool import shell_bounds
from toolpool.pool.shell_bounds import LimitEnd
from toolpool.pool.shell_process import ShellProcess
from toolpool.protocol import CallContext
from toolpool.sandbox.cgroups import CallAccounting, WorkerCgroup
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.terminate import (
    CgroupMembers,
    ProcessSet,
    terminate,
)
from toolpool.spill import SpillFile, pump

LEFTOVER_GRACE = 0.5  # for what a shell that exited left running
DRAIN_AFTER_EXIT = 1.0  # seconds its output is read on after it exited
SHOWN_COMMAND_CHARS = 80


@dataclass(eq=False)
class Shell:
    """One background shell as the supervisor keeps it."""

    id: str
    session_id: str
    command: str
    process: ShellProcess
    output: SpillFile
    cgroup: WorkerCgroup | None
    limits: Limits
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

    @classmethod
    def begin(
        cls,
        shell_id: str,
        context: CallContext,
        command: str,
        client: Hashable | None,
        started: tuple[ShellProcess, int],
        output: SpillFile,
        cgroup: WorkerCgroup | None,
        limits: Limits,
        deadline: float,
    ) -> Shell:
        """The record of a shell whose command was started (its process and the read
        end of its output pipe, which the reader started here closes)."""
        process, read_fd = started
        stop = threading.Event()
        reader = threading.Thread(
            target=_read, args=(read_fd, output, stop), name=f"toolpool-shell-{shell_id}"
        )
        shell = cls(
            id=shell_id,
            session_id=context.session_id,
            command=command,
            process=process,
            output=output,
            cgroup=cgroup,
            limits=limits,
            client=client,
            started=time.time(),
            deadline=deadline,
            done=asyncio.get_running_loop().create_future(),
            reader=reader,
            stop_reading=stop,
            accounting=None if cgroup is None else CallAccounting(cgroup.procs_files()),
        )
        reader.start()
        return shell

    def members(self, *, with_root: bool) -> ProcessSet:
        """Every process of the shell (``ShellProcess.members``)."""
        return self.process.members(with_root=with_root)


def _read(fd: int, output: SpillFile, stop: threading.Event) -> None:
    """(The shell's reader thread.) Its pipe into its output file, drained and
    dropped past the cap (``toolpool.spill``); closes ``fd``."""
    try:
        pump(fd, output, stop)
    finally:
        os.close(fd)


def discard(output: SpillFile, cgroup: WorkerCgroup | None) -> None:
    """What was made for a shell whose command did not start: its output file and
    its cgroup go."""
    output.close()
    output.path.unlink(missing_ok=True)
    if cgroup is not None:
        cgroup.remove()


def clean_up(shell: Shell, code: int) -> tuple[ShellState, str, LimitEnd | None]:
    """(In a thread, once the shell's process exited.) Read the last output, end what
    the command left running, close the output; how it ended, were it still running:
    failed (why the sandbox failed to start it), killed by the limit its cgroup says
    ended it or by the end of its sandbox, or exited by itself."""
    shell.reader.join(DRAIN_AFTER_EXIT)
    shell.stop_reading.set()
    terminate(shell.members(with_root=False), grace=LEFTOVER_GRACE)
    shell.process.release()
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
    failure = shell.process.failure(code, shell.output.head(4096))
    shell.output.close()
    if failure is not None:
        return ShellState.FAILED, failure, None
    if limit is not None:  # a limit the watch had not seen yet ended it
        return ShellState.KILLED, limit.reason, limit
    lost = shell.process.lost()
    return (ShellState.EXITED, "", None) if lost is None else (ShellState.KILLED, lost, None)


def _retries(times: int = 20, pause: float = 0.05) -> Iterator[None]:
    for _ in range(times):
        yield
        time.sleep(pause)
