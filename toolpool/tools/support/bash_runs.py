"""A foreground ``bash`` command while it runs, started one of two ways:

- in the session's sandbox (SPEC V1, V2), where the executor offers one (workers:
  the pool keeps one per session): the sandbox's helper starts the command in PID
  and mount namespaces of its own, joined to this worker's cgroups and with its
  rlimits, as a child of ours would be; ending it ends its namespace, so everything
  it started goes with it;
- else in a sandbox of its own (toolpool.sandbox.command: bubblewrap, or the exec
  wrapper), made for this command and gone with it.

Either way a sandbox that fails before its command starts is tried again, up to
``START_ATTEMPTS`` (SPEC X12: nothing of the command ran), and the ``Run`` the tool
gets reads the same: the output's descriptor, ``wait``, ``end``, ``failure``.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from toolpool.cancel import Cancelled
from toolpool.egress.environment import proxy_environment
from toolpool.errors import ToolError
from toolpool.sandbox import command as sandbox_command
from toolpool.sandbox import linux
from toolpool.sandbox.command import (
    RETRY_PAUSE_SECONDS,
    START_ATTEMPTS,
    Confinement,
    NetworkNotConnected,
    count_retry,
)
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.mounts import PRIVATE_HOME
from toolpool.sandbox.policy import Policy, active_policy
from toolpool.sandbox.spawn import SpawnedCommand, SpawnError, current_rlimits, own_cgroup_procs
from toolpool.sandbox.spawn import spawn as spawn_in
from toolpool.sandbox.terminate import ProcessGroup, ProcessSet, ProcessTree, Together, terminate
from toolpool.tool import ToolContext
from toolpool.tools.support.paths import root_views
from toolpool.tools.support.shell_state import CommandShell

DRAIN_AFTER_EXIT = 1.0  # seconds to read what a sandbox that failed wrote
READY_SECONDS = 10.0  # a session sandbox starting its command (the helper is there)
_CHUNK = 65536
_TICK = 0.05  # seconds between looks at the call's cancel while waiting
ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"}


class Run(Protocol):
    """A started command."""

    @property
    def output_fd(self) -> int: ...

    def wait(self, ctx: ToolContext, deadline: float) -> int | None:
        """The exit code, or None at the deadline; raises Cancelled on a cancel."""
        ...

    def end(self, grace: float) -> int:
        """End every process of it (SIGTERM, ``grace`` seconds, SIGKILL); its exit code."""
        ...

    def close(self) -> None:
        """After ``end``: let go of everything (idempotent)."""
        ...

    def failure(self, exit_code: int, output_head: str) -> str | None:
        """Why its sandbox failed to run it, or None (the exit code is its own)."""
        ...


def _cancelled(ctx: ToolContext) -> Cancelled:
    source = ctx.cancel_token.source
    assert source is not None
    return Cancelled(source)


def _retried(attempt: Callable[[bool], Run | None]) -> Run:
    """``attempt(last)`` until it returns a Run: None means its sandbox failed before
    the command, and another try is made (the last one raises instead)."""
    for number in range(1, START_ATTEMPTS + 1):
        if number > 1:
            count_retry()
            time.sleep(RETRY_PAUSE_SECONDS)
        run = attempt(number == START_ATTEMPTS)
        if run is not None:
            return run
    raise AssertionError("unreachable: the last attempt returns or raises")


# --- in the session's sandbox ---------------------------------------------------------


class SessionRun:
    """A command started by the session sandbox's helper."""

    def __init__(self, command: SpawnedCommand, output_fd: int) -> None:
        self.command = command
        self.output_fd = output_fd

    def wait(self, ctx: ToolContext, deadline: float) -> int | None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            code = self.command.wait(min(remaining, _TICK))
            if code is not None:
                return code
            if ctx.cancelled:
                raise _cancelled(ctx) from None

    def end(self, grace: float) -> int:
        if self.command.poll() is None:
            self.command.signal(signal.SIGTERM)
            if self.command.wait(grace) is None:
                self.command.kill()
        code = self.command.wait(grace)
        self.command.close()  # what it left running ends with its namespace
        return 128 + signal.SIGKILL if code is None else code

    def close(self) -> None:
        self.command.close()
        if self.output_fd >= 0:
            os.close(self.output_fd)
            self.output_fd = -1

    def failure(self, exit_code: int, output_head: str) -> str | None:
        return None  # a failure before the command is known at its start


