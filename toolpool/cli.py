"""The ``toolpool`` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from rich.console import Console

import toolpool


def _cmd_demo(args: argparse.Namespace) -> int:
    from toolpool.demo import run_demo

    console = Console(highlight=False, soft_wrap=True)
    results = asyncio.run(run_demo(console))
    return 0 if results else 1


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Print which sandbox mechanisms this machine offers, and what is off and why."""
    import shutil

    from toolpool.sandbox import SandboxProfile

    console = Console(highlight=False, soft_wrap=True)
    profile = SandboxProfile.probe()
    console.print("[bold]sandbox profile[/] (strongest available is applied):")
    for line in profile.describe():
        style = "green" if line.startswith("on") else "yellow"
        console.print(f"  [{style}]{line}[/]")
    rg = shutil.which("rg")
    console.print(f"[bold]ripgrep[/]: {rg or 'missing (install the Debian package ripgrep)'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolpool", description="A tool-execution engine for AI coding agents."
    )
    parser.add_argument("--version", action="version", version=f"toolpool {toolpool.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser("demo", help="push one realistic turn through the pipeline")
    demo.set_defaults(handler=_cmd_demo)
    doctor = commands.add_parser("doctor", help="show the sandbox profile this machine offers")
    doctor.set_defaults(handler=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
