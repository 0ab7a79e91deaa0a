"""Background shells (bash's ``run_in_background``): the pool starts, watches and ends
them; workers only ask (``ShellRequest`` → ``ShellReply``, ``toolpool.worker.shells``).

A shell belongs to its session, not to the worker whose call started it: recycling
or losing that worker changes nothing, and any later call of the session, on any
worker, reads or ends it. It is confined as a foreground command is
(``toolpool.sandbox.command.confined``: bubblewrap, seccomp, Landlock, network as the
session allows); what a worker would have given the command besides — its own cgroup
(the call's memory and process limits, the workers' CPU quota), the call's rlimits,
an empty network namespace without bubblewrap — the exec wrapper gives it
(``confine_exec.py --cgroup --rlimit --unshare-net``) before it execs the sandbox.

Its output (stdout and stderr together) goes to ``shells/<id>.log`` in the session's
scratch directory, up to the call's ``spill_bytes`` and a truncation note; a read
gets the byte range not read before, which the worker reads from the file itself.

What ends a shell, always its whole process tree (``terminate``; the cgroup, or
without one the process group and every process whose environment carries the
shell's mark — setsid and nohup escapees included):

- ``kill_shell``; its session closing; the pool closing (the daemon's stop);
- ``background_wall_seconds`` (state ``timed_out``), or its CPU allowance spent
  over every process of its cgroup (``cpu_seconds``, state ``killed``);
- its command exiting: what it left running is ended after a short drain;
- the daemon's death: bubblewrap dies with its parent (and its PID namespace with
  it); the next start kills what is left in the dead daemon's cgroups
  (``remove_stale_cgroups``) and, without cgroups, every process with a dead
  daemon's mark (``remove_stale_shells``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import math
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from toolpool.background import ShellInfo, ShellState
from toolpool.errors import ToolError
from toolpool.pool.processes import WorkerProcesses
from toolpool.protocol import CallContext, ShellAction, ShellReply, ShellRequest
from toolpool.sandbox import confine_exec, linux
from toolpool.sandbox.cgroups import CallAccounting, WorkerCgroup
from toolpool.sandbox.command import Confinement, confined
from toolpool.sandbox.limits import Limits, named
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

log = logging.getLogger("toolpool.pool")

SHELL_MARK = "TOOLPOOL_SHELL"  # in every shell's environment: "<daemon pid>:<shell id>"
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when a shell is ended
LEFTOVER_GRACE = 0.5  # for what a shell that exited left running
DRAIN_AFTER_EXIT = 1.0  # seconds its output is read on after it exited
END_WAIT = 10.0  # a hang guard: a shell whose processes survive SIGKILL is given up on
TICK = 0.25  # seconds between looks at the running shells' wall time and CPU
MAX_RUNNING_PER_SESSION = 16
SHOWN_COMMAND_CHARS = 80


class ShellRefused(Exception):
    """A request the supervisor refuses; the message is for the model."""


class _OutputFile:
    """A shell's output file: text as it comes, up to ``limit`` bytes and a note.
    ``written`` (what a reader may read) moves only after the bytes are in the file."""

    def __init__(self, path: Path, limit: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.path = path
        self._fd = os.open(path, flags, 0o600)  # only the daemon's user reads it (X8)
        self._limit = limit
        self._kept = 0
        self.written = 0
        self.truncated = False

    def add(self, text: str) -> None:
        if self.truncated or not text:
            return
        data = text.encode("utf-8", errors="replace")
        room = self._limit - self._kept
        if len(data) > room:
            # Cut at a character's start: the file stays UTF-8 at every offset given.
            data = data[:room].decode("utf-8", errors="ignore").encode()
            self.truncated = True
        self._write(data)
        self._kept += len(data)
        if self.truncated:
            self._write(f"\n[output truncated at {self._limit} bytes: spill_bytes]\n".encode())
        self.written = os.lseek(self._fd, 0, os.SEEK_CUR)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def head(self, size: int) -> str:
        with open(self.path, "rb") as f:
            return f.read(size).decode(errors="replace")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _pump(fd: int, output: _OutputFile, stop: threading.Event) -> None:
    """Copy the command's output to its file until EOF or ``stop``; close the pipe."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while not stop.is_set():
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            output.add(decoder.decode(data))
        output.add(decoder.decode(b"", final=True))
    finally:
        os.close(fd)


