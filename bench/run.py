"""``toolpool bench``: measure toolpool beside its floor and its peers, in one run.

    .venv/bin/toolpool bench            # the full bench (minutes on 2 cores, the soak 3 of them)
    .venv/bin/toolpool bench --quick    # every scenario, briefly
    python bench/run.py --only overhead,interrupts --out /tmp/results

Writes raw.json (the machine, package versions, every sample), report.md (tables with
ratios to floors and peers, targets checked) and PNG plots to the results folder.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench import plots as plotting
from bench import report
from bench.common import REPO, dump, machine
from bench.scenarios import (
    branch,
    confinement,
    cpu,
    egress,
    environment,
    flood,
    interrupts,
    overhead,
    peers,
    recovery,
    scale,
    session,
    shells,
    soak,
    throughput,
)
from bench.targets import targets

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
    "scale",
)
# Run when named (--only): it needs the ray extra and starts a Ray cluster.
ON_REQUEST = ("scale",)


class _Parser(argparse.ArgumentParser):
    """argparse, with the message prefix and exit code of every toolpool command."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"toolpool: error: bench: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="toolpool bench",
        description="Measure toolpool beside its floor and its peers, in one run.",
    )
    parser.add_argument("--quick", action="store_true", help="every scenario, briefly")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results/<time>)")
    parser.add_argument("--only", help=f"comma-separated scenarios of {', '.join(SCENARIOS)}")
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else [s for s in SCENARIOS if s not in ON_REQUEST]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    started = datetime.now(UTC)
    out = args.out or REPO / "bench" / "results" / started.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    command = "toolpool bench " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    console = Console(stderr=True)
    data: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "command": command.strip(),
        "quick": args.quick,
        "machine": machine(),
    }

    with (
        tempfile.TemporaryDirectory(prefix="toolpool-bench-ws-") as tmp,
        Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        workspace = Path(tmp)
        tasks = {
            name: progress.add_task(
                name, total=throughput.cell_count(args.quick) if name == "throughput" else 1
            )
            for name in chosen
        }
        for name in chosen:
            began = time.perf_counter()
            task = tasks[name]
            if name == "overhead":
                data[name] = overhead.run(args.quick, workspace)
            elif name == "cpu":
                data[name] = cpu.run(args.quick, workspace)
            elif name == "session":
                data[name] = session.run(args.quick, workspace)
            elif name == "throughput":
                data[name] = throughput.run(
                    args.quick, workspace, functools.partial(progress.advance, task)
                )
            elif name == "mixed":
                data[name] = throughput.mixed(args.quick, workspace)
            elif name == "interrupts":
                data[name] = interrupts.run(args.quick, workspace)
            elif name == "recovery":
                data[name] = recovery.run(args.quick, workspace)
            elif name == "confinement":
                data[name] = confinement.run(args.quick, workspace)
            elif name == "environment":
                data[name] = environment.run(args.quick, workspace)
            elif name == "egress":
                data[name] = egress.run(args.quick, workspace)
            elif name == "branch":
                data[name] = branch.run(args.quick, workspace)
            elif name == "peers":
                data[name] = peers.run(args.quick, workspace)
            elif name == "soak":
                data[name] = soak.run(args.quick, workspace)
            elif name == "flood":
                data[name] = flood.run(args.quick, workspace)
            elif name == "shells":
                data[name] = shells.run(args.quick, workspace)
            elif name == "scale":
                data[name] = scale.run(args.quick, workspace)
            progress.update(task, completed=progress.tasks[task].total)
            data.setdefault("seconds", {})[name] = round(time.perf_counter() - began, 1)

    dump(out / "raw.json", data)
    plots = plotting.plots(data, out)
    (out / "report.md").write_text(report.markdown(data, data["command"]))
    console.print(
        f"[bold]results[/] in {out}: raw.json, report.md, {', '.join(p.name for p in plots)}"
    )
    for name, measured, verdict in targets(data):
        style = {"met": "green", "missed": "red"}.get(verdict, "dim")
        console.print(f"  [{style}]{verdict:>6}[/] {escape(name)}: {escape(measured)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
