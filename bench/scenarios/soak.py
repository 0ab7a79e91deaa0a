"""Scenario soak (SPEC L8): several clients run a long mixed load against one daemon —
no-op and sleeping calls, reads, greps and bash of the workspace's files, calls that
are cancelled, interrupted or aborted while they run, tools that crash their worker —
while the daemon's RSS, open fds and threads are sampled. Every call submitted must
end once (one ``tool_end``, one result in its turn's results) and no process of the
pool may outlive the daemon. Then the session cycle: many opens and closes on one
connection, the daemon's RSS before and after, and nothing left in its tables. Last,
the bombs (``bombs.py``, SPEC L10): calls built to explode in one session, another
session's reads beside them, the daemon's RSS."""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from bench.common import ProcessSampler, daemon, slope_per_minute
from bench.scenarios import bombs
from bench.scenarios.throughput import tree
from toolpool import Client, ToolCall, ToolEnd, ToolStart, TurnEnd

NAME = "soak"
CLIENTS = 4
WORKERS = 2
GRACE = 0.5  # seconds: the daemon's cancel_grace (bench_nap stops at SIGTERM anyway)
NAP = 30.0  # seconds a call that is to be stopped would sleep

# What one round of a client does, and how often (weights).
ACTIONS = {
    "no-op and sleep": 4,
    "files": 3,
    "open turn": 1,
    "cancel": 1,
    "interrupt": 1,
    "abort": 1,
    "crash": 1,
}
# The codes a call stopped while it runs (or before it starts) ends with.
STOPPED = {"cancelled", "interrupted", "skipped"}
GREP = {"pattern": "def \\w+", "path": "lib", "output_mode": "count"}


