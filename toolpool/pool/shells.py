"""Background shells (bash's ``run_in_background``): the pool starts, watches and ends
them; workers only ask (``ShellRequest`` → ``ShellReply``, ``toolpool.worker.shells``).

A shell belongs to its session, not to the worker whose call started it: recycling
or losing that worker changes nothing, and any later call of the session, on any
worker, reads or ends it. It runs in the session's sandbox, where its foreground
commands run (SPEC V5, ``shell_spawn.py``), or where there are none (the ``session``
mechanism off) in a sandbox of its own, confined as a foreground command is there
(``shell_process.py``; which of the two: ``shell_start.py``); either way with what a
worker would have given it besides: its cgroup, made as a worker's is, and the
call's rlimits (SPEC X13; the record of each shell: ``shell_record.py``).

Its output (stdout and stderr together) goes to ``shells/<id>.log`` in the session's
scratch directory as bytes, up to the call's ``spill_bytes`` and a truncation note
(``toolpool.spill``: past the cap it is drained slowly and dropped); a read gets the
byte range not read before, which the worker reads from the file itself.

How many run at once is capped per session, per client and in the daemon
(``shell_bounds.ShellCaps``; the daemon tells the supervisor whose a session is,
``client_of``). A sandbox that fails before its command starts is tried again, up to
``START_ATTEMPTS`` (SPEC X12), as a foreground command's is; a session's sandbox that
is gone is started afresh for the next attempt.

What ends a shell, always its whole process tree (``terminate``; the cgroup, or
without one the process group and every process whose environment carries the
shell's mark — setsid and nohup escapees included):

- ``kill_shell``; its session closing; the pool closing (the daemon's stop);
- ``background_wall_seconds`` (state ``timed_out``), or a limit of its cgroup —
  its CPU allowance spent over all its processes (``cpu_seconds``), a fork its
  ``processes`` limit refused, the OOM killer (``memory_bytes``) — state ``killed``,
  the limit named (``shell_bounds``, SPEC L9);
- its command exiting: what it left running is ended after a short drain;
- the daemon's death: the session's sandbox, or the shell's own bubblewrap, dies
  with it (and every PID namespace in it); the next start kills what is left in
  the dead daemon's cgroups
  (``remove_stale_cgroups``) and, without cgroups, every process with a dead
  daemon's mark (``remove_stale_shells``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Hashable
from functools import partial
from pathlib import Path

from toolpool.background import ShellInfo, ShellState
from toolpool.errors import ToolError
from toolpool.models import ErrorCode
from toolpool.pool import shell_bounds
from toolpool.pool.environments import SessionSandboxes
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.shell_bounds import LimitEnd, ShellCaps
from toolpool.pool.shell_process import (
    READY_TIMEOUT,
    OwnSandbox,
)
from toolpool.pool.shell_record import Shell, clean_up, discard
from toolpool.pool.shell_start import Where, start_command
from toolpool.protocol import CallContext, ShellAction, ShellReply, ShellRequest
from toolpool.sandbox import linux
from toolpool.sandbox.command import RETRY_PAUSE_SECONDS, START_ATTEMPTS, NetworkNotConnected
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.mounts import HOST_ROOT
from toolpool.sandbox.session_box import SandboxStartError
from toolpool.sandbox.terminate import terminate
from toolpool.spill import SpillFile

log = logging.getLogger("toolpool.pool")

KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when a shell is ended
END_WAIT = 10.0  # a hang guard: a shell whose processes survive SIGKILL is given up on
TICK = 0.25  # seconds between looks at the running shells' wall time and limits


class ShellRefused(Exception):
    """A request the supervisor refuses; the message is for the model, the ``code``
    (an ErrorCode) for the result."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.EXECUTION_FAILED) -> None:
        super().__init__(message)
        self.code = code


