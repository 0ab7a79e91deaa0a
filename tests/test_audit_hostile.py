"""SPEC R6, R7: the audit log against an attacker — one who may write in the log's
directory (a link or a FIFO planted at its path, before the daemon opens it or between
two rotations), and a model that names its calls to take over the terminal of whoever
reads the log (ESC, C1, CR/LF, U+2028, bidi controls)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolpool.client.audit import print_audit
from toolpool.daemon.audit import AuditLog, AuditLogRefused

from .daemon_support import ROOT, daemon_env

# What must never reach a terminal raw (the newline ending each printed line aside).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")

# A model's names, each meant to do something to the reader's terminal.
HOSTILE = {
    "clear screen": "read\x1b[2J\x1b[H",
    "carriage return": "ok\r2026-12-01T00:00:00Z  forged  ok",
    "newline": "ls\n2026-12-01T00:00:00Z  forged  ok",
    "C1 CSI": "grep\x9b2J",
    "C1 NEL": "glob\x85forged",
    "DEL": "edit\x7f",
    "line separator": "write\u2028forged",
    "paragraph separator": "bash\u2029forged",
    "right-to-left override": "read\u202etxt.exe",
    "left-to-right isolate": "ls\u2066x\u2069",
    "tab and backslash": "a\tb\\x1b",
}


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
def test_R6_a_line_a_crash_cut_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    # Given a log whose last line a SIGKILL cut mid-write
    path = tmp_path / "audit.log"
    whole = json.dumps({"call": "before", "session": "s", "tool": "noop"})
    path.write_text(whole + "\n" + whole[:20])
    # When the next daemon's log writes a record
    log = open_log(path)
    log.write(record(1))
    log.close()
    # Then that record is read back: the cut line alone is lost
    printed: list[str] = []
    assert print_audit(path, raw=True, out=printed.append) == 2
    assert [json.loads(line)["call"] for line in printed] == ["before", "1"]


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


# --- R7: what `toolpool audit` prints ---------------------------------------------------------


def hostile_log(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A log the daemon wrote of calls whose every model- or client-chosen field is
    hostile; the records as the file holds them."""
    path = tmp_path / "audit.log"
    log = open_log(path)
    for n, text in enumerate(HOSTILE.values()):
        log.write(
            {
                "time": "2026-12-01T17:20:01Z",
                "session": f"s{text}",
                "turn": f"t{text}",
                "call": f"c{n}{text}",
                "tool": text,
                "_arguments": {"path": text},
                "gate": {"decision": "deny", "by": f"policy{text}"},
                "status": "error",
                "error_code": f"e{text}",
                "duration_ms": 1.0,
            }
        )
    log.close()
    written = [json.loads(line) for line in path.read_text().split("\n") if line]
    assert len(written) == len(HOSTILE)  # the file holds one line per record
    return path, written


def audit(tmp_path: Path, *flags: str) -> list[str]:
    """``toolpool audit``'s stdout, as the terminal gets it, in lines."""
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit", *flags],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr.decode(errors="replace")
    text = done.stdout.decode("utf-8")  # strict: what was written is UTF-8
    assert text.endswith("\n")
    return text[:-1].split("\n")


@pytest.mark.spec("R7")
def test_R7_hostile_names_print_one_escaped_line_per_record(tmp_path: Path) -> None:
    path, _ = hostile_log(tmp_path)
    printed = audit(tmp_path, "--file", str(path))
    # Every record is one line, none holding a raw control, separator or bidi control
    assert len(printed) == len(HOSTILE)
    assert [RAW.findall(line) for line in printed] == [[]] * len(HOSTILE)
    # Every field is shown escaped, one rule for all: \xNN below U+0100, \uNNNN above
    clear, ret, nl, csi, nel, delete, ls, ps, rlo, lri, tab = printed
    esc = "read\\x1b[2J\\x1b[H"
    assert clear == (
        f"2026-12-01T17:20:01Z  s{esc}  t{esc}  c0{esc}  {esc}  error (e{esc})  1.0 ms"
        f"  deny by policy{esc}"
    )
    assert "  ok\\x0d2026-12-01T00:00:00Z  forged  ok  " in ret
    assert "  ls\\x0a2026-12-01T00:00:00Z  forged  ok  " in nl
    assert "  grep\\x9b2J  " in csi and "  glob\\x85forged  " in nel and "  edit\\x7f  " in delete
    assert "  write\\u2028forged  " in ls and "  bash\\u2029forged  " in ps
    assert "  read\\u202etxt.exe  " in rlo and "  ls\\u2066x\\u2069  " in lri
    # A backslash the name spelled is doubled: it never reads as an escape
    assert "  a\\x09b\\\\x1b  " in tab


@pytest.mark.spec("R7")
def test_R7_json_lines_are_escaped_valid_and_parse_back_to_the_records(tmp_path: Path) -> None:
    path, written = hostile_log(tmp_path)
    printed = audit(tmp_path, "--file", str(path), "--json")
    assert len(printed) == len(HOSTILE)
    assert [RAW.findall(line) for line in printed] == [[]] * len(HOSTILE)
    assert [json.loads(line) for line in printed] == written
    assert '"tool": "write\\u2028forged"' in printed[6]
    assert '"tool": "grep\\u009b2J"' in printed[3]


