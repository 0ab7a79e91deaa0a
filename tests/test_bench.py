"""``toolpool bench --quick``, once, end to end: every scenario runs against real
daemons and peers and leaves its results. No timing is asserted here (the machines
are shared and noisy): the figures are read in the report, never checked by tests."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import perfdso
from bench.scenarios import environment as environment_scenario

# The quick bench runs every scenario once (a few minutes on a loaded machine): the
# module's tests share that one run, whose own bound is the subprocess's timeout.
pytestmark = pytest.mark.timeout(660)

SCENARIOS = (
    "overhead",
    "cpu",
    "throughput",
    "mixed",
    "session",
    "interrupts",
    "recovery",
    "confinement",
    "environment",
    "egress",
    "branch",
    "peers",
    "soak",
    "flood",
    "shells",
)
KINDS = {"no-op", "sleep 20 ms", "cpu 20 ms", "read", "grep"}
PNG = b"\x89PNG\r\n\x1a\n"


def _bench_processes(tmpdir: Path) -> list[str]:
    """Processes still running with the bench's TMPDIR: what it started and left."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get("TMPDIR") == str(tmpdir):
                left.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])}")
        except psutil.Error:
            pass
    return left


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    out = tmp_path_factory.mktemp("bench") / "results"
    tmpdir = tmp_path_factory.mktemp("bench-tmp")
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "bench", "--quick", "--out", str(out)],
        env={**os.environ, "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out, tmpdir, done.stderr


def test_quick_bench_leaves_no_process_behind(quick_run: tuple[Path, Path, str]) -> None:
    _, tmpdir, _ = quick_run
    assert _bench_processes(tmpdir) == []


@pytest.mark.spec("D6", "D2", "D4")
def test_quick_bench_writes_every_scenario_with_its_samples(
    quick_run: tuple[Path, Path, str],
) -> None:
    out, _, _ = quick_run
    data: dict[str, Any] = json.loads((out / "raw.json").read_text())
    assert data["quick"] is True
    assert data["command"] == f"toolpool bench --quick --out {out}"
    assert data["machine"]["cores"] == os.cpu_count()
    assert {"pyzmq", "msgpack", "toolpool"} <= set(data["machine"]["packages"])
    assert set(SCENARIOS) <= set(data)

    overhead = data["overhead"]["samples_us"]
    assert len(overhead) == 4  # the stack beside the floor, in-process and direct
    assert all(len(samples) == 200 and min(samples) > 0 for samples in overhead.values())
    memory = data["overhead"]["idle_memory"]
    assert memory["daemon"]["rss"] > 0
    assert len(memory["workers"]) == 2

    cells = data["throughput"]["cells"]
    assert {c["kind"] for c in cells} == KINDS
    assert {c["workers"] for c in cells} == {1, 2}
    assert {c["concurrency"] for c in cells} == {1, 4}
    assert all(c["calls_per_second"] > 0 for c in cells)
    assert all(len(c["latency_samples_us"]) == c["size"] for c in cells)
    assert len(data["throughput"]["knees"]) == len(KINDS) * 2
    assert all(k in (1, 4) for k in data["throughput"]["knees"].values())

    assert {"16 safe calls", "edit in the middle"} <= set(data["mixed"])
    interrupts = data["interrupts"]["samples_ms"]
    assert set(interrupts) == {
        "cancel, cooperative",
        "cancel, ignores SIGTERM",
        "block, ~500 ms left",
    }
    assert all(samples for samples in interrupts.values())
    # the TERM-ignoring call was killed only after its grace period
    grace_ms = data["interrupts"]["grace_seconds"] * 1000
    assert min(interrupts["cancel, ignores SIGTERM"]) >= grace_ms
    assert len(data["recovery"]["replacement_ms"]) == 5  # one replacement timed per crash
    stream = data["recovery"]["stream"]
    assert stream["crash_times"]
    # D2: crashes beside a stream of calls cost it no call
    assert stream["errors"] == 0
    assert len(stream["samples"]) == stream["with_crashes_ms"]["n"]

    through = data["confinement"]["through_daemon"]  # V1: each kind of start, measured
    assert set(through) == {
        "session sandbox",
        "session sandbox, network",
        "a sandbox each",
        "a sandbox each, network",
    }
    assert all(
        row["median_ms"]["bash true"] > row["median_ms"]["fork-exec true"] > 0
        for row in through.values()
    )
    environment = data["environment"]
    assert set(environment) == set(environment_scenario.kinds(Path("/images")))
    assert {"host root", "host root, network"} <= set(environment)
    assert all(
        row["first_command_ms"] > 0 and row["idle_rss_mib"] > 0 for row in environment.values()
    )
    if "overlay root" in environment:  # its layer holds apt's sandbox setting at least
        assert environment["overlay root"]["idle_layer_bytes"] > 0

    branch = data["branch"]  # B1–B4: a daemon run as root, else said why not
    if "skipped" not in branch:
        assert list(branch["sizes"]) == ["1000", "5000"]  # quick: small trees
        for size in branch["sizes"].values():
            assert set(size["p50_ms"]) == {
                "fork", "checkpoint", "rewind", "cp -a", "git worktree add", "git stash",
                "git checkout -- .",
            }  # fmt: skip
            assert all(len(v) == branch["rounds"] for v in size["samples_ms"].values())
            assert size["fork_disk_bytes"] > 0
        assert branch["forks_at_once"]["succeeded"] == branch["forks_at_once"]["forks"] == 32

    egress = data["egress"]  # N3: a daemon run as root, else said why not
    if "skipped" not in egress:
        assert set(egress["median"]) == {"direct", "forward", "tunnel"}
        assert all(m["small_ms"] > 0 and m["large_mb_s"] > 0 for m in egress["median"].values())
        counters = egress["proxy_counters"]
        assert counters["allowed"] == counters["connections"] > 0 and counters["denied"] == 0

    peers = data["peers"]["throughput_calls_per_second"]
    assert {"ProcessPoolExecutor", "multiprocess.Pool", "toolpool"} <= set(peers)
    assert all(set(rates) == {"no-op", "sleep 20 ms", "cpu 20 ms"} for rates in peers.values())
    grep = data["peers"]["grep"]
    assert grep["raw_rg_ms"]["n"] == grep["toolpool_ms"]["n"] == 3


@pytest.mark.spec("D6")
def test_quick_bench_reports_targets_tables_and_plots(quick_run: tuple[Path, Path, str]) -> None:
    out, _, stderr = quick_run
    report = (out / "report.md").read_text()
    for heading in (
        "## Targets",
        "## Overhead",
        "## Throughput against limits",
        "## Mixed turns",
        "## Interrupts",
        "## Recovery",
        "## Environment",
        "## Branch",
        "## Peers",
        "## Memory at idle",
        "## Soak",
        "## Flood",
        "## CPU per call",
        "## Daemon profile",
        "## Session",
    ):
        assert heading in report
    section = report.split("## Targets", 1)[1].split("\n## ", 1)[0]
    targets = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    for words in (
        "p50 ≤ 2× the raw two-hop",
        "p99 ≤ 3× the raw two-hop",
        "ProcessPoolExecutor",
        "cpu 20 ms calls/s",
        "sleep 20 ms calls/s",
        "Ray",
        "raw rg",
        "grace + 20",
        "daemon CPU ≤ 150 µs",
        "daemon CPU ≤ 50 µs",
        "client CPU ≤ 60 µs",
        "worker CPU ≤ 40 µs",
        "in-process one-call turn",
        "the in-process applier",
        "end trees",
        "fork p50 ≤ 5 ms",
        "rewind p50 ≤ 20 ms",
    ):
        assert any(words in line for line in targets), words
    # every target is judged met or missed, but Ray where it is not installed, the
    # soak's slope, which a quick run is too short for, and what is only reported
    for line in targets:
        verdict = line.rstrip(" |").rsplit("|", 1)[-1].strip()
        reported = verdict == "reported" and "not targeted" in line
        assert verdict in ("met", "missed") or reported or "Ray" in line or "too short" in line, (
            line
        )
    for words in (
        "soak: no result lost",
        "no process of the pool",
        "session cycle",
        "flood:",
        "bombs: the daemon's RSS",
        "bombs: another session's read p99",
    ):
        assert any(words in line for line in targets), words
    for name in (
        "throughput.png",
        "p99.png",
        "latency.png",
        "recovery.png",
        "soak.png",
        "flood.png",
    ):
        image = out / name
        assert image.read_bytes()[:8] == PNG, name
        assert f"]({name})" in report  # shown in the report
    assert "results in" in stderr  # the live display ended with where the results are


@pytest.mark.spec("L8", "L6", "L10")
def test_quick_soak_loses_duplicates_and_leaves_nothing(
    quick_run: tuple[Path, Path, str],
) -> None:
    out, _, _ = quick_run
    soak: dict[str, Any] = json.loads((out / "raw.json").read_text())["soak"]
    assert soak["turns"] > 0 and soak["calls"] > soak["turns"]
    # L8: every call submitted ended once, as its kind makes it; no transport error
    assert soak["lost"] == 0, soak["lost_ids"]
    assert soak["duplicated"] == 0, soak["duplicated_ids"]
    assert soak["unexpected"] == 0, soak["unexpected_examples"]
    assert soak["client_errors"] == []
    outcomes = soak["outcomes"]
    assert all(outcomes[action] for action in outcomes), outcomes  # every kind ran
    assert outcomes["crash"]["worker_lost"] == outcomes["crash"]["ok"]  # crash, no-op beside
    assert soak["workers_replaced"] >= outcomes["crash"]["worker_lost"]
    assert set(outcomes["abort"]) <= {"cancelled", "skipped", "ok"}
    # no process of the pool outlived the daemon, and some were watched
    assert soak["descendants_seen"] >= 3  # the zygote and the workers at least
    assert soak["orphans"] == 0, soak["orphan_processes"]
    assert soak["samples"] and {"t", "rss", "fds", "threads"} <= set(soak["samples"][0])
    for key in ("rss_mib", "fds", "threads"):
        assert soak[key]["start"] > 0 and soak[key]["end"] > 0
    # L6: closed sessions leave nothing in the daemon's tables
    assert soak["sessions_after_load"] == 0
    cycle = soak["session_cycle"]
    assert cycle["cycles"] == 1000
    assert cycle["sessions_after"] == 0
    # L10: every bomb went off and ended, in its worker; the other session was served
    bombs = soak["bombs"]
    assert [b["outcome"] for b in bombs["bombs"]] == ["ok", "ok", "ok"], bombs["bombs"]
    assert bombs["read_alone_ms"]["n"] > 0 and bombs["read_beside_bombs_ms"]["n"] > 0


@pytest.mark.spec("L5", "L6")
def test_quick_flood_lets_the_stalled_client_go_and_serves_the_other(
    quick_run: tuple[Path, Path, str],
) -> None:
    out, _, _ = quick_run
    flood: dict[str, Any] = json.loads((out / "raw.json").read_text())["flood"]
    assert flood["rss_samples"]
    assert flood["daemon_rss_mib"]["peak_during_flood"] >= flood["daemon_rss_mib"]["before"]
    # the other client kept being served, and lost nothing (L5: a reader's messages
    # are never dropped)
    assert flood["alone_ms"]["n"] > 0 and flood["during_flood_ms"]["n"] > 0
    assert flood["steady_errors"] == []
    # every turn of the flooding client came to an end once it read again
    assert len(flood["flood_turns"]) == flood["turns"]
    for turn in flood["flood_turns"]:
        assert turn["ended"] or turn["error"]
        if turn["ended"]:
            assert sum(turn["codes"].values()) == flood["calls_per_turn"]
    if flood["daemon_knows_client_stall_seconds"]:
        # L5: stalled past client_stall_seconds, its turns were aborted and it was let go
        assert flood["flood_client_disconnected"]
        assert flood["flood_turns_aborted"], flood["flood_turns"]
        assert flood["client_accounting"] is not None
    assert flood["sessions_after"] == 0
    limit = flood["session_limit"]
    assert limit["sessions_after"] == 0
    if limit["daemon_knows_max_sessions_per_client"]:
        # L6: the open over the limit is refused, naming the limit
        assert limit["opened"] < limit["attempts"]
        assert "max_sessions_per_client" in limit["refused"]


@pytest.mark.spec("L9", "X12")
def test_quick_shells_measures_the_daemon_beside_sixteen_floods(
    quick_run: tuple[Path, Path, str],
) -> None:
    out, _, _ = quick_run
    shells: dict[str, Any] = json.loads((out / "raw.json").read_text())["shells"]
    # all 16 started, passed spill_bytes and ran on (slowed, not killed)
    assert shells["started"] == shells["shells"] == 16 and shells["refused"] == []
    assert shells["seconds_to_pass_spill_bytes"] is not None
    assert shells["states_while_measured"] == ["running"]
    for window in ("daemon_cpu_idle", "daemon_cpu_flood"):
        assert shells[window]["pieces"]["n"] > 0 and shells[window]["cpu_per_second"] >= 0
    assert shells["read_ms_alone"]["n"] == shells["read_ms_during_flood"]["n"] > 0
    assert shells["read_errors"] == 0
    assert isinstance(shells["sandbox_retries"], int)  # X12: counted, and reported
    report = (out / "report.md").read_text()
    assert "background `yes` past spill_bytes cost the daemon" in report


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.spec("D6")
def test_quick_cpu_reports_each_process_per_call(quick_run: tuple[Path, Path, str]) -> None:
    out, _, _ = quick_run
    cpu: dict[str, Any] = json.loads((out / "raw.json").read_text())["cpu"]
    for load, size in (("one_call", 1), ("one_call_results", 1), ("batch", 32)):
        measured = cpu[load]
        assert measured["size"] == size
        assert len(measured["runs"]) == cpu["repeats"]
        median = measured["median"]
        assert median["calls"] == measured["turns"] * size
        for who, parts in (("daemon", ("total", "main", "zmq")), ("client", ("total", "main"))):
            assert all(_positive(median[who][part]) for part in parts), (who, median[who])
            assert median[who]["total"] >= median[who]["main"]
        assert _positive(median["workers"]["total"])
        assert median["workers"]["count"] == 2
        # the workers were not recycled mid-measurement
        assert all(r["workers"]["ended"] == r["workers"]["started"] == 0 for r in measured["runs"])
        assert _positive(median["wall"])
    for tool in ("bench_noop", "bench_anoop"):
        inproc = cpu["in_process"][tool]
        assert inproc["calls"] == inproc["wall_us"]["n"] > 0
        assert _positive(inproc["wall_us"]["p50"]) and _positive(inproc["cpu_us"]["total"])
    profile = cpu["profile"]
    if "error" not in profile:  # py-spy may be missing, or ptrace refused
        assert profile["samples"] > 0 and profile["loads"] > 0
        assert profile["self"] and profile["inclusive"]
        assert all(0 < row["percent"] <= 100 for row in profile["self"] + profile["inclusive"])
    for load in ("one_call", "batch"):
        libraries = cpu["libraries"][load]
        if "error" not in libraries:  # perf may be missing, or refused
            assert libraries["samples"] > 0 and libraries["loads"] > 0
            shares = [row["percent"] for row in libraries["by_library"]]
            assert all(0 < p <= 100 for p in shares) and 90 <= sum(shares) <= 100.5
            names = [row["library"] for row in libraries["by_library"]]
            assert any(name.startswith("libpython") for name in names), names


def test_perf_report_rows_are_read_with_their_sample_count() -> None:
    report = """# Total Lost Samples: 0
#
# Samples: 10K of event 'cpu-clock:ppp'
# Event count (approx.): 5090000000
#
# Overhead  Shared Object
# ........  .........................................
#
    64.11%  libpython3.11.so.1.0
    20.51%  [kernel.kallsyms]
     2.98%  loop.cpython-311-x86_64-linux-gnu.so


#
# (Cannot load tips.txt file, please install perf!)
#
"""
    rows, samples = perfdso.parse(report)
    assert samples == 10_000
    assert rows == [
        ("libpython3.11.so.1.0", 64.11),
        ("[kernel.kallsyms]", 20.51),
        ("loop.cpython-311-x86_64-linux-gnu.so", 2.98),
    ]
    assert perfdso.role("loop.cpython-311-x86_64-linux-gnu.so") == "uvloop's event loop"


@pytest.mark.spec("D6")
def test_quick_session_leaves_the_same_tree_as_the_applier(
    quick_run: tuple[Path, Path, str],
) -> None:
    out, _, _ = quick_run
    session: dict[str, Any] = json.loads((out / "raw.json").read_text())["session"]
    assert session["calls"] == sum(session["calls_by_phase"].values())
    assert session["calls"] == sum(session["calls_by_tool"].values())
    assert {"read", "grep", "glob", "ls", "edit", "write"} == set(session["calls_by_tool"])
    assert session["errors"] == []  # every call of the session succeeded through toolpool
    # the edits and writes were made, the same way by both
    for run in session["runs"]:
        assert run["trees_match"], run["differences"]
        assert run["paths_changed"] > 0
    assert session["trees_match"]
    for who in ("toolpool", "applier"):
        assert all(_positive(v) for v in session["per_call_us"][who].values())
        assert _positive(session["cpu_us"][who]["client"]["total"])
    assert _positive(session["cpu_us"]["toolpool"]["daemon"]["total"])
    assert _positive(session["ratio"])