class Tally:
    """What the clients saw, added up under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.turns = 0
        self.lost: list[str] = []
        self.duplicated: list[str] = []
        self.unexpected: list[str] = []  # a result that is not what the action makes
        self.outcomes: dict[str, Counter[str]] = {a: Counter() for a in ACTIONS}
        self.errors: list[str] = []  # exceptions a client raised (transport errors)

    def as_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "calls": self.calls,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "unexpected": len(self.unexpected),
            "lost_ids": self.lost[:20],
            "duplicated_ids": self.duplicated[:20],
            "unexpected_examples": self.unexpected[:20],
            "outcomes": {a: dict(c) for a, c in self.outcomes.items()},
            "client_errors": self.errors[:20],
        }


def _check(
    tally: Tally,
    action: str,
    submitted: list[str],
    turn: Any,
    expected: dict[str, set[str]],
) -> None:
    """Count every call of a finished turn: lost, duplicated, unexpected outcome."""
    ends = Counter(e.call_id for e in turn.events if isinstance(e, ToolEnd))
    turn_ends = [e for e in turn.events if isinstance(e, TurnEnd)]
    results = Counter(r.call_id for e in turn_ends for r in e.results)
    codes = {
        r.call_id: (r.error_code.value if r.error_code is not None else "ok")
        for e in turn_ends
        for r in e.results
    }
    with tally.lock:
        tally.turns += 1
        tally.calls += len(submitted)
        if len(turn_ends) > 1:
            tally.duplicated.append(f"turn {turn.id}: {len(turn_ends)} turn_end")
        for call_id in submitted:
            if ends[call_id] == 0 or results[call_id] == 0:
                tally.lost.append(call_id)
            if ends[call_id] > 1 or results[call_id] > 1:
                tally.duplicated.append(call_id)
            code = codes.get(call_id)
            if code is not None:
                tally.outcomes[action][code] += 1
                if code not in expected[call_id]:
                    tally.unexpected.append(f"{action} {call_id}: {code}")
        for call_id in set(ends) | set(results):
            if call_id not in submitted:
                tally.unexpected.append(f"{action}: a result for {call_id}, never submitted")


def _stop_when_started(turn: Any, target: str, stop: Any) -> None:
    """Read the turn to its end; once ``target`` has started, ``stop()`` it."""
    stopped = False
    for event in turn:
        if not stopped and isinstance(event, ToolStart) and event.call_id == target:
            time.sleep(0.02)  # let it reach its worker
            stop()
            stopped = True


def _client(
    index: int,
    runtime: Path,
    workspace: Path,
    files: list[str],
    until: float,
    tally: Tally,
) -> None:
    rng = random.Random(index)
    names, weights = list(ACTIONS), list(ACTIONS.values())
    with (
        Client(runtime_dir=runtime, name=f"bench-soak-{index}") as client,
        client.session(workspace, max_tool_errors=0) as session,
    ):
        n = 0
        while time.monotonic() < until:
            action = rng.choices(names, weights)[0]
            n += 1
            p = f"k{index}-{n}-"
            ok = {"ok"}
            try:
                if action == "no-op and sleep":
                    calls = [ToolCall(f"{p}n{i}", "bench_noop", {}) for i in range(3)]
                    calls.append(ToolCall(f"{p}s", "bench_sleep", {"ms": rng.choice([5, 20])}))
                    turn = session.submit(calls)
                    turn.results()
                    ids = [c.id for c in calls]
                    _check(tally, action, ids, turn, dict.fromkeys(ids, ok))
                elif action == "files":
                    path = rng.choice(files)
                    calls = [
                        ToolCall(f"{p}r", "read", {"path": path}),
                        ToolCall(f"{p}g", "grep", GREP),
                        ToolCall(f"{p}b", "bash", {"command": f"wc -l {path}"}),
                    ]
                    turn = session.submit(calls)
                    turn.results()
                    ids = [c.id for c in calls]
                    _check(tally, action, ids, turn, dict.fromkeys(ids, ok))
                elif action == "open turn":
                    first = ToolCall(f"{p}o0", "bench_noop", {})
                    more = [
                        ToolCall(f"{p}o1", "bench_sleep", {"ms": 10}),
                        ToolCall(f"{p}o2", "read", {"path": rng.choice(files), "limit": 5}),
                    ]
                    turn = session.submit([first], open=True)
                    ids = [first.id, *turn.add(more)]
                    turn.close()
                    turn.results()
                    _check(tally, action, ids, turn, dict.fromkeys(ids, ok))
                elif action == "cancel":
                    nap = ToolCall(f"{p}c", "bench_nap", {"seconds": NAP})
                    turn = session.submit([nap])
                    _stop_when_started(turn, nap.id, functools.partial(turn.cancel, nap.id))
                    _check(tally, action, [nap.id], turn, {nap.id: STOPPED})
                elif action in ("interrupt", "abort"):
                    nap = ToolCall(f"{p}c", "bench_nap", {"seconds": NAP})
                    after = ToolCall(f"{p}q", "bench_sleep", {"ms": 2000})
                    turn = session.submit([nap, after])
                    stop = session.interrupt if action == "interrupt" else session.abort
                    _stop_when_started(turn, nap.id, stop)
                    # the sleep may have ended before the stop came: then it is ok
                    expected = {nap.id: STOPPED, after.id: STOPPED | ok}
                    _check(tally, action, [nap.id, after.id], turn, expected)
                else:  # crash: the worker dies under the call; a no-op beside it
                    crash = ToolCall(f"{p}x", "bench_crash", {})
                    beside = ToolCall(f"{p}y", "bench_noop", {})
                    turn = session.submit([crash, beside])
                    turn.results()
                    expected = {crash.id: {"worker_lost"}, beside.id: ok}
                    _check(tally, action, [crash.id, beside.id], turn, expected)
            except Exception as exc:  # a transport error: count it, go on
                with tally.lock:
                    tally.errors.append(f"{action}: {type(exc).__name__}: {exc}")


def _trend(sampler: ProcessSampler, key: str, half: float) -> dict[str, Any]:
    """Start, end, highs of each half and least-squares slopes (per minute) of one
    sampled quantity (RSS in MiB)."""
    scale = 1.0 if key != "rss" else 1.0 / (1024 * 1024)
    points = [(t, v * scale) for t, v in sampler.series(key)]
    first = [v for t, v in points if t < half]
    second = [(t, v) for t, v in points if t >= half]
    return {
        "start": points[0][1] if points else None,
        "end": points[-1][1] if points else None,
        "max_first_half": max(first, default=None),
        "max_second_half": max((v for _, v in second), default=None),
        "slope_per_minute": slope_per_minute(points),
        "slope_per_minute_second_half": slope_per_minute(second),
    }


def _status_pids(status: dict[str, Any]) -> dict[str, list[int]]:
    """The pool's processes the status names (keys such as ``zygote_pid`` or
    ``worker_pids``, when it has them), beside the daemon's own ``pid``."""
    found: dict[str, list[int]] = {}
    for key, value in status.items():
        if key == "pid" or not key.endswith(("_pid", "_pids")):
            continue
        if isinstance(value, dict):
            values = list(value.values())
        else:
            values = value if isinstance(value, list) else [value]
        found[key] = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return found