def start_in_session(
    socket_path: Path,
    argv: list[str],
    ctx: ToolContext,
    cwd: Path,
    shell: CommandShell,
    base: Mapping[str, str] | None = None,
) -> Run:
    """``argv`` started in the session sandbox serving ``socket_path``; ``base``: the
    environment an image root gives (V13), under toolpool's own variables. Raises
    SpawnError when the sandbox cannot be reached (ask the pool again), ToolError
    ``sandbox_failed`` when its helper could not start the command."""
    own = _base_environment(active_policy())
    env = {**own, **base, **_OURS, **shell.env} if base else {**own, **shell.env}
    if ctx.egress:  # a network policy: the session's proxy, with this call's token (N3)
        env.update(proxy_environment(ctx.egress, ctx.call_id))

    def attempt(last: bool) -> Run | None:
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        cgroups = own_cgroup_procs()
        try:
            command = spawn_in(
                socket_path,
                argv,
                env=env,
                cwd=str(cwd),
                stdin=null,
                stdout=write_fd,
                stderr=write_fd,
                cgroup_procs=cgroups,
                rlimits=current_rlimits(),
                extra_fds=shell.fds,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            for fd in (write_fd, null, *cgroups):
                os.close(fd)
        run = SessionRun(command, read_fd)
        try:
            ready = _ready(command, ctx)
        except BaseException:
            run.end(0)
            run.close()
            raise
        if ready:
            return run
        run.close()
        if last:
            raise ToolError(
                f"The sandbox could not start the command: {command.failure}.",
                code="sandbox_failed",
            )
        return None

    return _retried(attempt)


_OURS = {"HOME": PRIVATE_HOME, **ENV}  # what an image's Env does not replace


@functools.lru_cache(maxsize=4)
def _base_environment(policy: Policy) -> Mapping[str, str]:
    """A command's environment but the shell's own variables: the policy's allowlist
    of this process's environment (a worker's does not change), HOME, ENV."""
    return MappingProxyType({**policy.environment({"HOME": PRIVATE_HOME}), **ENV})


def _ready(command: SpawnedCommand, ctx: ToolContext) -> bool:
    deadline = time.monotonic() + READY_SECONDS
    while (ready := command.wait_ready(_TICK)) is None:
        if ctx.cancelled:
            raise _cancelled(ctx)
        if time.monotonic() > deadline:
            command.failure = f"its helper did not start it within {READY_SECONDS:g} s"
            return False
    return ready


# --- in a sandbox of its own ------------------------------------------------------------


class PerCallRun:
    """A command started in its own sandbox (bubblewrap, or the exec wrapper)."""

    def __init__(self, process: subprocess.Popen[bytes], box: Confinement) -> None:
        self.process = process
        self.box = box
        assert process.stdout is not None
        self.output_fd = process.stdout.fileno()
        # In bubblewrap's PID namespace nothing outlives bubblewrap: its tree is all
        # there is (a /proc scan for the process group would cost ~2 ms per call).
        self.group: ProcessSet = ProcessTree(process.pid)
        if "bwrap" not in box.layers:
            self.group = Together(ProcessGroup(process.pid), self.group)

    def wait(self, ctx: ToolContext, deadline: float) -> int | None:
        # A pidfd wakes us the moment the process exits; Popen.wait(timeout) polls
        # with sleeps of up to 50 ms, which a short command would pay in full.
        pidfd = os.pidfd_open(self.process.pid)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if linux.readable(pidfd, min(remaining, _TICK)):
                    return self.process.wait()
                if ctx.cancelled:
                    raise _cancelled(ctx) from None
        finally:
            os.close(pidfd)

    def end(self, grace: float) -> int:
        terminate(self.group, grace=grace)
        return self.process.wait()

    def close(self) -> None:
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.box.finish()

    def failure(self, exit_code: int, output_head: str) -> str | None:
        return self.box.failure(exit_code, output_head)


def start_per_call(
    argv: list[str],
    ctx: ToolContext,
    limits: Limits,
    cwd: Path,
    shell: CommandShell,
    deadline: float,
) -> Run:
    """``argv`` started in a sandbox of its own. Raises ToolError ``sandbox_failed``
    when the last attempt failed too, or when a network-allowed command's namespace
    could not be connected in time (that is not retried: it waited for its setup
    already; pasta ending early is)."""

    def attempt(last: bool) -> Run | None:
        try:
            process, box = _spawn(argv, ctx, limits, cwd, shell)
        except NetworkNotConnected as exc:
            if not exc.again or last:
                raise
            return None
        if _wait_ready(process, box, ctx, deadline) is not False:
            return PerCallRun(process, box)  # running, or the deadline came first
        said = _what_the_sandbox_said(process)
        failure = box.failure(process.returncode, said)
        assert failure is not None  # no ready byte: the sandbox's own failure
        if last:
            raise ToolError(failure, code="sandbox_failed", details={"output": said[:4096]})
        return None

    return _retried(attempt)


def _spawn(
    argv: list[str], ctx: ToolContext, limits: Limits, cwd: Path, shell: CommandShell
) -> tuple[subprocess.Popen[bytes], Confinement]:
    views = {str(k): str(v) for k, v in root_views(ctx).items()}
    with sandbox_command.confined(
        argv,
        workspace=ctx.workspace,
        writable=ctx.extra_roots,
        network=ctx.allow_network,
        tmp_bytes=limits.tmp_bytes,
        env={**ENV, **shell.env},
        cwd=cwd,
        views=views,
    ) as box:
        process = subprocess.Popen(
            box.argv,
            # bubblewrap goes to cwd itself: in a workspace overlay, it may be a
            # directory the host's workspace does not have.
            cwd="/" if views else cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(*box.pass_fds, *shell.fds),
            env=box.env,
        )
        try:
            box.started()
        except ToolError:  # the sandbox could not be completed: the command never ran
            _kill_unstarted(process, box)
            raise
    return process, box


def _wait_ready(
    process: subprocess.Popen[bytes], box: Confinement, ctx: ToolContext, deadline: float
) -> bool | None:
    """``box.wait_ready`` until the deadline (None then), the call's cancel raising
    Cancelled. The output is not read meanwhile: what a sandbox that fails says
    stays in the pipe, for its error, not the spill file."""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready = box.wait_ready(min(remaining, _TICK))
            if ready is not None:
                return ready
            if ctx.cancelled:
                raise _cancelled(ctx) from None
    except BaseException:  # no start was seen: the sandbox, and what it started, end
        _kill_unstarted(process, box)
        raise


def _kill_unstarted(process: subprocess.Popen[bytes], box: Confinement) -> None:
    """End a sandbox whose command was not seen to start, and everything under it: a
    cancel may come after the command started but before its ready byte was read,
    and then the command's processes, which hold the status pipe ``box.finish``
    reads to its end, must go too (killing the sandbox's first process alone would
    leave bubblewrap, and its command, running)."""
    terminate(ProcessTree(process.pid), grace=0)
    process.wait()
    if process.stdout is not None:
        process.stdout.close()
    box.finish()


def _what_the_sandbox_said(process: subprocess.Popen[bytes]) -> str:
    """What a sandbox that ended without starting its command wrote (its error),
    once it has exited; read for at most DRAIN_AFTER_EXIT."""
    try:
        process.wait(2.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    assert process.stdout is not None
    fd = process.stdout.fileno()
    chunks: list[bytes] = []
    deadline = time.monotonic() + DRAIN_AFTER_EXIT
    while (left := deadline - time.monotonic()) > 0 and linux.readable(fd, left):
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            break
        chunks.append(chunk)
    process.stdout.close()
    return b"".join(chunks).decode(errors="replace")


__all__ = ["Run", "SpawnError", "start_in_session", "start_per_call"]
