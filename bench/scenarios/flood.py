"""Scenario flood (SPEC L5, L6): one client submits turns of big reads and then reads
nothing for a while — the blocking client reads its socket only while one of its
threads waits, so the daemon's frames for it pile up — while another client runs a
steady stream of small calls. Measured: the daemon's peak RSS during the flood, the
other client's latency during the flood against its latency alone, how the flooding
client's turns ended (the daemon is meant to abort them and let the client go after
``client_stall_seconds``) and what the daemon's status says about that client. Then
L6's bound: sessions one client opens until the daemon refuses one."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from bench.common import ProcessSampler, daemon, summary
from toolpool import Client, ToolCall, TurnEnd
from toolpool.client import ClientError, RequestFailed

NAME = "flood"
WORKERS = 2
LINES = 2000  # read's default limit: a read of the file returns all of it
LINE_CHARS = 1999  # under read's 2000-character cut, with the newline 2000 bytes a line
FLOOD_NAME = "bench-flood"
SESSION_ATTEMPTS = 200  # sessions one client tries to open (L6: 64 allowed by default)


def big_file(workspace: Path) -> Path:
    """A text file of LINES lines of LINE_CHARS characters (4 MB): one read of it
    returns every byte, numbered."""
    path = workspace / "flood" / "big.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        line = ("flood " * (LINE_CHARS // 6 + 1))[:LINE_CHARS]
        path.write_text("".join(f"{line}\n" for _ in range(LINES)))
    return path


def _knows(setting: str) -> bool:
    """Whether the daemon's configuration has ``setting`` (else the variable the
    bench sets is ignored, and the figures are those of the default)."""
    from toolpool.daemon.config import DaemonConfig

    return setting in {f.name for f in dataclasses.fields(DaemonConfig)}


def accounting(status: dict[str, Any], name: str) -> tuple[bool, dict[str, Any] | None]:
    """What the daemon's status reports about client ``name``: whether it has a
    per-client table (a top-level mapping or list of entries with a ``name``, such as
    ``client_buffers``), and the entry of ``name`` there (None when not listed)."""
    table = False
    for value in status.values():
        entries = list(value.values()) if isinstance(value, dict) else value
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if isinstance(entry, dict) and "name" in entry:
                table = True
                if entry["name"] == name:
                    return True, entry
    return table, None


class Steady:
    """A client running one small call at a time: (seconds since ``start``, ms)."""

    def __init__(self, runtime: Path, workspace: Path, start: float) -> None:
        self.runtime, self.workspace, self.start = runtime, workspace, start
        self.samples: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="steady")

    def _loop(self) -> None:
        with (
            Client(runtime_dir=self.runtime, name="bench-steady") as client,
            client.session(self.workspace) as session,
        ):
            i = 0
            while not self.stop.is_set():
                began = time.perf_counter()
                try:
                    (result,) = session.submit([ToolCall(f"s{i}", "bench_noop", {})]).results()
                except ClientError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
                    continue
                now = time.perf_counter()
                self.samples.append((round(began - self.start, 4), (now - began) * 1000))
                if result.is_error:
                    self.errors.append(f"s{i}: {result.error_code}")
                i += 1
                time.sleep(0.005)  # a steady stream, not a saturating one

    def between(self, t0: float, t1: float) -> list[float]:
        return [ms for t, ms in self.samples if t0 <= t < t1]


def _outcome(turn: Any, timeout: float) -> dict[str, Any]:
    """How one of the flooding client's turns ended, as that client finds out once it
    reads again: its results' codes, or the error reading them raised."""
    try:
        results = turn.results(timeout=timeout)
    except ClientError as exc:
        return {
            "ended": False,
            "error": f"{type(exc).__name__}: {exc}",
            "events": len(turn.events),
        }
    codes = Counter(r.error_code.value if r.error_code else "ok" for r in results)
    return {
        "ended": True,
        "codes": dict(codes),
        "result_chars": sum(len(r.text) for r in results),
        "events": len(turn.events),
        "turn_end": sum(isinstance(e, TurnEnd) for e in turn.events),
    }


