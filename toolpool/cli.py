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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolpool", description="A tool-execution engine for AI coding agents."
    )
    parser.add_argument("--version", action="version", version=f"toolpool {toolpool.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser("demo", help="push one realistic turn through the pipeline")
    demo.set_defaults(handler=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
