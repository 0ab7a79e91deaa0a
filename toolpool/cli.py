"""The ``toolpool`` command.

toolpool daemon [run|start|stop|status] [flags]   the daemon (foreground by default)
toolpool demo [--in-process]                      one realistic turn, events live
toolpool call NAME JSON [--workspace DIR]         one call, events live
toolpool tools [--format openai|anthropic|…]      the tools' definitions
toolpool status [--json]                          workers, queue, sessions, sandbox
toolpool doctor                                   the sandbox this machine offers
toolpool mcp serve [--workspace DIR]              the tools, to an MCP client over stdio
toolpool bench [--quick] [--out DIR] [--only …]   the bench (from a source checkout)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import toolpool

FORMATS = ("toolpool", "openai", "openai-responses", "anthropic", "gemini", "mcp")


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


# --- daemon -----------------------------------------------------------------------------

_DAEMON_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--config", {"type": Path, "help": "TOML configuration file"}),
    ("--runtime-dir", {"type": Path, "help": "private directory for the socket and pid"}),
    ("--tcp", {"help": "also listen on HOST:PORT (non-loopback needs CURVE keys)"}),
    ("--min-workers", {"type": int}),
    ("--max-workers", {"type": int}),
    ("--max-tool-concurrency", {"type": int}),
    ("--max-tool-errors", {"type": int}),
    ("--tool-module", {"action": "append", "dest": "tool_modules", "help": "repeatable"}),
    ("--sandbox-disable", {"action": "append", "dest": "sandbox_disabled"}),
    ("--log-level", {"choices": ["debug", "info", "warning", "error"]}),
    ("--log-file", {"type": Path}),
    ("--mcp-servers", {"type": Path, "help": 'MCP servers to import ({"mcpServers": …} JSON)'}),
]


def _daemon_flags(args: argparse.Namespace) -> dict[str, Any]:
    flags = {}
    for flag, options in _DAEMON_FLAGS:
        dest = options.get("dest") or flag.lstrip("-").replace("-", "_")
        flags[dest] = getattr(args, dest)
    return flags


def _daemon_argv(flags: dict[str, Any]) -> list[str]:
    """The flags again, for the background daemon's command line."""
    argv: list[str] = ["run"]
    for flag, options in _DAEMON_FLAGS:
        dest = options.get("dest") or flag.lstrip("-").replace("-", "_")
        value = flags.get(dest)
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            argv += [flag, str(item)]
    return argv


def _cmd_daemon(args: argparse.Namespace) -> int:
    # The command line stands above both sides: ``run`` is the daemon itself, the
    # others are the client side's control of one in the background.
    from toolpool.client import control
    from toolpool.daemon.config import ConfigError, load_config

    flags = _daemon_flags(args)
    try:
        config = load_config(flags)
    except ConfigError as exc:
        print(f"toolpool daemon: {exc}", file=sys.stderr)
        return 2
    match args.action:
        case "start":
            return control.start_background(
                config.runtime_dir, _daemon_argv(flags), log_file=config.log_file
            )
        case "stop":
            return control.stop_background(config.runtime_dir, drain_grace=config.drain_grace)
        case "status":
            return control.status_background(config.runtime_dir)
        case _:
            from toolpool.daemon.main import run_foreground

            return run_foreground(config)


# --- client commands ----------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Any:
    from toolpool.client import Client

    return Client(args.endpoint, runtime_dir=args.runtime_dir)


def _cmd_demo(args: argparse.Namespace) -> int:
    from toolpool.client import ClientError
    from toolpool.demo import run_demo

    console = _console()
    try:
        results = run_demo(
            console,
            in_process=args.in_process,
            endpoint=args.endpoint,
            runtime_dir=args.runtime_dir,
        )
    except ClientError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    return 0 if results else 1


