"""SPEC R6: the audit log against an attacker who may write in the log's directory: a
link, a FIFO or another user's file planted at its path, before the daemon opens it or
between two rotations."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolpool.daemon.audit import AuditLog, AuditLogRefused

from .daemon_support import ROOT, daemon_env


def plant_target(tmp_path: Path) -> Path:
    """A file of the daemon's user elsewhere: what a planted link points the log at."""
    target = tmp_path / "elsewhere" / "crontab"
    target.parent.mkdir()
    target.write_text("* * * * * root true\n")
    target.chmod(0o644)
    return target


def snapshot(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_mode, st.st_mtime_ns


def open_log(path: Path, **options: Any) -> AuditLog:
    return AuditLog(path, **{"max_bytes": 1 << 20, "backups": 2, **options})


def record(n: int, text: str = "noop") -> dict[str, Any]:
    return {"session": "s", "call": str(n), "tool": text, "_arguments": {"n": n}}


def lines_of(*paths: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in paths for line in path.read_text().split("\n") if line]


# --- R6: the file at the path -------------------------------------------------------------


@pytest.mark.spec("R6")
@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_R6_a_symlink_planted_at_the_path_is_refused_and_its_target_untouched(
    tmp_path: Path, dangling: bool
) -> None:
    # Given a link at the log's path, to a file of the daemon's user or to nothing yet
    target = plant_target(tmp_path)
    before = snapshot(target)
    if dangling:
        target = target.with_name("cron.d-new")
    path = tmp_path / "audit.log"
    path.symlink_to(target)
    # When the log is opened, it is refused, saying why
    with pytest.raises(AuditLogRefused, match="it is a symbolic link"):
        open_log(path)
    # Then nothing was written, created or made private through the link
    assert path.is_symlink()
    if dangling:
        assert not target.exists()
    else:
        assert snapshot(target) == before


@pytest.mark.spec("R6")
def test_R6_a_hard_linked_log_is_refused(tmp_path: Path) -> None:
    # Given a second name for a file of the daemon's user, planted at the path
    target = plant_target(tmp_path)
    before = snapshot(target)
    path = tmp_path / "audit.log"
    os.link(target, path)
    # When the log is opened, it is refused: the other name may be any file of ours
    with pytest.raises(AuditLogRefused, match="it has 2 links, not one"):
        open_log(path)
    assert snapshot(target) == before


@pytest.mark.spec("R6")
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_R6_a_log_of_another_user_is_refused(tmp_path: Path) -> None:
    # Given a file at the path that nobody (uid 65534) made, to read what is appended
    path = tmp_path / "audit.log"
    path.write_text("")
    os.chown(path, 65534, 65534)
    path.chmod(0o666)
    with pytest.raises(AuditLogRefused, match=r"it belongs to uid 65534, not to the daemon's"):
        open_log(path)
    assert path.read_bytes() == b"" and path.stat().st_mode & 0o777 == 0o666


@pytest.mark.spec("R6")
def test_R6_a_fifo_at_the_path_is_refused_without_waiting_for_a_reader(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    os.mkfifo(path)
    # No reader: a blocking open would hold the daemon's start (the test's timeout)
    with pytest.raises(AuditLogRefused, match="it is not a regular file"):
        open_log(path)


@pytest.mark.spec("R6")
def test_R6_an_existing_0644_log_becomes_0600_and_rotation_keeps_it_so(tmp_path: Path) -> None:
    # Given a log a first version left world-readable
    path = tmp_path / "audit.log"
    path.write_text(json.dumps({"call": "old"}) + "\n")
    path.chmod(0o644)
    # When the daemon opens it, it is private before any line is written, its lines kept
    log = open_log(path)
    assert path.stat().st_mode & 0o777 == 0o600
    log.write(record(1))
    log.close()
    assert [r["call"] for r in lines_of(path)] == ["old", "1"]
    # And every file a rotation makes is private too
    log = open_log(path, max_bytes=4096, backups=1)
    for n in range(200):
        log.write(record(n))
    log.close()
    rotated = path.with_name("audit.log.1")
    assert {p.stat().st_mode & 0o777 for p in (path, rotated)} == {0o600}
    assert [r["call"] for r in lines_of(rotated, path)][-1] == "199"


Plant = Callable[[Path, Path], None]


def plant_symlink(path: Path, target: Path) -> None:
    path.symlink_to(target)


def plant_dangling_symlink(path: Path, target: Path) -> None:
    path.symlink_to(target.with_name("cron.d-new"))


def plant_fifo(path: Path, target: Path) -> None:
    os.mkfifo(path)


@pytest.mark.spec("R6")
@pytest.mark.parametrize("plant", [plant_symlink, plant_dangling_symlink, plant_fifo])
def test_R6_a_link_planted_between_rotations_is_never_written_through(
    tmp_path: Path,
    plant: Plant,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = plant_target(tmp_path)
    before = snapshot(target)
    path = tmp_path / "audit.log"
    rotations = 0
    shift = AuditLog._shift

    def racing_shift(log: AuditLog) -> None:
        # The attacker wins the race of the second rotation: just after PATH became
        # PATH.1, before the new PATH is made.
        nonlocal rotations
        shift(log)
        rotations += 1
        if rotations == 2:
            plant(path, target)

    monkeypatch.setattr(AuditLog, "_shift", racing_shift)
    caplog.set_level(logging.ERROR, logger="toolpool.daemon.audit")
    # Given a log rotated at 4 KiB, when far more than three files' worth is written
    log = open_log(path, max_bytes=4096, backups=3)
    for n in range(500):
        log.write(record(n))
    log.close()
    # Then the plant is where it was planted, its target untouched or not created
    assert path.is_symlink() or path.is_fifo()
    assert snapshot(target) == before
    assert not target.with_name("cron.d-new").exists()
    # ... no line is lost: after the first rotation, the rest went into the file open
    assert rotations == 2
    kept = lines_of(path.with_name("audit.log.2"), path.with_name("audit.log.1"))
    assert [r["call"] for r in kept] == [str(n) for n in range(500)]
    assert not path.with_name("audit.log.3").exists()
    # ... and it was said once, not once per line
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "was not rotated (the new audit.log: it is" in errors[0]
    assert "rotation stopped" in repr(log)


@pytest.mark.spec("R6", "E2")
@pytest.mark.parametrize("action", ["run", "start"])
def test_R6_a_daemon_with_a_planted_audit_log_says_so_in_one_line(
    tmp_path: Path, action: str
) -> None:
    target = plant_target(tmp_path)
    before = snapshot(target)
    path = tmp_path / "shared" / "audit.log"
    path.parent.mkdir()
    path.symlink_to(target)
    runtime = tmp_path / "rt"
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "daemon", action, "--runtime-dir", str(runtime),
         "--min-workers", "0", "--audit-log", str(path)],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("toolpool: error: ")]
    assert len(errors) == 1, done.stderr
    assert f"audit_log = '{path}': it is a symbolic link" in errors[0]
    assert snapshot(target) == before
    assert not (runtime / "daemon.pid").exists()
