"""A background shell started in its session's sandbox (SPEC V1, V5): the same sandbox
as the session's foreground commands, so it sees their ``/tmp`` (and they its), and
costs no sandbox of its own.

The sandbox's helper starts it as it starts a foreground command (``spawn.py``): in
PID and mount namespaces of its own under a per-command init, joined to the shell's
own cgroup (the call's ``CgroupLimits``, the workers' CPU quota), with the call's
rlimits (``toolpool.sandbox.limits.rlimits``; SIGXFSZ ignored, so a write past the
file size limit fails with EFBIG), the environment and start
directory a shell gets in a sandbox of its own (V10), stdin ``/dev/null`` and
stdout and stderr to its output pipe. So its ``/proc`` shows only its own
processes, and it can signal neither the session's other commands nor the helper.

The spawn connection is all the daemon holds of it: its exit is a reply there, read
on the event loop when the connection's descriptor is readable (no thread waits on
it); a signal reaches every process of it through its init; ending its init (a kill
request, or closing the connection) ends its PID namespace and so every process it
started, ``setsid``, ``nohup`` and double-forked ones included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from toolpool.pool.shell_process import ENV, READY_TIMEOUT, SHELL_MARK, start_cwd
from toolpool.protocol import CallContext
from toolpool.sandbox.cgroups import WorkerCgroup
from toolpool.sandbox.limits import Limits, capped, memory_by_rlimit, resource_number, rlimits
from toolpool.sandbox.mounts import PRIVATE_HOME
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.spawn import SpawnedCommand, current_rlimits, spawn
from toolpool.sandbox.terminate import ProcessSet, ProcessTree


class SessionProcess:
    """A shell's command in its session's sandbox (a ``ShellProcess``). The spawn
    connection is used from the event loop (its replies) and from threads (signals,
    the clean-up's close): a lock keeps a signal from meeting a closed connection."""

    def __init__(self, command: SpawnedCommand) -> None:
        assert command.pid is not None  # every reply carries it: ready came
        self.command = command
        self._init = command.pid
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int:
        """Its init's pid as the daemon sees it."""
        return self._init

    @property
    def exited(self) -> bool:
        return self.command.returncode is not None

    @property
    def root(self) -> int | None:
        """None: it runs under the session sandbox's holder, which ``confines`` counts
        (and its init is reaped in the sandbox, so its pid may soon be another's)."""
        return None

    def watch(self, on_exit: Callable[[int], None]) -> None:
        loop = asyncio.get_running_loop()
        fd = self.command.fileno()
        if self.command.returncode is not None:  # it ended as it started
            loop.call_soon(on_exit, self.command.returncode)
            return

        def readable() -> None:  # a reply, or the end: never blocks (poll reads what came)
            code = self.command.poll()
            if code is not None:
                loop.remove_reader(fd)
                on_exit(code)

        loop.add_reader(fd, readable)

    def members(self, *, with_root: bool) -> ProcessSet:
        """What runs under its init: every process of its PID namespace (the init
        ends with ``release``, or with SIGKILL)."""
        return _Namespace(self)

    def processes(self) -> set[int]:
        """The live processes under its init; none once the init is gone."""
        with self._lock:
            if self._closed or self.command.ended():
                return set()
            return ProcessTree(self._init, include_root=False).pids()

    def signal(self, sig: int) -> None:
        """``sig`` to every process of it; SIGKILL ends its namespace."""
        with self._lock:
            if self._closed:
                return
            if sig == signal.SIGKILL:
                self.command.kill()
            else:
                self.command.signal(sig)

    def release(self) -> None:
        """End its init, so whatever of it is left, and close the connection once the
        init is gone. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.command.kill()
                self.command.close(wait=True)

    def failure(self, code: int, output_head: str) -> str | None:
        return None  # a failure before the command is known at its start

    def lost(self) -> str | None:
        """Its init ended before the command did (the session's sandbox ended)."""
        return None if self.command.exit_reported else "its session's sandbox ended"


class _Namespace:
    """A ``ProcessSet`` of a shell in its session's sandbox."""

    def __init__(self, process: SessionProcess) -> None:
        self._process = process

    def pids(self) -> set[int]:
        return self._process.processes()

    def signal(self, sig: int) -> None:
        self._process.signal(sig)


def start_in_sandbox(
    socket_path: Path,
    context: CallContext,
    limits: Limits,
    command: str,
    cgroup: WorkerCgroup | None,
    mark: str,
    policy: Policy,
    base: Mapping[str, str],
    proxy: Mapping[str, str],
) -> tuple[SessionProcess, int] | str:
    """(In a thread: the request's send may wait on the helper, and the start on the
    sandbox.) ``command`` started in the session sandbox serving ``socket_path``: its
    process and the read end of its output pipe, or why the sandbox did not start it
    (nothing of it ran); ``base``: the environment an image root gives (V13), under
    toolpool's own variables; ``proxy``: a policy session's proxy variables (N3).
    Raises SpawnError when the sandbox cannot be reached."""
    own = {"HOME": PRIVATE_HOME, **ENV, SHELL_MARK: mark, **proxy}
    env = {**policy.environment({"HOME": PRIVATE_HOME}), **base, **own}
    cwd = str(start_cwd(context))
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    opened = [write_fd]
    try:
        opened.append(null := os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        cgroups: list[int] = []
        for procs in cgroup.procs_files() if cgroup is not None else ():
            cgroups.append(os.open(procs, os.O_WRONLY | os.O_CLOEXEC))
            opened.append(cgroups[-1])
        spawned = spawn(
            socket_path,
            ["bash", "-c", command],
            env=env,
            cwd=cwd,
            stdin=null,
            stdout=write_fd,
            stderr=write_fd,
            cgroup_procs=cgroups,
            rlimits=_rlimits(cgroup, limits),
            ignore_sigxfsz=True,  # as the exec wrapper does for a shell of its own
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        for fd in opened:
            os.close(fd)
    ready = spawned.wait_ready(READY_TIMEOUT)
    if ready:
        return SessionProcess(spawned), read_fd
    why = spawned.failure if ready is False else f"it did not start within {READY_TIMEOUT:g} s"
    spawned.kill()
    spawned.close()
    os.close(read_fd)
    return f"The sandbox could not start the command: {why}."


def _rlimits(cgroup: WorkerCgroup | None, limits: Limits) -> dict[int, tuple[int, int]]:
    """This process's rlimits (what a child of it would inherit) with the call's
    own, none above the hard limit it has here (a raise would be refused)."""
    inherited = current_rlimits()
    for name, (soft, hard) in rlimits(limits, address_space=memory_by_rlimit(cgroup)).items():
        number = resource_number(name)
        inherited[number] = capped(soft, hard, inherited[number][1])
    return inherited