def session_limit(client: Client, workspace: Path, attempts: int) -> dict[str, Any]:
    """L6: open sessions on one client until the daemon refuses one (at most
    ``attempts``); how many opened, the refusal, and the sessions left after closing
    them all."""
    opened = []
    refused = None
    try:
        for _ in range(attempts):
            try:
                opened.append(client.session(workspace))
            except RequestFailed as exc:
                refused = str(exc).strip()
                break
    finally:
        for session in opened:
            session.close()
    return {
        "daemon_knows_max_sessions_per_client": _knows("max_sessions_per_client"),
        "attempts": attempts,
        "opened": len(opened),
        "refused": refused,
        "sessions_after": len(client.status().get("sessions", {})),
    }


def _rate(samples: list[float], seconds: float) -> float:
    return len(samples) / seconds if seconds > 0 else float("nan")


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    stall = 3.0 if quick else 10.0
    turns, calls = (3, 20) if quick else (3, 50)
    alone = 2.0 if quick else 5.0
    pause = stall * 2 + (2.0 if quick else 5.0)  # the flooding client reads nothing
    path = str(big_file(workspace).relative_to(workspace))
    settings = {"TOOLPOOL_CLIENT_STALL_SECONDS": str(stall)}
    log_lines: list[str] = []
    bench_process = psutil.Process()
    with daemon(WORKERS, settings=settings) as running:
        control = Client(runtime_dir=running.runtime, name="bench-flood-control")
        with control:
            pid = int(control.status()["pid"])
        start = time.perf_counter()
        steady = Steady(running.runtime, workspace, start)
        sampler = ProcessSampler(pid, 0.1, origin=start)
        statuses: list[dict[str, Any]] = []
        with sampler:
            steady.thread.start()
            try:
                time.sleep(alone)
                rss_before = max((s["rss"] for s in sampler.samples), default=float("nan"))
                bench_rss_before = bench_process.memory_info().rss

                # The flood: submit, then wait on nothing for `pause` seconds.
                flood_began = time.perf_counter() - start
                flooder = Client(runtime_dir=running.runtime, name=FLOOD_NAME, timeout=60)
                with flooder:
                    # The flood is of bytes on the wire (L5), not of the model's text (L4): the
                    # session's turn output budget is off when the daemon has one.
                    try:
                        session = flooder.session(workspace, max_tool_errors=0, turn_output_chars=0)
                        budget: str = "off (turn_output_chars = 0)"
                    except RequestFailed as exc:
                        session = flooder.session(workspace, max_tool_errors=0)
                        budget = f"the daemon's default (turn_output_chars refused: {exc})"
                    submitted = [
                        session.submit(
                            [ToolCall(f"f{t}-{i}", "read", {"path": path}) for i in range(calls)]
                        )
                        for t in range(turns)
                    ]
                    bench_rss_peak = bench_rss_before
                    with Client(runtime_dir=running.runtime, name="bench-flood-status") as watcher:
                        while time.perf_counter() - start < flood_began + pause:
                            time.sleep(0.25)
                            status = watcher.status()
                            table, entry = accounting(status, FLOOD_NAME)
                            statuses.append(
                                {
                                    "t": round(time.perf_counter() - start, 2),
                                    "clients": status.get("clients"),
                                    "sessions": len(status.get("sessions", {})),
                                    "accounting": entry,
                                    "flood_listed": (entry is not None) if table else None,
                                }
                            )
                            bench_rss_peak = max(bench_rss_peak, bench_process.memory_info().rss)
                    flood_ended = time.perf_counter() - start

                    # The flooding client reads again: what became of its turns?
                    outcomes = [_outcome(turn, timeout=30) for turn in submitted]
                    bench_rss_peak = max(bench_rss_peak, bench_process.memory_info().rss)
                    session.close()
                time.sleep(0.5)
            finally:
                steady.stop.set()
                steady.thread.join()
            with Client(runtime_dir=running.runtime, name="bench-flood-status") as watcher:
                final = watcher.status()
                limit = session_limit(watcher, workspace, SESSION_ATTEMPTS)
        log = running.runtime.parent / "daemon.log"
        if log.exists():
            log_lines = [
                line
                for line in log.read_text(errors="replace").splitlines()
                if any(w in line.lower() for w in ("stall", "disconnect", "backpressure"))
            ]
    flooded = [s for s in sampler.samples if flood_began <= s["t"] <= flood_ended]
    peak = max((s["rss"] for s in flooded), default=float("nan"))
    # Was the flooding client let go, and when: the first status without it.
    gone = [s["t"] for s in statuses if s["flood_listed"] is False]
    if not any(s["flood_listed"] is not None for s in statuses):  # no per-client table
        counts = [(s["t"], s["clients"]) for s in statuses if isinstance(s["clients"], int)]
        gone = [t for t, n in counts if n < counts[0][1]]  # the count of clients fell
    told = [o["error"] for o in outcomes if "error" in o]
    disconnected = bool(gone) or any("disconnect" in e.lower() for e in told)
    # The flood lasts until the daemon lets the client go (else to the end of the
    # pause): the other client's calls then are those the flood could slow down.
    let_go = gone[0] if gone else None
    flood_over = let_go if let_go is not None else flood_ended
    during = steady.between(flood_began, flood_over)
    after = steady.between(flood_over, flood_ended) if let_go is not None else []
    stopped = {"cancelled", "skipped", "interrupted"}
    if all(o["ended"] and set(o["codes"]) <= stopped for o in outcomes):
        aborted = "its turns ended with their calls cancelled"
    elif told and all("abort" in e.lower() for e in told):
        aborted = "the client was told its turns were aborted"
    elif any("abort" in line.lower() for line in log_lines):
        aborted = "the daemon's log says its turns were aborted"
    else:
        aborted = None
    return {
        "turns": turns,
        "calls_per_turn": calls,
        "file_bytes": LINES * (LINE_CHARS + 1),
        "client_stall_seconds": stall,
        "turn_output_budget": budget,
        "daemon_knows_client_stall_seconds": _knows("client_stall_seconds"),
        "pause_seconds": pause,
        # when the flooding client submitted, when it was let go (None: never), and
        # when it read again
        "flood_window": [round(flood_began, 2), round(flood_ended, 2)],
        "let_go_at": let_go,
        "daemon_rss_mib": {
            "before": rss_before / 2**20,
            "peak_during_flood": peak / 2**20,
            "end": sampler.samples[-1]["rss"] / 2**20 if sampler.samples else float("nan"),
        },
        "bench_process_rss_mib": {  # the flooding client lives in the bench's process
            "before": bench_rss_before / 2**20,
            "peak": bench_rss_peak / 2**20,
        },
        "rss_samples": [(s["t"], s["rss"]) for s in sampler.samples],
        "steady_samples": steady.samples,
        "steady_errors": steady.errors[:20],
        "alone_ms": summary(steady.between(0, flood_began)),
        "during_flood_ms": summary(during),  # from the submit to the let-go
        "after_let_go_ms": summary(after),
        "steady_calls_per_second": {
            "alone": _rate(steady.between(0, flood_began), flood_began),
            "during_flood": _rate(during, flood_over - flood_began),
            "after_let_go": _rate(after, flood_ended - flood_over) if after else None,
        },
        "flood_turns": outcomes,
        "flood_turns_aborted": aborted is not None,
        "flood_turns_aborted_evidence": aborted,
        "flood_client_disconnected": disconnected,
        "disconnected_after_seconds": round(gone[0] - flood_began, 2) if gone else None,
        "status_during_flood": statuses,
        # the flooding client's entry in the daemon's status, the last time it was there
        "client_accounting": next(
            (s["accounting"] for s in reversed(statuses) if s["accounting"] is not None), None
        ),
        "clients_after": final.get("clients"),
        "sessions_after": len(final.get("sessions", {})),
        "log_lines": log_lines[:20],
        "session_limit": limit,
    }