def _watch(sampler: ProcessSampler, pids: dict[str, list[int]]) -> None:
    for pid in (p for group in pids.values() for p in group):
        try:
            process = psutil.Process(pid)
            sampler.descendants.setdefault(
                pid, (process.create_time(), " ".join(process.cmdline()))
            )
        except psutil.Error:
            pass


def _session_cycle(client: Client, workspace: Path, cycles: int, pid: int) -> dict[str, Any]:
    """``cycles`` session opens and closes on one connection; the daemon's RSS before
    and after (each after a pause), and what its status lists then."""
    sampler = ProcessSampler(pid, 1.0)
    for _ in range(min(100, cycles)):  # warm up: first-use allocations are not a leak
        client.session(workspace).close()
    time.sleep(1.5)
    before = sampler.sample()
    began = time.perf_counter()
    for _ in range(cycles):
        client.session(workspace).close()
    seconds = time.perf_counter() - began
    time.sleep(1.5)
    after = sampler.sample()
    status = client.status()
    rss_before = before["rss"] if before else float("nan")
    rss_after = after["rss"] if after else float("nan")
    return {
        "cycles": cycles,
        "seconds": round(seconds, 2),
        "rss_before_mib": rss_before / 2**20,
        "rss_after_mib": rss_after / 2**20,
        "rss_change_mib": (rss_after - rss_before) / 2**20,
        "fds_before": before["fds"] if before else None,
        "fds_after": after["fds"] if after else None,
        "sessions_after": len(status.get("sessions", {})),
    }


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    seconds = 15.0 if quick else 180.0
    cycles = 1000 if quick else 5000
    interval = 0.5 if quick else 1.0
    files = tree(workspace)[:200]
    tally = Tally()
    settings = {"TOOLPOOL_CANCEL_GRACE": str(GRACE)}
    with daemon(WORKERS, settings=settings) as running:
        with Client(runtime_dir=running.runtime, name="bench-soak-control") as control:
            first = control.status()
        pid = int(first["pid"])
        sampler = ProcessSampler(pid, interval)
        named = _status_pids(first)
        _watch(sampler, named)
        with sampler:
            until = time.monotonic() + seconds
            threads = [
                threading.Thread(
                    target=_client,
                    args=(i, running.runtime, workspace, files, until, tally),
                    name=f"soak-{i}",
                )
                for i in range(CLIENTS)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        half = seconds / 2
        trends = {key: _trend(sampler, key, half) for key in ("rss", "fds", "threads")}
        samples = list(sampler.samples)
        sampler.sample()  # one more look at the descendants while the daemon runs
        with Client(runtime_dir=running.runtime, name="bench-soak-cycle") as control:
            after_load = control.status()
            _watch(sampler, _status_pids(after_load))
            cycle = _session_cycle(control, workspace, cycles, pid)
            sampler.sample()
        exploding = bombs.run(running.runtime, workspace, pid, quick)
        sampler.sample()
    left = sampler.left_behind()
    return {
        "seconds": seconds,
        "clients": CLIENTS,
        "workers": WORKERS,
        "sample_interval": interval,
        "samples": samples,
        "rss_mib": trends["rss"],
        "fds": trends["fds"],
        "threads": trends["threads"],
        **tally.as_dict(),
        "workers_replaced": after_load.get("workers_replaced"),
        "sessions_after_load": len(after_load.get("sessions", {})),
        "status_pid_keys": sorted(named),  # what the status names of the pool's processes
        "descendants_seen": len(sampler.descendants),
        "orphans": len(left),
        "orphan_processes": left[:20],
        "session_cycle": cycle,
        "bombs": exploding,
    }
