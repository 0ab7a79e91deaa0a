"""Scenario session: a coding agent's session on a copy of real source (a part of the
standard library) — a listing and a glob, turns of parallel reads and greps, then
turns that read files and edit them, and turns that write new files (and edit what
was written) — through the full stack (client → daemon → workers), and the same
calls made by the in-process applier (``bench/applier.py``) on another copy. Per
call, in wall time and CPU; then the two end trees must be identical."""

from __future__ import annotations

import hashlib
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.applier import Applier
from bench.common import daemon
from bench.cputime import StackMeter, median_of
from bench.format import num, times
from bench.scenarios.throughput import STDLIB_PACKAGES, tree
from toolpool import Client, ToolCall

NAME = "session"
WORKERS = 2
READS_PER_TURN = 6
FILES_PER_EDIT_TURN = 3
# Small enough that a turn of six reads stays within the default turn output budget.
MAX_READ_BYTES = 40_000
EDIT_MARK = "  # bench session: edited"

GREPS: list[dict[str, Any]] = [
    {"pattern": r"def \w+\(self", "path": "lib/asyncio", "output_mode": "files_with_matches"},
    {"pattern": r"^class \w+", "path": "lib", "output_mode": "count"},
    {"pattern": r"raise \w+Error", "path": "lib/email", "output_mode": "content", "head_limit": 40},
    {"pattern": r"^import|^from", "path": "lib/json", "output_mode": "content"},
    {"pattern": r"async def \w+", "path": "lib/asyncio", "output_mode": "content", "head_limit": 9},
    {"pattern": r"TODO|XXX", "path": "lib", "output_mode": "files_with_matches"},
    {"pattern": r"self\.\w+ = None", "path": "lib", "glob": "*.py", "output_mode": "count"},
    {"pattern": r"except \w+Error as", "path": "lib/http", "output_mode": "content", "-C": 1},
]


def shape(quick: bool) -> dict[str, int]:
    """Turns of reads and greps, groups of files edited (a read turn, then an edit
    turn), turns of writes, repetitions."""
    if quick:
        return {"explore": 3, "edit_groups": 2, "write_turns": 2, "repeats": 1}
    return {"explore": 12, "edit_groups": 15, "write_turns": 10, "repeats": 3}


def _pick_line(text: str, fraction: float) -> str:
    """A line an edit can name on its own (long enough, occurring once in the file),
    from ``fraction`` of the way in."""
    lines = text.split("\n")
    start = int(len(lines) * fraction)
    for line in lines[start:] + lines[:start]:
        if len(line.strip()) >= 12 and EDIT_MARK not in line and text.count(line) == 1:
            return line
    raise ValueError("no line occurs only once")


def _new_module(i: int) -> str:
    body = [
        f'"""A module the bench session writes ({i})."""',
        "",
        "from __future__ import annotations",
    ]
    body += ["", "import json", ""]
    for j in range(8):
        body += [
            "",
            f"def helper_{i}_{j}(value: object) -> str:",
            f"    return json.dumps([{j}, value])",
        ]
    return "\n".join(body) + "\n"