def _cmd_call(args: argparse.Namespace) -> int:
    from toolpool.client import ClientError
    from toolpool.console import render_event
    from toolpool.models import ToolCall

    try:
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        print(f"toolpool call: the arguments are not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(arguments, dict):
        print("toolpool call: the arguments must be a JSON object", file=sys.stderr)
        return 2
    console = _console()
    try:
        with _client(args) as client, client.session(args.workspace) as session:
            turn = session.submit([ToolCall("call-1", args.name, arguments)])
            for event in turn:
                render_event(event, console)
            (result,) = turn.results()
    except ClientError as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    if args.print_result:
        print(result.text)
    return 1 if result.is_error else 0


def _cmd_tools(args: argparse.Namespace) -> int:
    from toolpool.client import ClientError

    try:
        with _client(args) as client:
            definitions = client.tools(args.format)
    except ClientError as exc:
        print(f"toolpool tools: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(definitions, indent=2, ensure_ascii=False))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from toolpool.client import ClientError

    try:
        with _client(args) as client:
            status = client.status()
    except ClientError as exc:
        print(f"toolpool status: {exc}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    console = _console()
    workers = ", ".join(f"{n} {state}" for state, n in status.get("workers", {}).items() if n)
    console.print(
        f"[bold]daemon[/] pid {status['pid']}, up {status['uptime_seconds']} s"
        + (" [yellow](draining)[/]" if status["draining"] else "")
    )
    console.print(
        f"[bold]workers[/] {workers or 'none'}; {status.get('queued_calls', 0)} calls queued"
    )
    console.print(
        f"[bold]limits[/] max_tool_concurrency {status['max_tool_concurrency']}, "
        f"max_tool_errors {status['max_tool_errors']}"
    )
    if status.get("running_as_root"):
        console.print(
            "[yellow]running as root[/]: commands run without capabilities but still pass "
            "owner checks on root's files; a dedicated unprivileged user is the safer way "
            "to run the daemon"
        )
    console.print(f"[bold]sessions[/] {len(status['sessions'])}, clients {status['clients']}")
    for session_id, info in status["sessions"].items():
        failing = ", ".join(f"{t}: {n}" for t, n in info["breaker_failures"].items()) or "none"
        opened = ", ".join(info["open_breakers"]) or "none"
        console.print(
            f"  {session_id} {info['workspace']}: {info['turns']} turns, failures {failing}, "
            f"breakers open: {opened}"
        )
    console.print("[bold]sandbox[/]")
    for name, mechanism in status.get("sandbox", {}).items():
        mark = "[green]on [/]" if mechanism["active"] else "[yellow]off[/]"
        console.print(f"  {mark} {name}: {mechanism['detail']}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Print which sandbox mechanisms this machine offers, and what is off and why."""
    import shutil

    from toolpool.sandbox import SandboxProfile

    console = _console()
    profile = SandboxProfile.probe()
    console.print("[bold]sandbox profile[/] (strongest available is applied):")
    for line in profile.describe():
        style = "green" if line.startswith("on") else "yellow"
        console.print(f"  [{style}]{line}[/]")
    from toolpool.sandbox.selfcheck import self_check

    ok, detail = self_check(profile)
    style = "green" if ok else "red"
    console.print(f"[bold]confined command[/]: [{style}]{'works' if ok else 'FAILS'}[/] — {detail}")
    if os.geteuid() == 0:
        console.print(
            "[yellow]running as root[/]: commands run without capabilities, but still pass "
            "owner checks on root's files; a dedicated unprivileged user is the safer way "
            "to run the daemon"
        )
    rg = shutil.which("rg")
    console.print(f"[bold]ripgrep[/]: {rg or 'missing (install the Debian package ripgrep)'}")
    return 0 if ok else 1


def _cmd_mcp_serve(args: argparse.Namespace) -> int:
    """Serve the daemon's tools over stdio; starts a daemon when none runs. Only MCP
    goes to stdout: everything else is written to stderr."""
    from toolpool.daemon.config import ConfigError, load_config
    from toolpool.mcp import McpUnavailable, require_sdk

    try:
        require_sdk()
    except McpUnavailable as exc:
        print(f"toolpool mcp serve: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config({"runtime_dir": args.runtime_dir})
    except ConfigError as exc:
        print(f"toolpool mcp serve: {exc}", file=sys.stderr)
        return 1
    from toolpool.client.mcp_serve import serve_stdio

    return serve_stdio(
        Path(args.workspace),
        config.runtime_dir,
        log_file=config.log_file,
        drain_grace=config.drain_grace,
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run ``bench/run.py`` of the source checkout this package is imported from, in
    a process of its own (the bench starts and stops daemons, and plots)."""
    script = Path(toolpool.__file__).resolve().parent.parent / "bench" / "run.py"
    if not script.is_file():
        print(
            "toolpool bench: the bench ships with toolpool's source, not with the "
            "installed package; run it from a checkout (pip install -e '.[bench]').",
            file=sys.stderr,
        )
        return 2
    missing = [m for m in ("matplotlib", "rich") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"toolpool bench: needs {', '.join(missing)}: pip install 'toolpool[bench]'",
            file=sys.stderr,
        )
        return 2
    return subprocess.call([sys.executable, str(script), *args.bench_args])


# --- the parser ---------------------------------------------------------------------------


def _client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help="the daemon's endpoint (default: this user's daemon)")
    parser.add_argument("--runtime-dir", type=Path, help="the daemon's runtime directory")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolpool", description="A tool-execution engine for AI coding agents."
    )
    parser.add_argument("--version", action="version", version=f"toolpool {toolpool.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    daemon = commands.add_parser("daemon", help="run the daemon, or start/stop/status it")
    daemon.add_argument(
        "action", nargs="?", default="run", choices=["run", "start", "stop", "status"]
    )
    for flag, options in _DAEMON_FLAGS:
        daemon.add_argument(flag, **options)
    daemon.set_defaults(handler=_cmd_daemon)

    demo = commands.add_parser("demo", help="one realistic turn with its events shown live")
    demo.add_argument(
        "--in-process", action="store_true", help="run without a daemon (tools in-process)"
    )
    _client_flags(demo)
    demo.set_defaults(handler=_cmd_demo)

    call = commands.add_parser("call", help="run one call through the daemon")
    call.add_argument("name")
    call.add_argument("arguments", help="the arguments, a JSON object")
    call.add_argument("--workspace", default=".", help="the session's workspace (default: .)")
    call.add_argument("--print-result", action="store_true", help="print the result's text")
    _client_flags(call)
    call.set_defaults(handler=_cmd_call)

    tools = commands.add_parser("tools", help="list the tools' definitions")
    tools.add_argument("--format", choices=FORMATS, default="toolpool")
    _client_flags(tools)
    tools.set_defaults(handler=_cmd_tools)

    status = commands.add_parser("status", help="the daemon's workers, queue and sessions")
    status.add_argument("--json", action="store_true")
    _client_flags(status)
    status.set_defaults(handler=_cmd_status)

    doctor = commands.add_parser("doctor", help="show the sandbox profile this machine offers")
    doctor.set_defaults(handler=_cmd_doctor)

    mcp = commands.add_parser("mcp", help="toolpool and the Model Context Protocol")
    mcp_commands = mcp.add_subparsers(dest="mcp_command", metavar="COMMAND", required=True)
    mcp_serve = mcp_commands.add_parser(
        "serve", help="serve the daemon's tools to an MCP client over stdio"
    )
    mcp_serve.add_argument("--workspace", default=".", help="the session's workspace (default: .)")
    mcp_serve.add_argument("--runtime-dir", type=Path, help="the daemon's runtime directory")
    mcp_serve.set_defaults(handler=_cmd_mcp_serve)

    # Its flags (--help too) are the bench's own: see main().
    bench = commands.add_parser(
        "bench", add_help=False, help="measure throughput, latency, interrupts (--help for more)"
    )
    bench.set_defaults(handler=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
