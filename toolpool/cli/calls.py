"""``toolpool call NAME JSON [NAME JSON …]`` (calls through the daemon, one turn each,
in one session) and ``toolpool tools`` (the tools' definitions, the daemon's or the
configured ones, in toolpool's form or a provider's).

The choices of ``--format`` and ``--profile`` come from their owners: the providers'
table (``toolpool.providers.PROVIDERS``) and the profiles' (``toolpool.profiles.PROFILES``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolpool.cli.console import render_event, terminal
from toolpool.cli.endpoint import client_flags, connect
from toolpool.cli.messages import UsageError, note
from toolpool.client.control import ExitCode
from toolpool.profiles import DEFAULT_PROFILE, PROFILES
from toolpool.providers import PROVIDERS

# Definitions in toolpool's own form (ToolSpec.definition), or in a provider's.
FORMATS = ("toolpool", *PROVIDERS)


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    call = commands.add_parser(
        "call",
        help="run calls through the daemon, one turn each, in one session",
        description="NAME JSON [NAME JSON …]: each call a turn of its own, one after "
        "another, in one session (a read stamps the file for an edit after it).",
    )
    call.add_argument("calls", nargs="+", metavar="NAME JSON", help="a tool and its arguments")
    call.add_argument("--workspace", default=".", help="the session's workspace (default: .)")
    call.add_argument("--print-result", action="store_true", help="print each result's text")
    client_flags(call)
    call.set_defaults(handler=run_calls)

    tools = commands.add_parser(
        "tools", help="the tools' definitions (the daemon's, else the configured ones)"
    )
    tools.add_argument("--format", choices=FORMATS, default="toolpool")
    tools.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default=DEFAULT_PROFILE,
        help="the tools of this tool profile (claude-code: Claude Code's, codex: Codex CLI's, "
        "openai and anthropic: the tools those providers' APIs define)",
    )
    tools.add_argument("--config", help="TOML configuration file (when no daemon runs)")
    tools.add_argument("--tool-modules", action="append", metavar="A,B", help="when no daemon runs")
    client_flags(tools)
    tools.set_defaults(handler=print_tools)


def parse_calls(words: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """``NAME JSON [NAME JSON …]`` as (name, arguments) pairs; a UsageError otherwise."""
    if len(words) % 2:
        raise UsageError(
            f"call: {len(words)} words: expected pairs of a tool name and its JSON arguments"
        )
    calls = []
    for index in range(0, len(words), 2):
        name, text = words[index], words[index + 1]
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"call {name}: the arguments are not JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise UsageError(f"call {name}: the arguments must be a JSON object, not {text!r}")
        calls.append((name, arguments))
    return calls


def run_calls(args: argparse.Namespace) -> int:
    """Each call is a turn of its own, one after another, in one session: a read
    stamps the file for the edit after it (F3)."""
    from toolpool.models import ToolCall

    calls = parse_calls(args.calls)
    if not Path(args.workspace).is_dir():  # a usage error, before any daemon is asked
        raise UsageError(f"call: --workspace {args.workspace}: no such directory")
    console = terminal()
    results = []
    with connect(args) as client, client.session(args.workspace) as session:
        for number, (name, arguments) in enumerate(calls, 1):
            turn = session.submit([ToolCall(f"call-{number}", name, arguments)])
            for event in turn:
                render_event(event, console)
            (result,) = turn.results()
            results.append(result)
            if args.print_result:
                print(result.text, flush=True)
    return ExitCode.FAILED if any(r.is_error for r in results) else ExitCode.OK


def print_tools(args: argparse.Namespace) -> int:
    """The daemon's tools when one answers (it knows the tools of its MCP servers too);
    else the configured tool modules', loaded here."""
    from toolpool.client import DaemonUnavailable
    from toolpool.client.control import left_out

    definitions = None
    try:
        with connect(args) as client:
            definitions = client.tools(args.format, args.profile)
            for line in left_out(client.status()):  # not listed: say why (E9)
                note(line)
    except DaemonUnavailable:
        if args.endpoint is not None or os.environ.get("TOOLPOOL_ENDPOINT"):
            raise  # that daemon was asked for by name
    if definitions is None:
        definitions = _configured_tools(args)
    print(json.dumps(definitions, indent=2, ensure_ascii=False))
    return ExitCode.OK


def _configured_tools(args: argparse.Namespace) -> list[dict[str, Any]]:
    from toolpool.daemon.config import load_config, tool_registry
    from toolpool.profiles import lists
    from toolpool.providers import definitions

    flags = {"config": args.config, "runtime_dir": args.runtime_dir}
    if args.tool_modules:
        flags["tool_modules"] = ",".join(args.tool_modules)
    config = load_config(flags)
    specs = [t for t in tool_registry(config.tool_modules) if lists(args.profile, t.name)]
    if config.mcp_servers is not None:
        note(f"no daemon runs: the tools of the MCP servers of {config.mcp_servers} are not here")
    if args.format == "toolpool":
        return [spec.definition() for spec in specs]
    return definitions(specs, args.format)
