"""``toolpool daemon start|stop|status``: a daemon in the background, from the client
side, through its pid file and its socket.

The daemon is started as a process of its own (``python -m toolpool daemon run …``),
never imported: this side knows the runtime directory, the client library and the
one function that ends processes (``toolpool.sandbox.terminate``), nothing of the
daemon's insides.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from toolpool.client import Client, ClientError
from toolpool.errors import ToolpoolError
from toolpool.runtime import (
    ensure_private,
    path_setting,
    process_alive,
    read_endpoint,
    running_pid,
)
from toolpool.sandbox.terminate import Escalation, terminate

# Seconds the daemon gets, past its drain_grace, to stop after the first SIGTERM …
STOP_MARGIN = 20.0
# … and, after the second SIGTERM (which ends it at once), before it is killed.
FORCED_STOP_GRACE = 2.0


class ExitCode(IntEnum):
    """The exit codes of every ``toolpool`` command (the README's table). ``daemon
    status`` keeps the LSB meaning of 0, 1 and 3: running, running but not answering,
    stopped."""

    OK = 0
    FAILED = 1  # a tool result was an error; the daemon did not start, stop or answer
    USAGE = 2  # a bad flag, setting, configuration file or argument
    NOT_RUNNING = 3  # no daemon runs, or none answers at the endpoint given
    INTERNAL = 4  # a bug: TOOLPOOL_DEBUG=1 shows its traceback


class ControlError(ToolpoolError):
    """No daemon runs, and none could be started."""


def start_background(
    runtime: Path,
    daemon_argv: Sequence[str],
    *,
    log_file: Path | None = None,
    wait: float = 60.0,
    out: TextIO | None = None,
) -> int:
    """Start ``toolpool daemon <daemon_argv>`` detached and wait until it answers. It
    logs to ``log_file`` when given, else ``daemon.log`` in the runtime directory.
    What it did goes to ``out`` (stdout by default), failures to stderr."""
    out = out or sys.stdout
    with path_setting("runtime_dir", runtime, "it cannot be made"):
        runtime = ensure_private(runtime)
    pid = running_pid(runtime)
    if pid is not None:
        print(f"toolpool daemon is already running (pid {pid})", file=out)
        return ExitCode.OK
    argv = [sys.executable, "-m", "toolpool", "daemon", *daemon_argv]
    if log_file is None:
        log_file = runtime / "daemon.log"
        argv += ["--log-file", str(log_file)]
    # Its stderr goes to the log too: what it prints before its logging is set up, or
    # a traceback it could not log, is then in the tail shown when it fails to start.
    with _opened_log(log_file) as errors:
        start = errors.tell()  # what this run writes begins here (SPEC E2)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if process.poll() is not None:
            print(
                f"toolpool: error: the daemon exited at start (status {process.returncode}): "
                f"{start_failure(log_file, start)} (log: {log_file})",
                file=sys.stderr,
            )
            return ExitCode.FAILED
        endpoint = read_endpoint(runtime)
        status = None
        if endpoint is not None and endpoint.get("pid") == process.pid:
            status = _answers(runtime, full=True)
        if endpoint is not None and isinstance(status, dict):
            where = endpoint["ipc"] + (f" and {endpoint['tcp']}" if endpoint.get("tcp") else "")
            print(f"toolpool daemon started (pid {process.pid}), listening on {where}", file=out)
            for line in left_out(status):
                print(f"toolpool: note: {line}", file=sys.stderr)
            return ExitCode.OK
        time.sleep(0.1)
    print(
        f"toolpool: error: the daemon did not answer within {wait:g} s; see {log_file}",
        file=sys.stderr,
    )
    return ExitCode.FAILED


def _opened_log(log_file: Path) -> BinaryIO:
    """The daemon's log, opened for its stderr; a PathSettingError naming log_file."""
    with path_setting("log_file", log_file, "it cannot be opened"):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        return open(log_file, "ab")


def ensure_running(
    runtime: Path, *, log_file: Path | None = None, out: TextIO | None = None
) -> int | None:
    """Start a daemon in ``runtime`` when none runs: its pid; None when one was
    running already (or another program started one at the same moment)."""
    if running_pid(runtime) is not None:
        return None
    argv = ["run", "--runtime-dir", str(runtime)]
    started = start_background(runtime, argv, log_file=log_file, out=out) == ExitCode.OK
    pid = running_pid(runtime)
    if pid is None:
        raise ControlError(f"no daemon runs in {runtime}, and none could be started")
    return pid if started else None


class _Daemon:
    """The daemon's process alone (its workers end with it), as ``terminate`` wants."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def pids(self) -> set[int]:
        return {self.pid} if process_alive(self.pid) else set()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, sig)


def stop_background(
    runtime: Path,
    *,
    drain_grace: float = 10.0,
    wait: float | None = None,
    out: TextIO | None = None,
) -> int:
    """Stop the background daemon: a SIGTERM lets it drain (``wait`` seconds, by
    default its ``drain_grace`` and a margin); then ``terminate`` sends the second
    SIGTERM, which ends it at once, and kills it after ``FORCED_STOP_GRACE``."""
    out = out or sys.stdout
    pid = running_pid(runtime)
    if pid is None:
        print("toolpool daemon is not running", file=out)
        return ExitCode.OK
    daemon = _Daemon(pid)
    daemon.signal(signal.SIGTERM)  # the first: drain
    deadline = time.monotonic() + (wait if wait is not None else drain_grace + STOP_MARGIN)
    while daemon.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    report = terminate(daemon, grace=FORCED_STOP_GRACE)
    if report.escalation >= Escalation.KILL:
        print(f"toolpool daemon (pid {pid}) did not stop; killed", file=out)
        return ExitCode.FAILED
    print(f"toolpool daemon stopped (pid {pid})", file=out)
    return ExitCode.OK


def status_background(runtime: Path) -> int:
    """LSB exit codes: 0 running and answering, 1 running but not answering, 3 stopped."""
    pid = running_pid(runtime)
    if pid is None:
        print("toolpool daemon is not running")
        return ExitCode.NOT_RUNNING
    status = _answers(runtime, full=True)
    if not status:
        print(f"toolpool daemon (pid {pid}) is running but does not answer")
        return ExitCode.FAILED
    assert isinstance(status, dict)
    workers = status.get("workers", {})
    print(
        f"toolpool daemon running (pid {pid}, up {status['uptime_seconds']} s): "
        f"{len(status['sessions'])} sessions, {status['clients']} clients, workers "
        + ", ".join(f"{n} {state}" for state, n in workers.items() if n)
    )
    for line in left_out(status):
        print(f"  {line}")
    return ExitCode.OK


def left_out(status: dict[str, Any]) -> list[str]:
    """What the daemon started without, in words (its ``status``: SPEC E9): an MCP
    server that could not be reached, a tool of one that toolpool cannot use."""
    lines = []
    for item in status.get("mcp_left_out") or ():
        what = f"MCP server {item.get('server')!r}"
        if item.get("tool"):
            what = f"MCP tool {item.get('tool')!r} of server {item.get('server')!r}"
        lines.append(f"{what} is left out: {item.get('reason')}")
    return lines


def _answers(runtime: Path, full: bool = False) -> bool | dict[str, Any]:
    try:
        with Client(runtime_dir=runtime, connect_timeout=2.0, timeout=5.0) as client:
            status = client.status()
    except ClientError:
        return False
    return status if full else True


ERROR_PREFIX = "toolpool: error: "


def start_failure(log_file: Path, start: int) -> str:
    """Why a daemon exited at start, from what this run wrote to its log (from byte
    ``start`` on; an earlier run's failure is never shown): its own error line, else
    the first error it logged, else the last line it wrote."""
    try:
        with open(log_file, "rb") as log:
            log.seek(start)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError as exc:
        return f"(its log cannot be read: {exc})"
    for line in lines:
        if line.startswith(ERROR_PREFIX):
            return line.removeprefix(ERROR_PREFIX)
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("level") in ("error", "critical"):
                return str(entry.get("msg"))
    written = [line for line in lines if line.strip()]
    return written[-1].strip() if written else "it wrote nothing"
