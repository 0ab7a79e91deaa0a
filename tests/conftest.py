from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test proves it leaves no process behind (STYLE habit 9)."""
    before = _descendants()
    yield
    deadline = time.monotonic() + 5.0
    left = _descendants() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {pid for pid in left if psutil.pid_exists(pid)} & _descendants()
    described = []
    for pid in left:
        try:
            described.append(" ".join(psutil.Process(pid).cmdline()) or str(pid))
        except psutil.Error:
            continue
    assert not described, f"processes left behind: {described}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root
