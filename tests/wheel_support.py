"""The wheel the E5 and V17 tests build from the repo and install into a fresh virtual
environment (its dependencies from the package index or pip's cache).

The wheel is built from a copy of the repo's tracked files: a build writes build/ and
*.egg-info beside its sources, and the tree must stay clean.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .daemon_support import ROOT


def tracked_files() -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    return [name for name in done.stdout.decode().split("\0") if name]


def run_step(argv: list[str]) -> None:
    """Run a build step; one that fails shows what it said."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"{argv} exited with {done.returncode}:\n{done.stderr}"


def build_wheel(base: Path) -> Path:
    """The repo's wheel, built under ``base``."""
    source = base / "src"
    for name in tracked_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        # A tracked file another change deleted from the working tree is not built.
        if (ROOT / name).is_file():
            target.write_bytes((ROOT / name).read_bytes())
    dist = base / "dist"
    run_step(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)]
    )
    (wheel,) = dist.glob("toolpool-*.whl")
    return wheel


def install(wheel: Path, venv: Path, python: str = sys.executable) -> None:
    """A venv made with ``python`` at ``venv`` holding the wheel and its dependencies.
    Without pip of its own (ensurepip costs seconds): this pip installs into it."""
    run_step([python, "-m", "venv", "--without-pip", str(venv)])
    run_step([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
              "install", "-q", str(wheel)])  # fmt: skip
