"""The ``toolpool`` command.

toolpool daemon [run|start|stop|status] [flags]   the daemon (foreground by default)
toolpool demo [--in-process]                      one realistic turn, events live
toolpool call NAME JSON [NAME JSON …]            calls, one turn each, in one session
toolpool tools [--format openai|anthropic|…] [--profile claude-code|codex|openai|…]
                                                  the tools' definitions
toolpool status [--json]                          workers, queue, sessions, sandbox
toolpool doctor                                   the sandbox this machine offers
toolpool mcp serve [--workspace DIR] [--gate …]    the tools, to an MCP client over stdio
toolpool bench [--quick] [--out DIR] [--only …]   the bench (from a source checkout)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

import toolpool
from toolpool.client.control import ExitCode
from toolpool.errors import ToolpoolError

FORMATS = ("toolpool", "openai", "openai-responses", "anthropic", "gemini", "langchain", "mcp")
PROFILES = ("toolpool", "claude-code", "codex", "openai", "anthropic")  # profiles.PROFILES


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


# --- daemon -----------------------------------------------------------------------------
#
# Its flags come from the configuration's table (toolpool/daemon/config.py): one flag of
# the setting's own name with dashes per setting, ``--limits-<name>`` per limit, and
# ``--tool-limit TOOL.NAME=VALUE``. Every value stays text here: the table's parsers
# read it, so a flag, a variable and the file share one parser and one set of messages.


class _Deprecated(argparse.Action):
    """An old spelling of a list flag: still taken (appended), with a note on stderr."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, instead: str, help: str
    ) -> None:
        super().__init__(option_strings, dest, metavar="NAME", help=help)
        self.instead = instead
        self.noted = False

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if not self.noted:
            self.noted = True
            _note(f"{option_string} is deprecated: use {self.instead}")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])


# Older spellings of flags: (old flag, the setting it sets).
DEPRECATED_FLAGS = (("--tool-module", "tool_modules"), ("--sandbox-disable", "sandbox_disabled"))


def _add_daemon_flags(parser: argparse.ArgumentParser) -> None:
    from toolpool.daemon.config_table import LIMIT_SETTINGS, SETTINGS
    from toolpool.daemon.value_kinds import Boolean, Names

    parser.add_argument("--config", help="TOML configuration file")
    for setting in (*SETTINGS, *LIMIT_SETTINGS):
        options: dict[str, Any] = {
            "metavar": setting.kind.metavar,
            "help": f"{setting.doc}: {setting.kind.allowed}".replace("%", "%%"),
        }
        if isinstance(setting.kind, Names):
            options["action"] = "append"  # repeated: the lists join
        elif isinstance(setting.kind, Boolean):
            options.update(nargs="?", const="true")  # --private-run alone is true
        dest = setting.flag.removeprefix("--").replace("-", "_")
        parser.add_argument(setting.flag, dest=dest, **options)
    parser.add_argument(
        "--tool-limit",
        action="append",
        metavar="TOOL.LIMIT=VALUE",
        help="a per-tool limit, as [tool_limits.TOOL] in the file (repeatable)",
    )
    parser.add_argument(
        "--network-resolve",
        action="append",
        metavar="NAME=IP[:PORT]",
        help="the egress proxy sends NAME there, as [network_resolve] in the file (repeatable)",
    )
    for flag, name in DEPRECATED_FLAGS:
        dashed = "--" + name.replace("_", "-")
        parser.add_argument(
            flag,
            dest=name,
            action=_Deprecated,
            instead=f"{dashed} A,B",
            help=f"deprecated: {dashed}",
        )


