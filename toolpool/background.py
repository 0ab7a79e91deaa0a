"""Background shells: commands a call starts that outlive it (bash's
``run_in_background``), read and ended by later calls of the same session
(``bash_output``, ``kill_shell``).

Tools reach them through ``ToolContext.shells``, a ``BackgroundShells``. In a worker
it asks the pool, which owns the processes (``toolpool.pool.shells``): a shell
belongs to its session, not to the worker that started it. The in-process executor
has none, unless an embedder gives one. The records here are what crosses between
them; a refusal (an unknown shell, another session's) is a ``ToolError`` whose
message is for the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol


class ShellState(StrEnum):
    """Where a background shell is in its life."""

    RUNNING = "running"
    EXITED = "exited"  # the command ended by itself: ``exit_code`` says how
    KILLED = "killed"  # kill_shell, its session closed, the daemon stopped, a limit
    TIMED_OUT = "timed_out"  # it ran for background_wall_seconds
    FAILED = "failed"  # the sandbox could not start it


@dataclass(frozen=True, slots=True)
class ShellInfo:
    """A background shell as its owner reports it. ``started`` and ``ended`` are Unix
    times; ``output_bytes`` is what its output file holds (at most the call's
    ``spill_bytes``, then a truncation note: ``truncated``); ``reason`` says why it
    was ended when it did not exit by itself, and ``limit`` names the limit that
    ended it, with its value (``limit_value``), when one did (SPEC L9)."""

    shell_id: str
    command: str
    state: ShellState
    pid: int
    started: float
    output_path: str
    output_bytes: int = 0
    truncated: bool = False
    exit_code: int | None = None
    ended: float | None = None
    reason: str = ""
    limit: str = ""
    limit_value: float | int | None = None

    def describe_state(self) -> str:
        """The state as the model reads it, after "it": "is running", "exited with
        code 1", "was killed (kill_shell)"…"""
        why = f" ({self.reason})" if self.reason else ""
        match self.state:
            case ShellState.RUNNING:
                return "is running"
            case ShellState.EXITED:
                return f"exited with code {self.exit_code}"
            case ShellState.TIMED_OUT:
                return f"timed out{why} and was stopped"
            case ShellState.KILLED:
                return f"was killed{why}"
            case _:
                return f"failed to start: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "shell_id": self.shell_id,
            "command": self.command,
            "state": self.state.value,
            "pid": self.pid,
            "started": self.started,
            "output_path": self.output_path,
            "output_bytes": self.output_bytes,
            "truncated": self.truncated,
            "exit_code": self.exit_code,
            "ended": self.ended,
            "reason": self.reason,
            "limit": self.limit,
            "limit_value": self.limit_value,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShellInfo:
        return cls(
            shell_id=str(data["shell_id"]),
            command=str(data["command"]),
            state=ShellState(data["state"]),
            pid=int(data["pid"]),
            started=float(data["started"]),
            output_path=str(data["output_path"]),
            output_bytes=int(data.get("output_bytes", 0)),
            truncated=bool(data.get("truncated", False)),
            exit_code=None if data.get("exit_code") is None else int(data["exit_code"]),
            ended=None if data.get("ended") is None else float(data["ended"]),
            reason=str(data.get("reason", "")),
            limit=str(data.get("limit", "")),
            limit_value=data.get("limit_value"),
        )


@dataclass(frozen=True, slots=True)
class ShellOutput:
    """What a read of a shell's output gets: its record, and the bytes
    ``[start, end)`` of its output file that no earlier read got (the reader reads
    them from ``shell.output_path``). Each read moves the shell's read position to
    ``end``: the next one gets only what came after."""

    shell: ShellInfo
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class SandboxAddress:
    """Where a session's commands start: its sandbox's socket, and the tmpfs its
    copy-on-write root's layer lies on, if it has one (SPEC V12)."""

    socket: Path
    layer: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # an image's Env (SPEC V13)
    working_dir: str = ""  # and its WorkingDir: where the session's first command starts


class BackgroundShells(Protocol):
    """Where background commands run, for one call (``ToolContext.shells``).

    Every method raises ``ToolError`` when it is refused: no such shell in the call's
    session, too many running, the sandbox could not start the command.
    """

    def start(self, command: str) -> ShellInfo:
        """Start ``command`` (bash -c) confined like a foreground command, in the
        call's workspace; it runs until it exits, is killed, its session closes or
        it reaches its wall time. Returns at once."""
        ...

    def output(self, shell_id: str) -> ShellOutput:
        """The shell's state and the part of its output not read before."""
        ...

    def kill(self, shell_id: str) -> ShellInfo:
        """End the shell's whole process tree (if it runs); its record afterwards."""
        ...

    def sandbox(self, again: bool = False) -> SandboxAddress | None:
        """The session's sandbox, where foreground commands start too (SPEC V1); None
        where there is none (commands get a sandbox each). ``again``: the one given
        before could not be reached; ask afresh."""
        ...