@dataclass(eq=False)
class Shell:
    """One background shell as the supervisor keeps it."""

    id: str
    session_id: str
    command: str
    process: subprocess.Popen[bytes]
    box: Confinement
    output: _OutputFile
    cgroup: WorkerCgroup | None
    limits: Limits
    mark: str
    started: float  # Unix time
    deadline: float  # monotonic
    done: asyncio.Future[None]
    reader: threading.Thread
    stop_reading: threading.Event = field(default_factory=threading.Event)
    accounting: CallAccounting | None = None
    state: ShellState = ShellState.RUNNING
    exit_code: int | None = None
    ended: float | None = None
    reason: str = ""
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


class ShellSupervisor:
    """The pool's background shells, by id; each request answered for the session of
    the call that asked. ``WorkerPool`` makes one, and closes it when it closes."""

    def __init__(self, processes: WorkerProcesses, *, wall_seconds: float, cpus: float) -> None:
        self._processes = processes  # the sandbox profile, policy and cgroups in use
        self.wall_seconds = wall_seconds
        self._cpus = cpus
        self._shells: dict[str, Shell] = {}
        self._roots: frozenset[int] = frozenset()  # read from the ZAP thread (confines)
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._open = True

    # -- requests -----------------------------------------------------------------------

    async def answer(
        self, request: ShellRequest, context: CallContext | None, limits: Limits | None
    ) -> ShellReply:
        """The reply to a worker's request, for the call it runs (``context``)."""
        call_id, request_id = request.call_id, request.request_id
        try:
            if context is None or limits is None:
                raise ShellRefused("Background shells need a call of a session.")
            match request.action:
                case ShellAction.START:
                    shell = await self.start(context, limits, request.command)
                    return ShellReply(call_id, request_id, shell.to_dict())
                case ShellAction.OUTPUT:
                    shell, start, end = self.read(context.session_id, request.shell_id)
                    return ShellReply(call_id, request_id, shell.to_dict(), start=start, end=end)
                case ShellAction.KILL:
                    shell = await self.kill(context.session_id, request.shell_id)
                    return ShellReply(call_id, request_id, shell.to_dict())
        except ShellRefused as exc:
            return ShellReply(call_id, request_id, error=str(exc))
        except Exception as exc:  # the worker must hear an answer, whatever went wrong
            log.exception("background shell request %s failed", request.action.value)
            text = f"The background shell request failed: {type(exc).__name__}: {exc}"
            return ShellReply(call_id, request_id, error=text)

    async def start(self, context: CallContext, limits: Limits, command: str) -> ShellInfo:
        """Start ``command`` for the call's session; its record (running)."""
        if not self._open:
            raise ShellRefused("Background shells cannot start: the daemon is stopping.")
        if context.scratch_dir is None:
            raise ShellRefused("This session has no scratch directory for the shell's output.")
        running = self.running(context.session_id)
        if len(running) >= MAX_RUNNING_PER_SESSION:
            raise ShellRefused(
                f"This session already runs {len(running)} background shells, the most it "
                "may: end one with kill_shell first."
            )
        shell = self._spawn(context, limits, command)
        loop = asyncio.get_running_loop()
        try:
            # Connects a network-allowed command's namespace (pasta): may take a while.
            await loop.run_in_executor(None, shell.box.started)
        except ToolError as exc:  # the sandbox could not be completed: it never ran
            await self._end(shell, ShellState.FAILED, exc.message, grace=0)
            self._forget(shell)
            raise ShellRefused(exc.message) from None
        log.info(
            "background shell %s started (pid %d)",
            shell.id,
            shell.process.pid,
            extra={"session": shell.session_id},
        )
        return shell.info()

    def read(self, session_id: str, shell_id: str) -> tuple[ShellInfo, int, int]:
        """The shell's record and the bytes of its output not read before; the next
        read starts where this one ends."""
        shell = self._own(session_id, shell_id)
        start, end = shell.read_at, shell.output.written
        shell.read_at = end
        return shell.info(), start, end

    async def kill(self, session_id: str, shell_id: str) -> ShellInfo:
        """End the shell and its whole tree; its record after. One that is not
        running is refused, saying how it ended."""
        shell = self._own(session_id, shell_id)
        if shell.state is not ShellState.RUNNING:
            ended = shell.info().describe_state()
            raise ShellRefused(f"Background shell {shell_id} is not running: it {ended}.")
        await self._end(shell, ShellState.KILLED, "kill_shell")
        return shell.info()

    def _own(self, session_id: str, shell_id: str) -> Shell:
        """The session's shell ``shell_id``: another session's is refused just like an
        id that never was (a shell belongs to its session; X8)."""
        shell = self._shells.get(shell_id)
        if shell is not None and shell.session_id == session_id:
            return shell
        ids = [s.id for s in self._shells.values() if s.session_id == session_id]
        known = f" Its shells: {', '.join(ids)}." if ids else " It has started none."
        raise ShellRefused(f'No background shell "{shell_id}" in this session.{known}')

    # -- sessions and the end ---------------------------------------------------------------

    def running(self, session_id: str | None = None) -> list[Shell]:
        return [
            s
            for s in self._shells.values()
            if s.state is ShellState.RUNNING and session_id in (None, s.session_id)
        ]

    async def end_session(self, session_id: str) -> None:
        """The session closes: its shells end, and their records go."""
        shells = [s for s in self._shells.values() if s.session_id == session_id]
        await asyncio.gather(
            *(self._end(s, ShellState.KILLED, "its session closed") for s in shells)
        )
        for shell in shells:
            self._forget(shell)

    async def close(self, reason: str = "the daemon stopped") -> None:
        """End every shell; no new one starts. Nothing is left running."""
        self._open = False
        shells = list(self._shells.values())
        await asyncio.gather(*(self._end(s, ShellState.KILLED, reason) for s in shells))
        for shell in shells:
            self._forget(shell)
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def listing(self) -> dict[str, list[dict[str, object]]]:
        """Every session's shells, for ``status``."""
        by_session: dict[str, list[dict[str, object]]] = {}
        for shell in self._shells.values():
            by_session.setdefault(shell.session_id, []).append(shell.listing())
        return by_session

    def confines(self, pid: int) -> bool:
        """Whether ``pid`` is a shell's or runs under one (X2). Any thread."""
        roots = self._roots
        return bool(roots) and linux.lineage_includes(pid, set(roots))

    def __repr__(self) -> str:
        running = len(self.running())
        return f"<ShellSupervisor [{running} running, {len(self._shells) - running} ended]>"

    # -- a shell's life ---------------------------------------------------------------------

    def _spawn(self, context: CallContext, limits: Limits, command: str) -> Shell:
        """Start the confined command, its output's reader and its exit's watch."""
        assert context.scratch_dir is not None
        shell_id = self._new_id()
        directory = Path(context.scratch_dir) / "shells"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        output = _OutputFile(directory / f"{shell_id}.log", limits.spill_bytes)
        cgroup = self._cgroup(shell_id, limits)
        mark = f"{os.getpid()}:{shell_id}"
        try:
            process, box, read_fd = self._popen(context, limits, command, cgroup, mark)
        except BaseException:
            output.close()
            if cgroup is not None:
                cgroup.remove()
            raise
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        reader = threading.Thread(
            target=_pump, args=(read_fd, output, stop), name=f"toolpool-shell-{shell_id}"
        )
        shell = Shell(
            id=shell_id,
            session_id=context.session_id,
            command=command,
            process=process,
            box=box,
            output=output,
            cgroup=cgroup,
            limits=limits,
            mark=mark,
            started=time.time(),
            deadline=time.monotonic() + self.wall_seconds,
            done=loop.create_future(),
            reader=reader,
            stop_reading=stop,
            accounting=None if cgroup is None else CallAccounting(cgroup.procs_files()),
        )
        self._shells[shell_id] = shell
        self._roots = self._roots | {process.pid}
        reader.start()
        pidfd = os.pidfd_open(process.pid)
        loop.add_reader(pidfd, self._on_exit, shell, pidfd)
        if self._ticker is None:
            self._ticker = asyncio.ensure_future(self._watch())
        return shell

    def _popen(
        self,
        context: CallContext,
        limits: Limits,
        command: str,
        cgroup: WorkerCgroup | None,
        mark: str,
    ) -> tuple[subprocess.Popen[bytes], Confinement, int]:
        profile = self._processes.profile
        workspace = Path(context.workspace)
        env = {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb", SHELL_MARK: mark}
        with confined(
            ["bash", "-c", command],
            workspace=workspace,
            writable=tuple(Path(p) for p in context.extra_roots),
            network=context.allow_network,
            profile=profile,
            policy=self._processes.policy,
            tmp_bytes=limits.tmp_bytes,
            env=env,
        ) as box:
            # A worker of a network-less session lives in an empty network namespace,
            # and so do its commands; bubblewrap makes its own, else the wrapper does.
            unshare = (
                not context.allow_network and "bwrap" not in box.layers and profile.active("netns")
            )
            argv = [*self._launcher(cgroup, limits, unshare), *box.argv]
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
            try:
                # From the event loop's thread, which lives as long as the daemon:
                # bubblewrap's parent-death signal follows the thread that forked it.
                process = subprocess.Popen(
                    argv,
                    cwd=workspace,
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

    @staticmethod
    def _launcher(cgroup: WorkerCgroup | None, limits: Limits, unshare_net: bool) -> list[str]:
        """The exec wrapper that gives the command what a worker would have: its
        cgroup, the call's rlimits (RLIMIT_AS where no memory cgroup bounds it)."""
        argv = [sys.executable, "-I", "-S", confine_exec.__file__]
        for procs in cgroup.procs_files() if cgroup is not None else ():
            argv += ["--cgroup", str(procs)]
        rlimits = {
            "CORE": 0,
            "NOFILE": limits.open_files,
            "FSIZE": limits.file_size_bytes,
            "CPU": max(1, math.ceil(limits.cpu_seconds)),
        }
        if cgroup is None or "memory" not in cgroup.controllers:
            rlimits["AS"] = limits.memory_bytes
        for name, value in rlimits.items():
            argv += ["--rlimit", f"{name}={value}"]
        if unshare_net:
            argv.append("--unshare-net")
        return [*argv, "--"]

    def _cgroup(self, shell_id: str, limits: Limits) -> WorkerCgroup | None:
        tree = self._processes.cgroups
        if tree is None:
            return None
        cgroup = tree.create(f"shell-{shell_id}")
        try:
            cgroup.set_memory(limits.memory_bytes)
            cgroup.set_pids(limits.processes)
            cgroup.set_cpu(self._cpus)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def _new_id(self) -> str:
        while True:
            shell_id = secrets.token_hex(4)
            if shell_id not in self._shells:
                return shell_id

    def _members(self, shell: Shell, *, with_root: bool) -> ProcessSet:
        """Every process of the shell. In bubblewrap's PID namespace nothing outlives
        bubblewrap, so its tree is all there is; else its process group and, where a
        cgroup holds them, the cgroup, or without one every process with its mark."""
        sets: list[ProcessSet] = []
        if with_root:  # before it is reaped: after, its pid may be another's
            sets.append(ProcessTree(shell.process.pid))
        if "bwrap" not in shell.box.layers:
            sets.append(ProcessGroup(shell.process.pid))
        if shell.cgroup is not None:
            sets.append(CgroupMembers(shell.cgroup.procs_files()))
        elif "bwrap" not in shell.box.layers:
            sets.append(MarkedProcesses(SHELL_MARK, shell.mark))
        return Together(*sets)

    async def _end(
        self, shell: Shell, state: ShellState, reason: str, *, grace: float = KILL_GRACE
    ) -> None:
        """End a running shell with ``state``; wait until it is over (a shell that
        ended already is left as it is)."""
        if shell.state is ShellState.RUNNING:
            shell.state, shell.reason = state, reason
            members = self._members(shell, with_root=True)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: terminate(members, grace=grace))
            if shell.cgroup is not None:
                shell.cgroup.kill_all()
        try:
            await asyncio.wait_for(asyncio.shield(shell.done), END_WAIT)
        except TimeoutError:
            log.error("background shell %s did not end: its processes survive SIGKILL", shell.id)

    def _on_exit(self, shell: Shell, pidfd: int) -> None:
        """The shell's process exited (its pidfd is readable): reap it, then clean up."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(pidfd)
        os.close(pidfd)
        code = shell.process.wait()
        task = asyncio.ensure_future(self._finish(shell, code))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, shell: Shell, code: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            failure = await loop.run_in_executor(None, self._clean_up, shell, code)
        except Exception:
            log.exception("cleaning up after background shell %s", shell.id)
            failure = None
        oom = shell.cgroup is not None and shell.cgroup.oom_kills() > 0
        if shell.cgroup is not None:
            shell.cgroup.remove()
        shell.exit_code = code
        shell.ended = time.time()
        if shell.state is ShellState.RUNNING:
            if failure is not None:
                shell.state, shell.reason = ShellState.FAILED, failure
            elif oom:
                reason = f"it ran out of memory ({named(shell.limits, 'memory_bytes')})"
                shell.state, shell.reason = ShellState.KILLED, reason
            else:
                shell.state = ShellState.EXITED
        self._roots = self._roots - {shell.process.pid}
        log.info(
            "background shell %s ended: %s",
            shell.id,
            shell.info().describe_state(),
            extra={"session": shell.session_id},
        )
        if not shell.done.done():
            shell.done.set_result(None)

    def _clean_up(self, shell: Shell, code: int) -> str | None:
        """(In a thread.) Read the last output, end what the command left running,
        close the output; why the sandbox failed to start it, if it did."""
        shell.reader.join(DRAIN_AFTER_EXIT)
        shell.stop_reading.set()
        terminate(self._members(shell, with_root=False), grace=LEFTOVER_GRACE)
        if shell.cgroup is not None:
            shell.cgroup.kill_all()
            for _ in _retries():  # members take a moment to leave once killed
                if not CgroupMembers(shell.cgroup.procs_files()).pids():
                    break
        shell.reader.join()
        if shell.accounting is not None:
            shell.accounting.close()
        failure = shell.box.failure(code, shell.output.head(4096))
        shell.output.close()
        return failure

    def _forget(self, shell: Shell) -> None:
        self._shells.pop(shell.id, None)

    async def _watch(self) -> None:
        """End the shells that ran out of wall time or CPU allowance."""
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            for shell in self.running():
                reason = self._overrun(shell, now)
                if reason is not None:
                    state, why = reason
                    task = asyncio.ensure_future(self._end(shell, state, why))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    def _overrun(self, shell: Shell, now: float) -> tuple[ShellState, str] | None:
        if now >= shell.deadline:
            return ShellState.TIMED_OUT, f"background_wall_seconds = {self.wall_seconds:g}"
        used = None if shell.accounting is None else shell.accounting.cpu_seconds()
        if used is not None and used > shell.limits.cpu_seconds:
            cpu = named(shell.limits, "cpu_seconds")
            return ShellState.KILLED, f"it used up its CPU time limit ({cpu})"
        return None


def _retries(times: int = 20, pause: float = 0.05) -> Iterator[None]:
    for _ in range(times):
        yield
        time.sleep(pause)


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