def _daemon_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as ``load_config`` takes them (None: not given)."""
    from toolpool.daemon.config_table import LIMIT_SETTINGS, SETTINGS

    flags: dict[str, Any] = {
        "config": args.config,
        "tool_limit": args.tool_limit,
        "network_resolve": args.network_resolve,
    }
    for setting in SETTINGS:
        value = getattr(args, setting.name)
        flags[setting.name] = ",".join(value) if isinstance(value, list) else value
    limits = {s.name: getattr(args, f"limits_{s.name}") for s in LIMIT_SETTINGS}
    flags["limits"] = {name: value for name, value in limits.items() if value is not None}
    return flags


def _daemon_argv(flags: dict[str, Any]) -> list[str]:
    """The flags again, in their current spelling, for the background daemon."""
    from toolpool.daemon.config_table import LIMIT_SETTINGS, SETTINGS

    argv: list[str] = ["run"]
    if flags.get("config") is not None:
        argv.append(f"--config={flags['config']}")
    for setting in SETTINGS:
        if flags.get(setting.name) is not None:
            argv.append(f"{setting.flag}={flags[setting.name]}")
    for setting in LIMIT_SETTINGS:
        if setting.name in flags.get("limits", {}):
            argv.append(f"{setting.flag}={flags['limits'][setting.name]}")
    argv += [f"--tool-limit={item}" for item in flags.get("tool_limit") or ()]
    argv += [f"--network-resolve={item}" for item in flags.get("network_resolve") or ()]
    return argv


def _cmd_daemon(args: argparse.Namespace) -> int:
    # The command line stands above both sides: ``run`` is the daemon itself, the
    # others are the client side's control of one in the background.
    from toolpool.client import control
    from toolpool.daemon.config import load_config

    flags = _daemon_flags(args)
    # stop and status need only the runtime directory: no tool module is looked for.
    config = load_config(flags, check_modules=args.action in ("run", "start"))
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
    from toolpool.demo import run_demo

    results = run_demo(
        _console(), in_process=args.in_process, endpoint=args.endpoint, runtime_dir=args.runtime_dir
    )
    return ExitCode.OK if results and not any(r.is_error for r in results) else ExitCode.FAILED


def _parse_calls(words: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
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


def _cmd_call(args: argparse.Namespace) -> int:
    """Each call is a turn of its own, one after another, in one session: a read
    stamps the file for the edit after it (F3)."""
    from toolpool.console import render_event
    from toolpool.models import ToolCall

    calls = _parse_calls(args.calls)
    if not Path(args.workspace).is_dir():  # a usage error, before any daemon is asked
        raise UsageError(f"call: --workspace {args.workspace}: no such directory")
    console = _console()
    results = []
    with _client(args) as client, client.session(args.workspace) as session:
        for number, (name, arguments) in enumerate(calls, 1):
            turn = session.submit([ToolCall(f"call-{number}", name, arguments)])
            for event in turn:
                render_event(event, console)
            (result,) = turn.results()
            results.append(result)
            if args.print_result:
                print(result.text, flush=True)
    return ExitCode.FAILED if any(r.is_error for r in results) else ExitCode.OK


def _cmd_tools(args: argparse.Namespace) -> int:
    """The daemon's tools when one answers (it knows the tools of its MCP servers too);
    else the configured tool modules', loaded here."""
    from toolpool.client import Client, DaemonUnavailable
    from toolpool.client.control import left_out

    definitions = None
    try:
        with Client(args.endpoint, runtime_dir=args.runtime_dir) as client:
            definitions = client.tools(args.format, args.profile)
            for line in left_out(client.status()):  # not listed: say why (E9)
                _note(line)
    except DaemonUnavailable:
        if args.endpoint is not None or os.environ.get("TOOLPOOL_ENDPOINT"):
            raise  # that daemon was asked for by name
    if definitions is None:
        definitions = _configured_tools(args)
    print(json.dumps(definitions, indent=2, ensure_ascii=False))
    return ExitCode.OK


def _configured_tools(args: argparse.Namespace) -> list[dict[str, Any]]:
    from toolpool.daemon.config import load_config, tool_registry
    from toolpool.providers import definitions

    flags = {"config": args.config, "runtime_dir": args.runtime_dir}
    if args.tool_modules:
        flags["tool_modules"] = ",".join(args.tool_modules)
    config = load_config(flags)
    from toolpool.profiles import lists

    specs = [t for t in tool_registry(config.tool_modules) if lists(args.profile, t.name)]
    if config.mcp_servers is not None:
        _note(f"no daemon runs: the tools of the MCP servers of {config.mcp_servers} are not here")
    if args.format == "toolpool":
        return [spec.definition() for spec in specs]
    return definitions(specs, args.format)


def _cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.status()
    if args.json:
        print(json.dumps(status, indent=2))
        return ExitCode.OK
    from toolpool.cli_reports import print_status

    print_status(status, _console())
    return ExitCode.OK


