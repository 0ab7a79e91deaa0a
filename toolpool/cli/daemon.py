"""``toolpool daemon [run|start|stop|status]``: the daemon itself (``run``, the default),
or the client side's control of one in the background.

Its flags come from the configuration's table (``toolpool.daemon.config_table``): one
flag of the setting's own name with dashes per setting, ``--limits-<name>`` per limit,
and ``--tool-limit TOOL.NAME=VALUE`` (SPEC E3). Every value stays text here: the
table's parsers read it, so a flag, a variable and the file share one parser and one
set of messages.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from toolpool.cli.messages import note


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    daemon = commands.add_parser("daemon", help="run the daemon, or start/stop/status it")
    daemon.add_argument(
        "action", nargs="?", default="run", choices=["run", "start", "stop", "status"]
    )
    add_daemon_flags(daemon)
    daemon.set_defaults(handler=run_command)


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
            note(f"{option_string} is deprecated: use {self.instead}")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])


# Older spellings of flags: (old flag, the setting it sets).
DEPRECATED_FLAGS = (("--tool-module", "tool_modules"), ("--sandbox-disable", "sandbox_disabled"))


def add_daemon_flags(parser: argparse.ArgumentParser) -> None:
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


def daemon_flags(args: argparse.Namespace) -> dict[str, Any]:
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


def daemon_argv(flags: dict[str, Any]) -> list[str]:
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


def run_command(args: argparse.Namespace) -> int:
    # The command line stands above both sides: ``run`` is the daemon itself, the
    # others are the client side's control of one in the background.
    from toolpool.client import control
    from toolpool.daemon.config import load_config

    flags = daemon_flags(args)
    # stop and status need only the runtime directory: no tool module is looked for.
    config = load_config(flags, check_modules=args.action in ("run", "start"))
    match args.action:
        case "start":
            return control.start_background(
                config.runtime_dir, daemon_argv(flags), log_file=config.log_file
            )
        case "stop":
            return control.stop_background(config.runtime_dir, drain_grace=config.drain_grace)
        case "status":
            return control.status_background(config.runtime_dir)
        case _:
            from toolpool.daemon.main import run_foreground

            return run_foreground(config)