@pytest.mark.spec("R7")
def test_R7_a_record_holding_a_line_separator_is_not_dropped(tmp_path: Path) -> None:
    # Given records around ones holding the characters str.splitlines() breaks at
    path = tmp_path / "audit.log"
    log = open_log(path)
    texts = ["before", "a\u2028b", "c\u2029d", "e\x85f", "g\x1ch", "after"]
    for n, text in enumerate(texts):
        log.write(record(n, text))
    log.close()
    # When it is printed, each of them is
    shown: list[str] = []
    assert print_audit(path, out=shown.append) == len(texts)
    assert print_audit(path, raw=True, out=shown.append) == len(texts)
    human, raw = shown[: len(texts)], shown[len(texts) :]
    assert [json.loads(line)["tool"] for line in raw] == texts
    assert "a\\u2028b" in human[1] and "e\\x85f" in human[3] and "g\\x1ch" in human[4]


@pytest.mark.spec("R7")
def test_R7_a_lone_surrogate_or_a_byte_not_utf8_is_printed_not_the_end(tmp_path: Path) -> None:
    # Given a log someone wrote by hand: a lone surrogate, escaped as JSON allows, and
    # a byte that is no UTF-8, each in a record between two plain ones
    path = tmp_path / "audit.log"
    path.write_bytes(
        b'{"call": "1", "tool": "noop"}\n'
        b'{"call": "2", "tool": "x\\ud800y"}\n'
        b'{"call": "3", "tool": "x\xffy"}\n'
        b'{"call": "4", "tool": "noop"}\n'
    )
    human = audit(tmp_path, "--file", str(path))
    raw = audit(tmp_path, "--file", str(path), "--json")
    # Then every record is printed, the surrogate escaped, the byte as U+FFFD
    assert len(human) == len(raw) == 4
    assert "  x\\ud800y  " in human[1] and "  x\ufffdy  " in human[2]
    assert json.loads(raw[1])["tool"] == "x\ud800y"
    assert [RAW.findall(line) for line in human + raw] == [[]] * 8


@pytest.mark.spec("R7")
@pytest.mark.parametrize("raw", [False, True], ids=["human", "json"])
def test_R7_follow_across_a_rotation_prints_hostile_records_escaped(
    tmp_path: Path, raw: bool
) -> None:
    path = tmp_path / "audit.log"
    texts = ["a\u2028b\x1b[2J", "é\u2029\x9b", "c\r\nd", "\u202eright"]
    encoded = [
        json.dumps(record(n, text), ensure_ascii=False).encode() + b"\n"
        for n, text in enumerate(texts)
    ]
    path.write_bytes(encoded[0])
    cut = encoded[1].index("é".encode()) + 1  # inside "é", two bytes in UTF-8

    def append(data: bytes) -> None:
        with path.open("ab") as log:
            log.write(data)

    def rotate() -> None:
        append(encoded[2])  # written just before the rotation: still read
        path.rename(path.with_name("audit.log.1"))
        path.write_bytes(encoded[3])

    # The attacker's moves, each made when the follower has read all there is (the
    # follower asks ``stop`` only then): no sleeping, no race.
    moves = [lambda: append(encoded[1][:cut]), lambda: append(encoded[1][cut:]), rotate]
    seen: list[str] = []
    printed_at_each_look: list[int] = []

    def next_move() -> bool:
        printed_at_each_look.append(len(seen))
        if not moves:
            return True
        moves.pop(0)()
        return False

    print_audit(path, follow=True, raw=raw, out=seen.append, stop=next_move)
    # Half a line, cut inside a character, printed nothing until its end came
    assert printed_at_each_look == [1, 1, 2, 4]
    assert [RAW.findall(line) + re.findall("\n", line) for line in seen] == [[]] * len(texts)
    if raw:
        assert [json.loads(line)["tool"] for line in seen] == texts
    else:
        assert [line.split("  ")[4] for line in seen] == [
            "a\\u2028b\\x1b[2J",
            "é\\u2029\\x9b",
            "c\\x0d\\x0ad",
            "\\u202eright",
        ]


@pytest.mark.spec("R7")
@pytest.mark.parametrize("follow", [[], ["--follow"]], ids=["read", "follow"])
def test_R7_a_fifo_at_the_path_is_refused_not_waited_on(tmp_path: Path, follow: list[str]) -> None:
    # Given a FIFO planted where the log was (a rotation left it there, R6)
    path = tmp_path / "audit.log"
    os.mkfifo(path)
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit", "--file", str(path), *follow],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    # Then toolpool audit says so in one line instead of waiting for a writer
    assert done.returncode == 1
    assert done.stderr == f"toolpool: error: {path} is not a regular file, so not an audit log\n"
