"""Test kit for the built-in file tools: contexts, a stdlib tree, and raw ripgrep."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from toolpool import FileReadRegister, TextBlock, ToolContext
from toolpool.cancel import CancelToken
from toolpool.tool import ToolOutput
from toolpool.tools import read_tool

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Small packages of the standard library: real trees that nobody here wrote.
STDLIB_PACKAGES = ("json", "email", "asyncio")


def tool_context(
    workspace: Path,
    *,
    extra_roots: Iterable[Path] = (),
    scratch_dir: Path | None = None,
    files: FileReadRegister | None = None,
    cancel_token: CancelToken | None = None,
) -> ToolContext:
    """A context as a session would make it, for calling a tool's methods directly."""
    return ToolContext(
        call_id="call",
        tool_name="tool",
        session_id="session",
        workspace=workspace.resolve(),
        files=files or FileReadRegister(),
        extra_roots=tuple(r.resolve() for r in extra_roots),
        scratch_dir=scratch_dir,
        cancel_token=cancel_token or CancelToken(),
    )


def text(output: Any) -> str:
    """The text of what a tool returned: a string, or content blocks (with details)."""
    if isinstance(output, ToolOutput):
        output = output.content
    if isinstance(output, str):
        return output
    return "\n".join(b.text for b in output if isinstance(b, TextBlock))


def read_whole(ctx: ToolContext, path: str) -> str:
    """Read ``path`` with the read tool, as the model must before editing it."""
    return text(read_tool.execute({"path": path}, ctx))


def copy_stdlib(into: Path, packages: Sequence[str] = STDLIB_PACKAGES) -> Path:
    """Copy standard-library packages (sources only) under ``into``; mtimes are kept."""
    for package in packages:
        shutil.copytree(
            STDLIB / package, into / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return into


def raw_rg(args: Sequence[str], cwd: Path) -> list[str]:
    """The lines raw ``rg`` prints for ``args`` in ``cwd`` (no ripgreprc, no stdin)."""
    done = subprocess.run(
        ["rg", "--no-config", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    lines = done.stdout.decode("utf-8", errors="replace").split("\n")
    return [line.removesuffix("\r") for line in lines if line]
