"""What every command says on stderr, and the exit codes: one prefix (``toolpool:
error:``, ``toolpool: note:``), one table of codes, no traceback for bad input (SPEC E2).
"""

from __future__ import annotations

import os
import sys

from toolpool.client.control import ExitCode
from toolpool.errors import ToolpoolError

EXIT_CODES = """exit codes, the same for every command:
  0  done (and no tool result was an error)
  1  failed: a tool result was an error, the daemon could not start or stop, or
     does not answer (daemon status), the confined command fails (doctor)
  2  usage or configuration error: a bad flag, setting, file or argument
  3  no daemon runs (or answers at the endpoint given)
  4  an internal error (a bug): TOOLPOOL_DEBUG=1 shows its traceback"""


class UsageError(ToolpoolError):
    """What was asked cannot be done as asked (exit code 2)."""


def error(message: object) -> None:
    print(f"toolpool: error: {message}", file=sys.stderr, flush=True)


def note(message: object) -> None:
    print(f"toolpool: note: {message}", file=sys.stderr, flush=True)


def debugging() -> bool:
    """Whether ``TOOLPOOL_DEBUG`` asks for tracebacks."""
    return os.environ.get("TOOLPOOL_DEBUG", "").lower() not in ("", "0", "false", "no")


def exit_for(
    exc: Exception, usage: tuple[type[Exception], ...], absent: type[Exception]
) -> tuple[ExitCode, str]:
    """The exit code of an exception that reached the command, and its one line."""
    if isinstance(exc, usage):
        return ExitCode.USAGE, str(exc)
    if isinstance(exc, absent):
        return ExitCode.NOT_RUNNING, str(exc)
    if isinstance(exc, ToolpoolError | OSError):
        return ExitCode.FAILED, str(exc) or type(exc).__name__
    hint = "" if debugging() else " (TOOLPOOL_DEBUG=1 shows the traceback)"
    return ExitCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}{hint}"