class ShellSupervisor:
    """The pool's background shells, by id; each request answered for the session of
    the call that asked. ``WorkerPool`` makes one, and closes it when it closes.

    ``client_of`` says whose a session is (a key equal for one client's sessions;
    None: not known, no cap per client). The daemon, which keeps the sessions' owners,
    sets it. A callback, not a field of the call's context: the client is none of the
    worker's business (the context crosses to it), and the daemon's table stays the
    one truth — asked once, as a shell starts (a session's owner never changes)."""

    def __init__(
        self,
        processes: WorkerProcesses,
        *,
        wall_seconds: float,
        caps: ShellCaps | None = None,
    ) -> None:
        self._processes = processes  # the sandbox profile, policy and cgroups in use
        self.wall_seconds = wall_seconds
        self.caps = caps or ShellCaps()
        self.client_of: Callable[[str], Hashable | None] = lambda _session_id: None
        self.sandbox_retries = 0  # starts tried again: the sandbox failed before them
        self._shells: dict[str, Shell] = {}
        self._roots: frozenset[int] = frozenset()  # read from the ZAP thread (confines)
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._open = True
        self.sandboxes = SessionSandboxes(processes)  # where sessions' commands start (V1)

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
                    shell = await self.start(context, limits, request.command, call_id)
                    return ShellReply(call_id, request_id, shell.to_dict())
                case ShellAction.OUTPUT:
                    shell, start, end = self.read(context.session_id, request.shell_id)
                    return ShellReply(call_id, request_id, shell.to_dict(), start=start, end=end)
                case ShellAction.KILL:
                    shell = await self.kill(context.session_id, request.shell_id)
                    return ShellReply(call_id, request_id, shell.to_dict())
                case ShellAction.SANDBOX:
                    if not self._open:
                        raise ShellRefused("Commands cannot start: the daemon is stopping.")
                    found = await self.sandboxes.address(context, limits)
                    return ShellReply(call_id, request_id, **found)
        except SandboxStartError as exc:
            return ShellReply(call_id, request_id, error=exc.message, code=exc.code or "")
        except ShellRefused as exc:
            return ShellReply(call_id, request_id, error=str(exc), code=exc.code.value)
        except Exception as exc:  # the worker must hear an answer, whatever went wrong
            log.exception("background shell request %s failed", request.action.value)
            text = f"The background shell request failed: {type(exc).__name__}: {exc}"
            return ShellReply(call_id, request_id, error=text)

    async def start(
        self, context: CallContext, limits: Limits, command: str, call_id: str = ""
    ) -> ShellInfo:
        """Start ``command`` for the call's session (``call_id``: the call that starts
        it, whose its network connections are, N3); its record (running). Refused
        (``limit_exceeded``) past a cap; a sandbox that fails before the command is
        tried again, up to ``START_ATTEMPTS``, then refused (``sandbox_failed``)."""
        if not self._open:
            raise ShellRefused("Background shells cannot start: the daemon is stopping.")
        if context.scratch_dir is None:
            raise ShellRefused("This session has no scratch directory for the shell's output.")
        client = self.client_of(context.session_id)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:  # the session's sandbox (started afresh if it is gone), or its own root
                socket, _ = await self.sandboxes.socket(context, limits)
                # its own root and views where it has no sandbox (V12–V14)
                placed = (HOST_ROOT, {}) if socket else await self.sandboxes.root_of(context)
            except SandboxStartError as exc:
                raise ShellRefused(exc.message, ErrorCode.SANDBOX_FAILED) from None
            if not socket and context.egress and not limits.network:
                raise ShellRefused(
                    "This session's network is a policy, which only a session sandbox "
                    "carries out (its own network namespace and proxy).",
                    ErrorCode.SANDBOX_FAILED,
                )
            # The caps are judged at each attempt: a retry must not overrun them.
            running = [(s.session_id, s.client) for s in self.running()]
            refusal = self.caps.refusal(running, context.session_id, client)
            if refusal is not None:
                raise ShellRefused(refusal, ErrorCode.LIMIT_EXCEEDED)
            where = Path(socket) if socket else placed
            shell = await self._spawn(context, limits, command, client, where, call_id)
            failure, again = (shell, True) if isinstance(shell, str) else await self._started(shell)
            if isinstance(shell, Shell):
                if failure is None:
                    pid, extra = shell.process.pid, {"session": shell.session_id}
                    log.info("background shell %s started (pid %d)", shell.id, pid, extra=extra)
                    return shell.info()
                self._forget(shell)
                shell.output.path.unlink(missing_ok=True)  # what the sandbox said is the error
            assert failure is not None
            if not again or attempt == START_ATTEMPTS:
                raise ShellRefused(failure, ErrorCode.SANDBOX_FAILED)
            self.sandbox_retries += 1
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            log.warning("background shell start retried: %s", failure)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _started(self, shell: Shell) -> tuple[str | None, bool]:
        """Once the sandbox has started the shell's command: (None, _). Else it is
        over (failed) and (why, whether another attempt may be made): yes when the
        sandbox ended without starting the command, or pasta ended before it
        connected the namespace; not when the network's setup ran out of time or the
        sandbox hung (each waited its time already)."""
        if not self._open:  # the daemon began to stop as it started: it is not to run
            await self._end(shell, ShellState.FAILED, "the daemon stopped", grace=0)
            return "Background shells cannot start: the daemon is stopping.", False
        if not isinstance(shell.process, OwnSandbox):
            return None, False  # in the session's sandbox: ready once it is a shell
        loop = asyncio.get_running_loop()
        shell.starting = loop.run_in_executor(None, shell.process.bring_up)
        try:
            ready = await shell.starting
        except ToolError as exc:  # the sandbox could not be completed: it never ran
            await self._end(shell, ShellState.FAILED, exc.message, grace=0)
            return exc.message, isinstance(exc, NetworkNotConnected) and exc.again
        if ready is None:
            why = f"The sandbox did not start the command within {READY_TIMEOUT:g} s."
            await self._end(shell, ShellState.FAILED, why, grace=0)
            return why, False
        if not ready:
            # No ready byte: the sandbox ends by itself, and its exit says why (_finish).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(shell.done), END_WAIT)
            why = "The sandbox could not start the command."
            await self._end(shell, ShellState.FAILED, why, grace=0)  # had it not ended
            return shell.reason or why, True
        return None, False

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

    async def stop(self, session_id: str, reason: str) -> list[str]:
        """End the session's running shells (``killed``, ``reason``), their records
        kept; their ids (a rewind's: they saw a state that is gone, B2)."""
        shells = self.running(session_id)
        await asyncio.gather(*(self._end(s, ShellState.KILLED, reason) for s in shells))
        return [s.id for s in shells]

    async def end_session(self, session_id: str) -> None:
        """The session closes: its shells end, and their records go."""
        shells = [s for s in self._shells.values() if s.session_id == session_id]
        await asyncio.gather(
            *(self._end(s, ShellState.KILLED, "its session closed") for s in shells)
        )
        for shell in shells:
            self._forget(shell)
        await self.sandboxes.end_session(session_id)

    async def close(self, reason: str = "the daemon stopped") -> None:
        """End every shell; no new one starts. Nothing is left running."""
        self._open = False
        shells = list(self._shells.values())
        await asyncio.gather(*(self._end(s, ShellState.KILLED, reason) for s in shells))
        for shell in shells:
            self._forget(shell)
        await self.sandboxes.close()
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
        """Whether ``pid`` is a shell's or runs under one, or in a session's sandbox
        (X2). Any thread."""
        roots = self._roots
        if roots and linux.lineage_includes(pid, set(roots)):
            return True
        return self.sandboxes.confines(pid)

    def __repr__(self) -> str:
        running = len(self.running())
        return f"<ShellSupervisor [{running} running, {len(self._shells) - running} ended]>"

    # -- a shell's life ---------------------------------------------------------------------

    async def _spawn(
        self,
        context: CallContext,
        limits: Limits,
        command: str,
        client: Hashable | None,
        where: Where,
        call_id: str = "",
    ) -> Shell | str:
        """Start the command — in the session sandbox whose socket ``where`` is, else
        in a sandbox of its own with ``where`` its root's arguments and views —, its
        output's reader and its exit's watch; or why the session's sandbox did not
        start it (nothing of it ran: another attempt may be made)."""
        assert context.scratch_dir is not None
        shell_id = self._new_id()
        directory = Path(context.scratch_dir) / "shells"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        output = SpillFile(directory / f"{shell_id}.log", limits.spill_bytes)
        mark = f"{os.getpid()}:{shell_id}"
        base = self.sandboxes.base_of(context.session_id)[0] if isinstance(where, Path) else {}
        cgroup = None
        try:
            if self._processes.cgroups is not None:  # as a worker's: the call's limits
                cgroup = self._processes.new_cgroup(f"shell-{shell_id}", limits)
            started = await start_command(
                where, context, limits, command, cgroup, mark, self._processes,
                base=base, call_id=call_id,
            )  # fmt: skip
        except BaseException:
            discard(output, cgroup)
            raise
        if isinstance(started, str):
            discard(output, cgroup)
            return started
        deadline = time.monotonic() + self.wall_seconds
        shell = Shell.begin(
            shell_id, context, command, client, started, output, cgroup, limits, deadline
        )
        process = shell.process
        self._shells[shell_id] = shell
        if process.root is not None:
            self._roots = self._roots | {process.root}
        process.watch(partial(self._on_exit, shell))
        if self._ticker is None:
            self._ticker = asyncio.ensure_future(self._watch())
        return shell

    def _new_id(self) -> str:
        while True:
            shell_id = secrets.token_hex(4)
            if shell_id not in self._shells:
                return shell_id

    async def _end(
        self,
        shell: Shell,
        state: ShellState,
        reason: str,
        *,
        grace: float = KILL_GRACE,
        limit: LimitEnd | None = None,
    ) -> None:
        """End a running shell with ``state`` (and the ``limit`` that ended it); wait
        until it is over (a shell that ended already is left as it is)."""
        if shell.state is ShellState.RUNNING:
            shell.state, shell.reason, shell.limit = state, reason, limit
            members = shell.members(with_root=True)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: terminate(members, grace=grace))
            if shell.cgroup is not None:
                shell.cgroup.kill_all()
        try:
            await asyncio.wait_for(asyncio.shield(shell.done), END_WAIT)
        except TimeoutError:
            log.error("background shell %s did not end: its processes survive SIGKILL", shell.id)

    def _on_exit(self, shell: Shell, code: int) -> None:
        """The shell's process exited (``ShellProcess.watch`` says): clean up."""
        task = asyncio.ensure_future(self._finish(shell, code))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, shell: Shell, code: int) -> None:
        loop = asyncio.get_running_loop()
        end: tuple[ShellState, str, LimitEnd | None] = (ShellState.EXITED, "", None)
        try:
            if shell.starting is not None:  # the clean-up reads the rest of the ready
                await asyncio.wait([shell.starting])  # pipe: after the start's look at it
            end = await loop.run_in_executor(None, clean_up, shell, code)
        except Exception:
            log.exception("cleaning up after background shell %s", shell.id)
        if shell.cgroup is not None:
            shell.cgroup.remove()
        shell.exit_code = code
        shell.ended = time.time()
        if shell.state is ShellState.RUNNING:  # else whoever ended it said how
            shell.state, shell.reason, shell.limit = end
        if shell.process.root is not None:
            self._roots = self._roots - {shell.process.root}
        ended, extra = shell.info().describe_state(), {"session": shell.session_id}
        log.info("background shell %s ended: %s", shell.id, ended, extra=extra)
        if not shell.done.done():
            shell.done.set_result(None)

    def _forget(self, shell: Shell) -> None:
        self._shells.pop(shell.id, None)

    async def _watch(self) -> None:
        """End the shells that ran out of wall time, or past a limit of their cgroup."""
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            for shell in self.running():
                # Once its process exited, its clean-up reads (and closes) the counters.
                acct = None if shell.process.exited else shell.accounting
                counters = None if acct is None else (acct.cpu_seconds(), acct.pids_refusals())
                overrun = shell_bounds.overrun(
                    shell.limits, now, shell.deadline, self.wall_seconds, counters
                )
                if overrun is not None:
                    state, limit = overrun
                    task = asyncio.ensure_future(self._end(shell, state, limit.reason, limit=limit))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
