"""A realistic turn pushed through the pipeline, its events printed as they happen.

The demo tools work on a scratch workspace: parallel reads, a call with a
coercible argument, an edit refused before its file was read (F3) then accepted,
and a slow command that streams progress.
"""

from __future__ import annotations

import asyncio
import difflib
import tempfile
import time
from pathlib import Path

from rich.console import Console

from toolpool.console import render_event
from toolpool.coordinator import Coordinator
from toolpool.file_reads import FileReadStamp
from toolpool.function_tool import tool
from toolpool.models import ToolCall, ToolResult
from toolpool.tool import ToolContext, ValidationResult


@tool(read_only=True, label="Read")
def read_file(path: str, ctx: ToolContext) -> str:
    """Read a text file of the workspace.

    Args:
        path: File path relative to the workspace.
    """
    target = ctx.workspace / path
    data = target.read_bytes()
    ctx.files.record(target, FileReadStamp.of(target, data, partial=False))
    return data.decode()


@tool(read_only=True, label="Count lines")
def count_lines(path: str, ctx: ToolContext) -> int:
    """Count the lines of a file of the workspace.

    Args:
        path: File path relative to the workspace.
    """
    return len((ctx.workspace / path).read_text().splitlines())


def _check_read(args: dict[str, object], ctx: ToolContext) -> ValidationResult:
    return ctx.files.check_before_write(ctx.workspace / str(args["path"]))


def _diff(args: dict[str, object], ctx: ToolContext) -> str:
    target = ctx.workspace / str(args["path"])
    old = target.read_text()
    new = old + str(args["line"]) + "\n"
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        f"a/{args['path']}",
        f"b/{args['path']}",
    )
    return "".join(lines)


@tool(label="Append line", validate=_check_read, preview=_diff)
def append_line(path: str, line: str, ctx: ToolContext) -> str:
    """Append one line to a file the session has read.

    Args:
        path: File path relative to the workspace.
        line: The line to append, without its newline.
    """
    target = ctx.workspace / path
    with target.open("a") as f:
        f.write(line + "\n")
    data = target.read_bytes()
    ctx.files.record(target, FileReadStamp.of(target, data, partial=False))
    return f"appended 1 line to {path}"


@tool(label="Run steps", interrupt_behavior="cancel", activity="Running {steps} steps")
async def run_steps(steps: int, ctx: ToolContext) -> str:
    """Run a slow job of a few steps, reporting each one.

    Args:
        steps: How many steps to run.
    """
    for i in range(1, steps + 1):
        await asyncio.sleep(0.15)
        ctx.report_progress(f"step {i}/{steps} done")
    return f"{steps} steps done"


DEMO_TOOLS = [read_file, count_lines, append_line, run_steps]


def _make_workspace(root: Path) -> None:
    (root / "README.md").write_text("# demo\n\nA scratch project.\n")
    (root / "notes.txt").write_text("first note\nsecond note\n")
    (root / "main.py").write_text("print('hello')\n")


async def run_demo(console: Console) -> tuple[ToolResult, ...]:
    with tempfile.TemporaryDirectory(prefix="toolpool-demo-") as tmp:
        root = Path(tmp)
        _make_workspace(root)
        coordinator = Coordinator(DEMO_TOOLS, max_tool_concurrency=4)
        session = coordinator.open_session(root)
        calls = [
            ToolCall("c1", "count_lines", {"path": "README.md"}),
            ToolCall("c2", "count_lines", {"path": "main.py"}),
            ToolCall("c3", "append_line", {"path": "notes.txt", "line": "third note"}),
            ToolCall("c4", "read_file", {"path": "notes.txt"}),
            ToolCall("c5", "append_line", {"path": "notes.txt", "line": "third note"}),
            ToolCall("c6", "run_steps", {"steps": "3"}),
        ]
        console.print(f"[bold]toolpool demo[/] — workspace {root}, {len(calls)} calls in one turn")
        started = time.perf_counter()
        results = await coordinator.run_turn(
            session, calls, on_event=lambda e: render_event(e, console)
        )
        console.print(f"[dim]turn took {(time.perf_counter() - started) * 1000:.0f} ms[/]")
        return results
