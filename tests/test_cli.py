"""The command line: the demo the README's first command runs, in-process here (the
daemon's commands are tested against a real daemon in test_daemon.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.spec("P3", "P7", "P9", "M2")
def test_demo_pushes_a_turn_through_the_pipeline_and_prints_its_events() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "demo", "--in-process"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # parallel reads and greps, the edit's diff, streamed test output, the end
    assert "✓ c2 calc/ops.py:6:    # TODO: handle overflow" in out
    assert "-    # TODO: handle overflow" in out
    assert "… c7 running test_mul" in out
    assert "turn end: 7 results, 0 errors" in out


def test_demo_without_a_daemon_says_how_to_start_one(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "demo", "--runtime-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "toolpool daemon start" in done.stdout


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


def test_unknown_flags_are_refused_but_the_bench_gets_its_own() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "toolpool", "status", "--bogus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2
    assert "unrecognized arguments: --bogus" in refused.stderr
    # `toolpool bench` hands every flag, --help too, to bench/run.py
    bench = subprocess.run(
        [sys.executable, "-m", "toolpool", "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage: toolpool bench" in bench.stdout
    assert "--quick" in bench.stdout
    wrong = subprocess.run(
        [sys.executable, "-m", "toolpool", "bench", "--only", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2
    assert "unknown scenarios ['nonsense']" in wrong.stderr
