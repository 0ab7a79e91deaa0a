"""The ``toolpool`` command.

toolpool daemon [run|start|stop|status] [flags]   the daemon (foreground by default)
toolpool demo [--in-process]                      one realistic turn, events live
toolpool call NAME JSON [NAME JSON …]            calls, one turn each, in one session
toolpool tools [--format openai|anthropic|…] [--profile claude-code|codex|openai|…]
                                                  the tools' definitions
toolpool status [--json]                          workers, queue, sessions, sandbox
toolpool doctor                                   the sandbox this machine offers
toolpool audit [--file PATH] [--follow]           the audit log, one line per call
toolpool mcp serve [--workspace DIR] [--gate …]    the tools, to an MCP client over stdio
toolpool bench [--quick] [--out DIR] [--only …]   the bench (from a source checkout)

One module per group of commands, each adding its parsers (``add_to``) with their
handlers: ``daemon.py``, ``demo.py``, ``calls.py`` (call, tools), ``status.py``
(status, doctor), ``audit.py``, ``mcp_serve.py``, ``bench.py``. They share
``messages.py`` (the prefix of what is said, the exit codes), ``endpoint.py`` (which
daemon a client command talks to) and ``console.py`` (events as lines on a terminal).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import toolpool
from toolpool.cli import audit, bench, calls, daemon, demo, mcp_serve, messages, status
from toolpool.client.control import ExitCode

# In the order ``--help`` lists them.
COMMANDS = (daemon, demo, calls, status, audit, mcp_serve, bench)


class _Parser(argparse.ArgumentParser):
    """argparse, with toolpool's message prefix and exit code for a usage error."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        messages.error(message)
        sys.exit(ExitCode.USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="toolpool",
        description="A tool-execution engine for AI coding agents.",
        epilog=messages.EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"toolpool {toolpool.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMANDS:
        group.add_to(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command; no traceback for bad input, one prefix, one table of exit codes."""
    from toolpool.client import DaemonUnavailable
    from toolpool.daemon.config_table import ConfigError
    from toolpool.runtime import PathSettingError

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.FAILED
    except Exception as exc:
        usage = (ConfigError, PathSettingError, messages.UsageError)
        code, message = messages.exit_for(exc, usage, DaemonUnavailable)
        if messages.debugging():
            traceback.print_exc()
        messages.error(message)
        return code
