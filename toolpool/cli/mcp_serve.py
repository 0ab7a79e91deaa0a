"""``toolpool mcp serve``: the daemon's tools to an MCP client over stdio
(``toolpool.client.mcp_serve``), one session whose options the flags give; a daemon is
started when none runs. Only MCP goes to stdout: everything else is written to stderr.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from toolpool.cli.messages import UsageError
from toolpool.profiles import PROFILES


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mcp = commands.add_parser("mcp", help="toolpool and the Model Context Protocol")
    mcp_commands = mcp.add_subparsers(dest="mcp_command", metavar="COMMAND", required=True)
    serve = mcp_commands.add_parser(
        "serve", help="serve the daemon's tools to an MCP client over stdio"
    )
    serve.add_argument("--workspace", default=".", help="the session's workspace (default: .)")
    serve.add_argument("--runtime-dir", type=Path, help="the daemon's runtime directory")
    serve.add_argument(
        "--gate",
        choices=("allow", "ask", "policy"),
        help="the session's gate: ask asks the MCP client's user (elicitation) before every "
        "call that is not read-only; policy follows --policy (default: allow)",
    )
    serve.add_argument(
        "--policy", metavar="JSON|FILE", help="the gate's rules: a JSON list, or a file holding one"
    )
    serve.add_argument(
        "--tool-profile", choices=tuple(PROFILES), help="whose tool names the session offers"
    )
    serve.add_argument(
        "--allow-network", action="store_true", help="the session's commands may reach out"
    )
    serve.add_argument(
        "--limit",
        action="append",
        metavar="NAME=VALUE",
        help="a per-call limit of the session (wall_seconds=30, memory_bytes=…; repeatable)",
    )
    serve.add_argument(
        "--approval-timeout", type=float, metavar="SECONDS", help="how long a question waits"
    )
    serve.set_defaults(handler=serve_stdio)


def serve_stdio(args: argparse.Namespace) -> int:
    from toolpool.daemon.config import load_config
    from toolpool.mcp import McpUnavailable, require_sdk

    try:
        require_sdk()
    except McpUnavailable as exc:
        raise UsageError(f"mcp serve: {exc}") from None
    config = load_config({"runtime_dir": args.runtime_dir}, check_modules=False)
    options = session_options(args)
    from toolpool.client import mcp_serve

    return mcp_serve.serve_stdio(
        Path(args.workspace),
        config.runtime_dir,
        log_file=config.log_file,
        drain_grace=config.drain_grace,
        options=options,
    )


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    """The session options the flags give, checked as the daemon checks them (a bad
    one is a usage error naming it)."""
    from toolpool.session_options import SessionOptionError, SessionOptions

    options: dict[str, Any] = {}
    if args.gate is not None:
        options["gate"] = args.gate
    if args.policy is not None:
        text = args.policy
        if not text.lstrip().startswith("["):
            try:
                text = Path(text).read_text()
            except OSError as exc:
                raise UsageError(f"mcp serve: --policy {args.policy}: {exc.strerror}") from None
        try:
            options["policy"] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"mcp serve: --policy is not a JSON list of rules: {exc}") from None
    if args.tool_profile is not None:
        options["tool_profile"] = args.tool_profile
    if args.allow_network:
        options["allow_network"] = True
    if args.approval_timeout is not None:
        options["approval_timeout"] = args.approval_timeout
    limits: dict[str, Any] = {}
    for item in args.limit or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"mcp serve: --limit {item!r}: expected NAME=VALUE")
        limits[name.strip()] = _number(value.strip())
    if limits:
        options["limits"] = limits
    try:
        SessionOptions.parse(options)
    except SessionOptionError as exc:
        raise UsageError(f"mcp serve: {exc}") from None
    return options


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return {"true": True, "false": False}.get(text.lower(), text)
