"""Installed, not only checked out (SPEC E5): a wheel built from the repo, installed
into a fresh virtual environment, runs the daemon, the demo and a confined bash call
from a directory where the checkout cannot be imported.

The wheel is built from a copy of the repo's tracked files (a build writes build/ and
*.egg-info beside its sources, and the tree must stay clean); its dependencies come
from the package index or pip's cache. On the 2-core machine the module takes about
25 s: 15 s to build the wheel and install it with its dependencies from pip's cache,
6 s for the daemon's start, the demo, the call and the stop.
"""

from __future__ import annotations

import json
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from toolpool.runtime import SOCKET_NAME, read_endpoint

from .daemon_support import ROOT, daemon_env, running
from .wheel_support import build_wheel, install, tracked_files

# Building the wheel and installing its dependencies is most of the time: the per-test
# timeout would count it against the first test.
pytestmark = [pytest.mark.spec("E5"), pytest.mark.timeout(240)]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    home: Path  # a directory outside the repo: the commands' working directory

    @property
    def toolpool(self) -> str:
        return str(self.venv / "bin" / "toolpool")

    def env(self) -> dict[str, str]:
        env = daemon_env(self.home)
        for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
            env.pop(name, None)
        return env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.toolpool, *args],
            cwd=self.home,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(base)
    venv = base / "venv"
    install(wheel, venv)
    home = base / "home"
    home.mkdir()
    return Installed(wheel, venv, home)


def test_the_wheel_holds_every_file_of_the_package(installed: Installed) -> None:
    # Given the files the repo tracks under toolpool/ (py.typed among them)
    tracked = {name for name in tracked_files() if name.startswith("toolpool/")}
    assert "toolpool/py.typed" in tracked
    # When the wheel's files are listed
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if name.startswith("toolpool/")}
    # Then every one of them is in it, data files included
    assert tracked - shipped == set()


def test_the_installed_toolpool_is_not_the_checkout(installed: Installed) -> None:
    done = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", "import toolpool; print(toolpool.__file__)"],
        cwd=installed.home,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    imported = Path(done.stdout.strip())
    assert imported.is_relative_to(installed.venv)
    assert not imported.is_relative_to(ROOT)


def _daemon_tree(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)} | {pid}
    except psutil.NoSuchProcess:
        return set()


def test_the_installed_daemon_runs_the_demo_and_a_confined_bash_call(
    installed: Installed,
) -> None:
    # Given a short runtime dir (the daemon's socket path must fit a Unix socket's)
    runtime = installed.home / "rt"
    dir_flag = ("--runtime-dir", str(runtime))
    # When the installed toolpool starts its daemon in the background
    started = installed.run("daemon", "start", *dir_flag, "--min-workers", "1")
    assert started.returncode == 0, started.stderr
    info = read_endpoint(runtime)
    assert info is not None
    pid = int(str(info["pid"]))
    tree = _daemon_tree(pid)
    try:
        # Then the demo turn goes through it
        demo = installed.run("demo", *dir_flag)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "turn end" in demo.stdout
        # And a bash call runs confined: the runtime dir with the daemon's socket,
        # which this process sees, is invisible to the command (SPEC X2)
        assert (runtime / SOCKET_NAME).exists()
        # (the words split by quotes: the output shows the command as it runs too)
        probe = f"test -e {runtime / SOCKET_NAME} && echo socket-vis''ible || echo socket-hid''den"
        call = installed.run(
            "call", *dir_flag, "--print-result", "bash", json.dumps({"command": probe})
        )
        assert call.returncode == 0, call.stdout + call.stderr
        # the result's lines (the command itself, shown as it starts, names both words)
        printed = call.stdout.splitlines()
        assert "socket-hidden" in printed
        assert "socket-visible" not in printed
        tree |= _daemon_tree(pid)
    finally:
        stopped = installed.run("daemon", "stop", *dir_flag)
    # And it stops, leaving none of its processes behind (workers included)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 20  # a hang guard: the tree ends with the daemon
    while any(running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {p for p in tree if running(p)} == set()
    assert read_endpoint(runtime) is None


def test_the_installed_bench_says_it_needs_the_source_checkout(installed: Installed) -> None:
    # When the installed toolpool is asked for the bench, which ships with the source only
    done = installed.run("bench")
    # Then it refuses in a message that says so, and no traceback
    assert done.returncode != 0
    message = done.stderr.lower()
    assert "source" in message
    assert "checkout" in message
    assert "Traceback" not in done.stderr
