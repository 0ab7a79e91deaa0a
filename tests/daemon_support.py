"""Real daemons for end-to-end tests: started as subprocesses, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from toolpool.runtime import read_endpoint

ROOT = Path(__file__).resolve().parent.parent


def daemon_env(tmp: Path) -> dict[str, str]:
    """An environment free of the user's toolpool settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPOOL_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "config")
    return env


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    runtime: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def endpoint(self) -> dict[str, object]:
        info = read_endpoint(self.runtime)
        assert info is not None
        return info

    def log_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def tree(self) -> set[int]:
        try:
            return {p.pid for p in psutil.Process(self.pid).children(recursive=True)} | {self.pid}
        except psutil.NoSuchProcess:
            return set()


def start_daemon(
    tmp: Path, *flags: str, runtime: Path | None = None, env: dict[str, str] | None = None
) -> Daemon:
    runtime = runtime or tmp / "rt"
    log = tmp / "daemon.log"
    argv = [
        sys.executable, "-m", "toolpool", "daemon", "run",
        "--runtime-dir", str(runtime),
        "--min-workers", "1", "--max-workers", "3",
        "--tool-modules", "toolpool.tools,tests.worker_tools",
        "--log-file", str(log), "--log-level", "debug",
        *flags,
    ]  # fmt: skip
    process = subprocess.Popen(argv, cwd=ROOT, env={**daemon_env(tmp), **(env or {})})
    # A hang guard: a daemon is up within seconds, but one that imports MCP servers
    # waits for them (up to 40 s of its own), which a loaded machine stretches
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        info = read_endpoint(runtime)
        if info is not None and info.get("pid") == process.pid:
            return Daemon(process, runtime, log)
        if process.poll() is not None:
            raise AssertionError(f"the daemon exited with {process.returncode}: {log.read_text()}")
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise AssertionError("the daemon did not come up")


def stop_daemon(daemon: Daemon, timeout: float = 30) -> int:
    """SIGTERM, wait; the daemon's whole tree must be gone after."""
    tree = daemon.tree()
    if daemon.process.poll() is None:
        daemon.process.send_signal(signal.SIGTERM)
    try:
        code = daemon.process.wait(timeout)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait()
        raise AssertionError("the daemon did not stop on SIGTERM") from None
    deadline = time.monotonic() + 20  # a hang guard: the tree ends with the daemon
    while any(running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in tree if running(p)]
    assert left == [], f"the daemon left processes behind: {left}"
    return code


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def running_daemon(
    tmp: Path, *flags: str, runtime: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[Daemon]:
    daemon = start_daemon(tmp, *flags, runtime=runtime, env=env)
    try:
        yield daemon
    finally:
        assert stop_daemon(daemon) == 0


@contextmanager
def shared_daemon(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon that a module's tests share: its processes outlive each test, so the
    per-test leak check leaves them alone (SHARED_ROOTS); stopping it at the end
    must leave nothing behind."""
    from .conftest import SHARED_ROOTS

    daemon = start_daemon(tmp, *flags, env=env)
    SHARED_ROOTS.add(daemon.pid)
    try:
        yield daemon
    finally:
        SHARED_ROOTS.discard(daemon.pid)
        assert stop_daemon(daemon) == 0