def _cmd_audit(args: argparse.Namespace) -> int:
    """The audit log's records; the file is ``--file``, else the configured one, else
    the one the last daemon started in the runtime dir kept."""
    from toolpool.client.audit import print_audit

    path = args.file
    if path is None:
        from toolpool.daemon.config import load_config
        from toolpool.runtime import last_audit_log

        flags = {"config": args.config, "runtime_dir": args.runtime_dir}
        config = load_config(flags, check_modules=False)
        # The configured log, else the one the last daemon of the runtime dir kept (a
        # daemon started with --audit-log says where it is).
        path = config.audit_log or last_audit_log(config.runtime_dir)
        if path is None:
            raise UsageError(
                "audit: no audit log: set audit_log, or say --file PATH (no daemon was "
                f"started with one in {config.runtime_dir})"
            )
    print_audit(path, session=args.session, follow=args.follow, raw=args.json)
    return ExitCode.OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Print which sandbox mechanisms this machine offers, and what is off and why."""
    from toolpool.cli_reports import doctor

    return ExitCode.OK if doctor(_console()) else ExitCode.FAILED


def _cmd_mcp_serve(args: argparse.Namespace) -> int:
    """Serve the daemon's tools over stdio; starts a daemon when none runs. Only MCP
    goes to stdout: everything else is written to stderr."""
    from toolpool.daemon.config import load_config
    from toolpool.mcp import McpUnavailable, require_sdk

    try:
        require_sdk()
    except McpUnavailable as exc:
        raise UsageError(f"mcp serve: {exc}") from None
    config = load_config({"runtime_dir": args.runtime_dir}, check_modules=False)
    options = _mcp_session_options(args)
    from toolpool.client.mcp_serve import serve_stdio

    return serve_stdio(
        Path(args.workspace),
        config.runtime_dir,
        log_file=config.log_file,
        drain_grace=config.drain_grace,
        options=options,
    )


def _mcp_session_options(args: argparse.Namespace) -> dict[str, Any]:
    """The session options ``mcp serve``'s flags give, checked as the daemon checks
    them (a bad one is a usage error naming it)."""
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


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run ``bench/run.py`` of the source checkout this package is imported from, in
    a process of its own (the bench starts and stops daemons, and plots)."""
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


# --- the parser ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with toolpool's message prefix and exit code for a usage error."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        _error(message)
        sys.exit(ExitCode.USAGE)


