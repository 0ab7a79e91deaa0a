"""What the background shells' tests share: markers to find a test's processes, calls
through a client session, and waits on a shell's state (SPEC F6, L9).

Every shell's processes are found by a marker in their command line (a sleep of an
odd length): "none left" means no live process carries it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from toolpool import Client, ToolCall
from toolpool.models import ToolResult

_MARKS = itertools.count(1)


def marker() -> str:
    """A sleep length no other process has: the marker of one test's processes."""
    return f"{4000 + next(_MARKS)}.{os.getpid() % 1000:03d}"


def marked(mark: str, *, sleeps_only: bool = False) -> list[int]:
    """Live processes whose command line carries ``mark`` (the shell, its sandbox…),
    or only the ``sleep`` processes."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE or not any(mark in a for a in cmdline):
            continue
        if not sleeps_only or cmdline[0].endswith("sleep"):
            found.append(process.pid)
    return found


def sleeping(mark: str) -> int:
    return len(marked(mark, sleeps_only=True))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout  # a hang guard, not a measure
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.05)


def call(session: Any, name: str, **arguments: Any) -> ToolResult:
    (result,) = session.submit([ToolCall(f"c{next(_MARKS)}", name, arguments)]).results()
    return result


def start(session: Any, command: str) -> tuple[str, ToolResult]:
    result = call(session, "bash", command=command, run_in_background=True)
    assert not result.is_error, result.text
    return str(result.details["shell_id"]), result


def shell_status(client: Client, session: Any, shell_id: str) -> dict[str, Any] | None:
    shells = client.status()["sessions"].get(session.id, {}).get("shells", [])
    return next((s for s in shells if s["shell_id"] == shell_id), None)


def wait_state(client: Client, session: Any, shell_id: str, state: str) -> dict[str, Any]:
    seen: list[dict[str, Any] | None] = [None]

    def reached() -> bool:
        seen[0] = shell_status(client, session, shell_id)
        return seen[0] is not None and seen[0]["state"] == state

    try:
        wait_until(reached, f"shell {shell_id} {state}")
    except AssertionError:
        raise AssertionError(f"never: shell {shell_id} {state}; last seen: {seen[0]}") from None
    found = seen[0]
    assert found is not None
    return found


def output_part(result: ToolResult) -> str:
    """What a bash_output result holds of the command's output (its last line is the
    shell's state)."""
    lines = result.text.splitlines()
    assert lines[-1].startswith("Shell "), result.text
    return "\n".join(lines[:-1])


def read_until(session: Any, shell_id: str, needle: str) -> tuple[str, ToolResult]:
    """bash_output, again and again, until ``needle`` came: everything read, the last
    result."""
    read: list[str] = []
    last: list[ToolResult] = []

    def seen() -> bool:
        result = call(session, "bash_output", shell_id=shell_id)
        assert not result.is_error, result.text
        last[:] = [result]
        part = output_part(result)
        if part != "(no new output)":
            read.append(part)
        return needle in "\n".join(read)

    wait_until(seen, f"{needle!r} in the output of shell {shell_id}")
    return "\n".join(read), last[0]
