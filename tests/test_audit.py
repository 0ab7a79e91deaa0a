"""SPEC R1, R2: the audit log — one JSON line per call, off the hot path, rotated by
size, nothing lost on SIGTERM — and ``toolpool audit``, which prints it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client, ToolCall
from toolpool.client.audit import print_audit
from toolpool.daemon.audit import AuditLog, arguments_hash

from .daemon_support import ROOT, daemon_env, start_daemon, stop_daemon


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def record(n: int, session: str = "s") -> dict[str, Any]:
    return {"session": session, "call": str(n), "tool": "noop", "_arguments": {"n": n}}


# --- the file ------------------------------------------------------------------------------


@pytest.mark.spec("R1")
def test_R1_arguments_as_a_canonical_hash_or_as_they_are(tmp_path: Path) -> None:
    hashed = AuditLog(tmp_path / "a.log", max_bytes=1 << 20, backups=1)
    kept = AuditLog(tmp_path / "b.log", max_bytes=1 << 20, backups=1, arguments=True)
    for log in (hashed, kept):
        log.write({"call": "1", "_arguments": {"b": 1, "a": "é"}})
        log.close()
    (only_hash,) = lines(tmp_path / "a.log")
    (with_arguments,) = lines(tmp_path / "b.log")
    # Key order does not change the hash; the arguments stay out unless asked for.
    assert only_hash["arguments_sha256"] == arguments_hash({"a": "é", "b": 1})
    assert "arguments" not in only_hash
    assert with_arguments["arguments"] == {"b": 1, "a": "é"}
    assert (tmp_path / "a.log").stat().st_mode & 0o777 == 0o600


@pytest.mark.spec("R2")
def test_R2_close_writes_everything_queued_and_rotation_keeps_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, max_bytes=4096, backups=2)
    writers = [
        threading.Thread(target=lambda k=k: [log.write(record(k * 1000 + i)) for i in range(500)])
        for k in range(4)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    log.close()
    files = [path, path.with_name("audit.log.1"), path.with_name("audit.log.2")]
    assert all(f.exists() for f in files)
    assert not path.with_name("audit.log.3").exists()  # backups = 2
    for rotated in files[1:]:  # each cut once it held max_bytes, after a whole line
        assert rotated.stat().st_size >= 4096
        assert rotated.read_text().endswith("\n")
    kept = [r["call"] for f in reversed(files) for r in lines(f)]
    # The newest records are all there, in each writer's order; the oldest went.
    last = kept[-1]
    assert last in {"499", "1499", "2499", "3499"}
    for k in range(4):  # what is kept of each writer is its last records, in order
        mine = [int(c) - k * 1000 for c in kept if int(c) // 1000 == k]
        assert mine == list(range(500 - len(mine), 500))


@pytest.mark.spec("R1")
def test_R1_a_log_that_cannot_be_opened_fails_at_once(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        AuditLog(tmp_path / "dir", max_bytes=4096, backups=1)


@pytest.mark.spec("R1")
def test_R1_follow_reads_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text(json.dumps(record(1)) + "\n")
    seen: list[str] = []
    done = threading.Event()
    follower = threading.Thread(
        target=print_audit,
        args=(path,),
        kwargs={"follow": True, "raw": True, "out": seen.append, "stop": done.is_set},
    )
    follower.start()
    pause = threading.Event()

    def wait_for(count: int) -> None:
        for _ in range(1500):  # a hang guard: the lines arrive within a few looks
            if len(seen) >= count:
                return
            pause.wait(0.02)

    try:
        wait_for(1)  # the follower has the file open
        with path.open("a") as log:  # a partial line waits for its end
            log.write(json.dumps(record(2))[:10])
            log.flush()
            log.write(json.dumps(record(2))[10:] + "\n")
        wait_for(2)
        with path.open("a") as log:  # written just before the rotation: still read
            log.write(json.dumps(record(3)) + "\n")
        path.rename(path.with_name("audit.log.1"))
        path.write_text(json.dumps(record(4)) + "\n" + json.dumps(record(5, "other")) + "\n")
        wait_for(5)
    finally:
        done.set()
        follower.join()
    assert [json.loads(s)["call"] for s in seen] == ["1", "2", "3", "4", "5"]


# --- through the daemon ----------------------------------------------------------------------


def _approve(request: Any) -> bool:
    return True


@pytest.mark.spec("R1", "R2")
def test_R1_R2_every_call_of_the_daemon_is_one_line_and_sigterm_loses_none(
    tmp_path: Path, workspace: Path
) -> None:
    audit = tmp_path / "audit.log"
    config = tmp_path / "toolpool.toml"
    config.write_text(f'audit_log = "{audit}"\ndrain_grace = 0.5\n')
    (workspace / "a.txt").write_text("a\n")
    daemon = start_daemon(tmp_path, "--config", str(config))
    stopped = False
    try:
        policy = [{"tool": "ls", "action": "deny"}, {"read_only": True, "action": "allow"}]
        with (
            Client(runtime_dir=daemon.runtime) as client,
            client.session(
                workspace, gate="policy", policy=policy, on_approval=_approve
            ) as session,
        ):
            first = session.submit(
                [
                    ToolCall("ok", "read", {"path": "a.txt"}),
                    ToolCall("missing", "read", {"path": "nope.txt"}),
                    ToolCall("denied", "ls", {}),
                    ToolCall("asked", "write", {"path": "b.txt", "content": "b"}),
                ]
            )
            first.results()
            workers = daemon.tree() - {daemon.pid}
            # A turn still running at SIGTERM: its calls end in the drain (aborted).
            last = session.submit(
                [ToolCall(f"n{i}", "nap", {"seconds": 60}) for i in range(3)]
                + [ToolCall("queued", "write", {"path": "c.txt", "content": "c"})]
            )
            for event in last:
                if event.type.value == "tool_start" and event.call_id == "n2":
                    break
            daemon.process.send_signal(signal.SIGTERM)
            results = last.results()
            assert {r.call_id for r in results if r.is_error} == {"n0", "n1", "n2", "queued"}
        assert stop_daemon(daemon) == 0
        stopped = True
    finally:
        if not stopped:
            stop_daemon(daemon)

    by_call = {r["call"]: r for r in lines(audit)}
    assert sorted(by_call) == sorted(
        ["ok", "missing", "denied", "asked", "n0", "n1", "n2", "queued"]
    )
    ok = by_call["ok"]
    assert ok["session"] == session.id and ok["turn"] == first.id and ok["tool"] == "read"
    assert ok["status"] == "ok" and ok["error_code"] is None
    assert ok["arguments_sha256"] == arguments_hash({"path": "a.txt"})
    assert ok["gate"] == {"decision": "allow", "by": "policy rule 1"}
    assert ok["worker_pid"] in workers and ok["peak_rss_bytes"] > 0
    assert ok["cpu_seconds"] >= 0 and ok["duration_ms"] > 0
    assert by_call["missing"]["status"] == "error"
    assert by_call["missing"]["error_code"] == "execution_failed"
    assert by_call["denied"]["gate"] == {"decision": "deny", "by": "policy rule 0"}
    assert by_call["denied"]["error_code"] == "denied"
    assert by_call["asked"]["gate"] == {"decision": "allow", "by": "client"}
    assert (workspace / "b.txt").read_text() == "b"
    assert by_call["queued"]["gate"] is None  # it never reached the gate
    assert {by_call[c]["error_code"] for c in ("n0", "n1", "n2")} == {"cancelled"}

    # toolpool audit prints it, for one session, without a daemon.
    shown = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit", "--file", str(audit), "--session", session.id],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, check=True,
    )  # fmt: skip
    printed = shown.stdout.splitlines()
    assert len(printed) == 8
    (ok_line,) = [p for p in printed if f"{first.id}  ok  read  ok " in p]
    assert ok_line.endswith("allow by policy rule 1")
    raw = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit", "--file", str(audit), "--json",
         "--session", "someone-else"],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert raw.stdout == ""


@pytest.mark.spec("R1")
def test_R1_audit_without_a_log_says_how_to_get_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit"],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("toolpool: error: audit: no audit log")
    missing = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit", "--file", str(tmp_path / "none.log")],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "no audit log at" in missing.stderr and "Traceback" not in missing.stderr