def plan(root: Path, files: list[str], quick: bool) -> list[tuple[str, list[ToolCall]]]:
    """The session's turns, each with its phase: made from the tree at ``root`` (an
    edit's old_string is a line that occurs once in the file as the session has
    changed it so far)."""
    n = shape(quick)
    texts: dict[str, str] = {}
    readable, editable = [], []
    for rel in files:
        data = (root / rel).read_bytes()
        if len(data) > MAX_READ_BYTES:
            continue
        readable.append(rel)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if 80 <= text.count("\n") < 1500 and "\r" not in text and not text.startswith("\ufeff"):
            editable.append(rel)
            texts[rel] = text
    turns: list[tuple[str, list[ToolCall]]] = []

    def add(phase: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        t = len(turns)
        turns.append((phase, [ToolCall(f"t{t}c{i}", name, a) for i, (name, a) in enumerate(calls)]))

    add("explore", [("ls", {"path": "lib"}), ("glob", {"pattern": "**/*.py", "path": "lib"})])
    stride = 7  # spread the reads over the packages
    for k in range(n["explore"]):
        reads = [
            ("read", {"path": readable[(stride * (READS_PER_TURN * k + j)) % len(readable)]})
            for j in range(READS_PER_TURN)
        ]
        greps = [("grep", GREPS[(2 * k + j) % len(GREPS)]) for j in range(2)]
        add("explore", [*reads[:3], greps[0], *reads[3:], greps[1]])
    for g in range(n["edit_groups"]):
        group = [
            editable[(FILES_PER_EDIT_TURN * g + j) % len(editable)]
            for j in range(FILES_PER_EDIT_TURN)
        ]
        add("edit", [("read", {"path": rel}) for rel in group])
        edits = []
        for rel in group:
            for fraction in (0.3, 0.6):
                line = _pick_line(texts[rel], fraction)
                edits.append(
                    ("edit", {"path": rel, "old_string": line, "new_string": line + EDIT_MARK})
                )
                texts[rel] = texts[rel].replace(line, line + EDIT_MARK, 1)
        add("edit", edits)
    for w in range(n["write_turns"]):
        package = STDLIB_PACKAGES[w % len(STDLIB_PACKAGES)]
        calls: list[tuple[str, dict[str, Any]]] = [
            ("write", {"path": f"lib/{package}/bench_session_{w}.py", "content": _new_module(w)}),
            (
                "write",
                {"path": f"tests_bench/{package}/test_{w}.py", "content": _new_module(100 + w)},
            ),
        ]
        if w:  # the module written a turn ago gets a fix: no read needed, the write was seen
            old = f"def helper_{w - 1}_0("
            before = STDLIB_PACKAGES[(w - 1) % len(STDLIB_PACKAGES)]
            fix = {"old_string": old, "new_string": old.replace("helper", "fixed")}
            calls.append(("edit", {"path": f"lib/{before}/bench_session_{w - 1}.py", **fix}))
        add("write", calls)
    return turns


def digest(root: Path) -> dict[str, str]:
    """Every file (and directory, as "dir") under ``root`` by relative path."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = "dir" if path.is_dir() else hashlib.blake2b(path.read_bytes()).hexdigest()
    return found


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    only_a = [f"only in toolpool's tree: {p}" for p in sorted(a.keys() - b.keys())]
    only_b = [f"only in the applier's tree: {p}" for p in sorted(b.keys() - a.keys())]
    changed = [f"differs: {p}" for p in sorted(a.keys() & b.keys()) if a[p] != b[p]]
    return only_a + only_b + changed


def through_toolpool(
    client: Any, pid: int, root: Path, turns: list[tuple[str, list[ToolCall]]]
) -> dict[str, Any]:
    by_phase: dict[str, float] = {}
    errors: list[str] = []
    with client.session(root) as session:
        _warm_up(lambda calls: session.submit(calls).results())
        meter = StackMeter(pid)
        before = meter.snapshot()
        for phase, calls in turns:
            started = time.perf_counter()
            results = session.submit(calls).results()
            by_phase[phase] = by_phase.get(phase, 0.0) + time.perf_counter() - started
            errors += [f"{r.call_id} {r.name}: {r.text[:200]}" for r in results if r.is_error]
        cpu = meter.per_call(before, meter.snapshot(), sum(len(c) for _, c in turns))
    return {"seconds_by_phase": by_phase, "errors": errors, "cpu_us": cpu}


def by_applier(root: Path, turns: list[tuple[str, list[ToolCall]]]) -> dict[str, Any]:
    applier = Applier(root)
    _warm_up(lambda calls: [applier.apply(c) for c in calls])
    meter = StackMeter(None)
    by_phase: dict[str, float] = {}
    before = meter.snapshot()
    for phase, calls in turns:
        started = time.perf_counter()
        for call in calls:
            applier.apply(call)
        by_phase[phase] = by_phase.get(phase, 0.0) + time.perf_counter() - started
    cpu = meter.per_call(before, meter.snapshot(), sum(len(c) for _, c in turns))
    return {"seconds_by_phase": by_phase, "errors": [], "cpu_us": cpu}


def _warm_up(run: Any) -> None:
    """Calls that change nothing, so that first-call costs (rg's start in each
    worker…) are not the session's."""
    run(
        [
            ToolCall("w0", "grep", GREPS[0]),
            ToolCall("w1", "grep", GREPS[1]),
            ToolCall("w2", "glob", {"pattern": "*.py", "path": "lib/json"}),
            ToolCall("w3", "read", {"path": "lib/json/__init__.py"}),
        ]
    )


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    n = shape(quick)
    pristine = tree(workspace / "session-source")
    turns = plan(workspace / "session-source", pristine, quick)
    calls = sum(len(c) for _, c in turns)
    phases = {p: sum(len(c) for q, c in turns if q == p) for p, _ in turns}
    runs: list[dict[str, Any]] = []
    with daemon(WORKERS) as running, Client(runtime_dir=running.runtime) as client:
        for _ in range(n["repeats"]):
            with tempfile.TemporaryDirectory(prefix="toolpool-session-", dir=workspace) as tmp:
                ours, theirs = Path(tmp) / "toolpool", Path(tmp) / "applier"
                tree(ours)
                tree(theirs)
                tool = through_toolpool(client, running.pid, ours, turns)
                plain = by_applier(theirs, turns)
                diff = differences(digest(ours), digest(theirs))
                changed = differences(digest(workspace / "session-source"), digest(theirs))
                runs.append(
                    {
                        "toolpool": tool,
                        "applier": plain,
                        "differences": diff[:20],
                        "trees_match": not diff,
                        "paths_changed": len(changed),
                    }
                )

    def per_call(who: str, phase: str | None = None) -> float:
        seconds = [
            sum(v for p, v in r[who]["seconds_by_phase"].items() if phase in (None, p))
            for r in runs
        ]
        return float(statistics.median(seconds)) * 1e6 / (calls if phase is None else phases[phase])

    summary = {
        who: {"all": per_call(who), **{p: per_call(who, p) for p in phases}}
        for who in ("toolpool", "applier")
    }
    return {
        "packages": list(STDLIB_PACKAGES),
        "workers": WORKERS,
        "turns": len(turns),
        "calls": calls,
        "calls_by_phase": phases,
        "calls_by_tool": {
            name: sum(1 for _, c in turns for call in c if call.name == name)
            for name in sorted({call.name for _, c in turns for call in c})
        },
        "repeats": n["repeats"],
        "per_call_us": summary,
        "ratio": summary["toolpool"]["all"] / summary["applier"]["all"],
        "cpu_us": {
            who: median_of([r[who]["cpu_us"] for r in runs]) for who in ("toolpool", "applier")
        },
        "trees_match": all(r["trees_match"] for r in runs),
        "errors": [e for r in runs for e in r["toolpool"]["errors"]][:20],
        "runs": runs,
        "stdlib": sysconfig.get_paths()["stdlib"],
    }


def report(ses: dict[str, Any]) -> list[str]:
    """The report's section: µs per call by phase, CPU per process, the trees' match."""
    tools = ", ".join(f"{name} {n}" for name, n in ses["calls_by_tool"].items())
    pc = ses["per_call_us"]
    failed = f"; {len(ses['errors'])} calls failed" if ses["errors"] else ""
    lines = [
        "",
        f"## Session: a coding agent's {ses['calls']} calls on a copy of real source",
        "",
        f"{ses['turns']} turns on a copy of `{'`, `'.join(ses['packages'])}` from the standard "
        f"library ({tools}); toolpool through client → daemon → {ses['workers']} workers, the "
        f"in-process applier one call after another with the same durable writes; median of "
        f"{ses['repeats']} runs, each on fresh copies. End trees: "
        f"{'identical' if ses['trees_match'] else 'DIFFERENT'}{failed}.",
        "",
        "| phase | calls | toolpool µs/call | applier µs/call | toolpool × applier |",
        "|---|---:|---:|---:|---:|",
    ]
    for phase, n in [*ses["calls_by_phase"].items(), ("all", ses["calls"])]:
        t, a = pc["toolpool"][phase], pc["applier"][phase]
        lines.append(f"| {phase} | {n} | {num(t)} | {num(a)} | {times(t, a)} |")
    tp, ap = ses["cpu_us"]["toolpool"], ses["cpu_us"]["applier"]
    total = tp["client"]["total"] + tp["daemon"]["total"] + tp["workers"]["total"]
    total += tp["workers"]["commands"]
    mine = ap["client"]["total"] + ap["client"]["commands"]
    lines += [
        "",
        "| CPU µs per call | toolpool | applier |",
        "|---|---:|---:|",
        f"| client (the applier: its process) | {num(tp['client']['total'])} | "
        f"{num(ap['client']['total'])} |",
        f"| daemon | {num(tp['daemon']['total'])} | – |",
        f"| workers | {num(tp['workers']['total'])} | – |",
        f"| commands run (rg) | {num(tp['workers']['commands'])} | "
        f"{num(ap['client']['commands'])} |",
        f"| all | {num(total)} | {num(mine)} |",
    ]
    for problem in ses["errors"][:5]:
        lines.append(f"- failed: {problem}")
    for run in ses["runs"]:
        for diff in run["differences"][:5]:
            lines.append(f"- {diff}")
    return lines
