"""``toolpool demo``: a realistic turn through the daemon (or in-process), its events
shown live.

The scratch workspace is a tiny Python project. One turn: a glob, two greps and two
reads fan out side by side; an edit (with its diff as a preview) runs alone after
them — the reads before it stamped the file, so read-before-write is satisfied; then
a bash command runs the project's tests and streams their output.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from rich.console import Console

from toolpool.cli.console import render_event, terminal
from toolpool.cli.endpoint import client_flags
from toolpool.client.control import ExitCode
from toolpool.models import ToolCall, ToolResult

PROJECT = {
    "README.md": "# calc\n\nA tiny calculator.\n",
    "calc/__init__.py": "",
    "calc/ops.py": (
        "def add(a, b):\n    return a + b\n\n\n"
        "def mul(a, b):\n    # TODO: handle overflow\n    return a * b\n"
    ),
    "tests/test_ops.py": (
        "from calc.ops import add, mul\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n"
    ),
}

RUN_TESTS = (
    "for t in test_add test_mul; do "
    'echo "running $t"; python3 -c "from tests.test_ops import $t; $t()" && echo "  ok"; '
    "sleep 0.3; done"
)

CALLS = [
    ToolCall("c1", "glob", {"pattern": "**/*.py"}),
    ToolCall("c2", "grep", {"pattern": "TODO", "output_mode": "content"}),
    ToolCall("c3", "grep", {"pattern": "def ", "output_mode": "count"}),
    ToolCall("c4", "read", {"path": "calc/ops.py"}),
    ToolCall("c5", "read", {"path": "README.md"}),
    ToolCall(
        "c6",
        "edit",
        {
            "path": "calc/ops.py",
            "old_string": "    # TODO: handle overflow\n",
            "new_string": "",
        },
    ),
    ToolCall("c7", "bash", {"command": RUN_TESTS, "description": "Run the tests"}),
]


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="one realistic turn with its events shown live")
    demo.add_argument(
        "--in-process", action="store_true", help="run without a daemon (tools in-process)"
    )
    client_flags(demo)
    demo.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    results = run_demo(
        terminal(), in_process=args.in_process, endpoint=args.endpoint, runtime_dir=args.runtime_dir
    )
    return ExitCode.OK if results and not any(r.is_error for r in results) else ExitCode.FAILED


def make_workspace(root: Path) -> None:
    for name, text in PROJECT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_demo(
    console: Console,
    *,
    in_process: bool = False,
    endpoint: str | None = None,
    runtime_dir: Path | None = None,
) -> tuple[ToolResult, ...]:
    with tempfile.TemporaryDirectory(prefix="toolpool-demo-") as tmp:
        root = Path(tmp)
        make_workspace(root)
        where = "in-process" if in_process else "through the daemon"
        console.print(
            f"[bold]toolpool demo[/] — {len(CALLS)} calls in one turn, {where}, workspace {root}"
        )
        started = time.perf_counter()
        results = (
            _in_process(root, console)
            if in_process
            else _through_daemon(root, console, endpoint, runtime_dir)
        )
        elapsed = (time.perf_counter() - started) * 1000
        console.print(f"[dim]turn took {elapsed:.0f} ms[/]")
        return results


def _through_daemon(
    root: Path, console: Console, endpoint: str | None, runtime_dir: Path | None
) -> tuple[ToolResult, ...]:
    from toolpool.client import Client

    with Client(endpoint, runtime_dir=runtime_dir) as client, client.session(root) as session:
        turn = session.submit(CALLS)
        for event in turn:
            render_event(event, console)
        return turn.results()


def _in_process(root: Path, console: Console) -> tuple[ToolResult, ...]:
    from toolpool.engine import Coordinator
    from toolpool.tools import BUILTIN_TOOLS

    coordinator = Coordinator(BUILTIN_TOOLS)
    session = coordinator.open_session(root)
    try:
        return asyncio.run(
            coordinator.run_turn(session, CALLS, on_event=lambda e: render_event(e, console))
        )
    finally:
        coordinator.close_session(session)