def _client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help="the daemon's endpoint (default: this user's daemon)")
    parser.add_argument("--runtime-dir", type=Path, help="the daemon's runtime directory")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="toolpool",
        description="A tool-execution engine for AI coding agents.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"toolpool {toolpool.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    daemon = commands.add_parser("daemon", help="run the daemon, or start/stop/status it")
    daemon.add_argument(
        "action", nargs="?", default="run", choices=["run", "start", "stop", "status"]
    )
    _add_daemon_flags(daemon)
    daemon.set_defaults(handler=_cmd_daemon)

    demo = commands.add_parser("demo", help="one realistic turn with its events shown live")
    demo.add_argument(
        "--in-process", action="store_true", help="run without a daemon (tools in-process)"
    )
    _client_flags(demo)
    demo.set_defaults(handler=_cmd_demo)

    call = commands.add_parser(
        "call",
        help="run calls through the daemon, one turn each, in one session",
        description="NAME JSON [NAME JSON …]: each call a turn of its own, one after "
        "another, in one session (a read stamps the file for an edit after it).",
    )
    call.add_argument("calls", nargs="+", metavar="NAME JSON", help="a tool and its arguments")
    call.add_argument("--workspace", default=".", help="the session's workspace (default: .)")
    call.add_argument("--print-result", action="store_true", help="print each result's text")
    _client_flags(call)
    call.set_defaults(handler=_cmd_call)

    tools = commands.add_parser(
        "tools", help="the tools' definitions (the daemon's, else the configured ones)"
    )
    tools.add_argument("--format", choices=FORMATS, default="toolpool")
    tools.add_argument(
        "--profile",
        choices=PROFILES,
        default="toolpool",
        help="the tools of this tool profile (claude-code: Claude Code's, codex: Codex CLI's, "
        "openai and anthropic: the tools those providers' APIs define)",
    )
    tools.add_argument("--config", help="TOML configuration file (when no daemon runs)")
    tools.add_argument("--tool-modules", action="append", metavar="A,B", help="when no daemon runs")
    _client_flags(tools)
    tools.set_defaults(handler=_cmd_tools)

    status = commands.add_parser("status", help="the daemon's workers, queue and sessions")
    status.add_argument("--json", action="store_true")
    _client_flags(status)
    status.set_defaults(handler=_cmd_status)

    doctor = commands.add_parser("doctor", help="show the sandbox profile this machine offers")
    doctor.set_defaults(handler=_cmd_doctor)

    audit = commands.add_parser("audit", help="the audit log: one line per call (no daemon needed)")
    audit.add_argument("--file", type=Path, help="the log (default: the audit_log setting)")
    audit.add_argument("--config", help="TOML configuration file, for its audit_log")
    audit.add_argument(
        "--runtime-dir", type=Path, help="the daemon's runtime directory, for the log it kept"
    )
    audit.add_argument("--session", help="only this session's calls")
    audit.add_argument("--follow", "-f", action="store_true", help="wait for new lines")
    audit.add_argument("--json", action="store_true", help="the records as JSON lines")
    audit.set_defaults(handler=_cmd_audit)

    mcp = commands.add_parser("mcp", help="toolpool and the Model Context Protocol")
    mcp_commands = mcp.add_subparsers(dest="mcp_command", metavar="COMMAND", required=True)
    mcp_serve = mcp_commands.add_parser(
        "serve", help="serve the daemon's tools to an MCP client over stdio"
    )
    mcp_serve.add_argument("--workspace", default=".", help="the session's workspace (default: .)")
    mcp_serve.add_argument("--runtime-dir", type=Path, help="the daemon's runtime directory")
    mcp_serve.add_argument(
        "--gate",
        choices=("allow", "ask", "policy"),
        help="the session's gate: ask asks the MCP client's user (elicitation) before every "
        "call that is not read-only; policy follows --policy (default: allow)",
    )
    mcp_serve.add_argument(
        "--policy", metavar="JSON|FILE", help="the gate's rules: a JSON list, or a file holding one"
    )
    mcp_serve.add_argument(
        "--tool-profile", choices=PROFILES, help="whose tool names the session offers"
    )
    mcp_serve.add_argument(
        "--allow-network", action="store_true", help="the session's commands may reach out"
    )
    mcp_serve.add_argument(
        "--limit",
        action="append",
        metavar="NAME=VALUE",
        help="a per-call limit of the session (wall_seconds=30, memory_bytes=…; repeatable)",
    )
    mcp_serve.add_argument(
        "--approval-timeout", type=float, metavar="SECONDS", help="how long a question waits"
    )
    mcp_serve.set_defaults(handler=_cmd_mcp_serve)

    # Its flags (--help too) are the bench's own: see main().
    bench = commands.add_parser(
        "bench", add_help=False, help="measure throughput, latency, interrupts (--help for more)"
    )
    bench.set_defaults(handler=_cmd_bench)
    return parser


# --- messages and exit codes --------------------------------------------------------------

EXIT_CODES = """exit codes, the same for every command:
  0  done (and no tool result was an error)
  1  failed: a tool result was an error, the daemon could not start or stop, or
     does not answer (daemon status), the confined command fails (doctor)
  2  usage or configuration error: a bad flag, setting, file or argument
  3  no daemon runs (or answers at the endpoint given)
  4  an internal error (a bug): TOOLPOOL_DEBUG=1 shows its traceback"""


class UsageError(ToolpoolError):
    """What was asked cannot be done as asked (exit code 2)."""


def _error(message: object) -> None:
    print(f"toolpool: error: {message}", file=sys.stderr, flush=True)


def _note(message: object) -> None:
    print(f"toolpool: note: {message}", file=sys.stderr, flush=True)


def _debug() -> bool:
    return os.environ.get("TOOLPOOL_DEBUG", "").lower() not in ("", "0", "false", "no")


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
        usage = (ConfigError, PathSettingError, UsageError)
        code, message = _exit_for(exc, usage, DaemonUnavailable)
        if _debug():
            traceback.print_exc()
        _error(message)
        return code


def _exit_for(
    exc: Exception, usage: tuple[type[Exception], ...], absent: type[Exception]
) -> tuple[ExitCode, str]:
    """The exit code of an exception that reached the command, and its one line."""
    if isinstance(exc, usage):
        return ExitCode.USAGE, str(exc)
    if isinstance(exc, absent):
        return ExitCode.NOT_RUNNING, str(exc)
    if isinstance(exc, ToolpoolError | OSError):
        return ExitCode.FAILED, str(exc) or type(exc).__name__
    hint = "" if _debug() else " (TOOLPOOL_DEBUG=1 shows the traceback)"
    return ExitCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}{hint}"


if __name__ == "__main__":
    sys.exit(main())
