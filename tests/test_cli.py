"""The command line: the demo the README's first command runs."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.spec("P3", "P7", "P9", "M2")
def test_demo_pushes_a_turn_through_the_pipeline_and_prints_its_events() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # the refused edit (F3), the read, the accepted edit with its diff, streamed progress
    assert "c3 (validation_failed)" in out
    assert "has not been read yet" in out
    assert "+third note" in out
    assert "c6 step 2/3 done" in out
    assert "turn end: 6 results, 1 errors" in out


def test_version_and_usage() -> None:
    version = subprocess.run(
        [sys.executable, "-m", "toolpool", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("toolpool ")
    usage = subprocess.run(
        [sys.executable, "-m", "toolpool"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 2
    assert "COMMAND" in usage.stderr
