"""``toolpool bench``: the bench of the source checkout this package is imported from
(``bench/run.py``), with every flag, ``--help`` too, its own."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import toolpool
from toolpool.cli.messages import UsageError


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Its flags (--help too) are the bench's own: main hands it what it does not know.
    bench = commands.add_parser(
        "bench", add_help=False, help="measure throughput, latency, interrupts (--help for more)"
    )
    bench.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    """Run ``bench/run.py`` in a process of its own (the bench starts and stops
    daemons, and plots)."""
    script = Path(toolpool.__file__).resolve().parent.parent / "bench" / "run.py"
    if not script.is_file():
        raise UsageError(
            "bench: the bench ships with toolpool's source, not with the installed "
            "package; run it from a checkout (pip install -e '.[bench]')"
        )
    missing = [m for m in ("matplotlib", "rich") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"bench: needs {', '.join(missing)}: pip install 'toolpool[bench]'")
    return subprocess.call([sys.executable, str(script), *args.bench_args])
