"""Where the daemon's settings come from: the TOML file, then the environment, then
the flags, each stronger than the one before (SPEC E2, E3).

The file is ``--config``, else ``$TOOLPOOL_CONFIG``, else
``$XDG_CONFIG_HOME/toolpool/config.toml`` (``~/.config/toolpool/config.toml``) when
it exists. Each value is read through its row of the table (``config_table.py``) and
kept with the source that set it, for the messages of the checks that judge the
settings together (``config.py``).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from toolpool.daemon.config_table import (
    BY_NAME,
    LIMIT_SETTINGS,
    LIMITS_BY_NAME,
    SETTINGS,
    ConfigError,
)
from toolpool.egress.addresses import Pin, PinError, parse_pin

# The file's tables, each with a reader of its own (the rest are settings).
TABLES = ("limits", "tool_limits", "network_resolve")


def default_config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "toolpool" / "config.toml"


def read_layers(flags: Mapping[str, Any], env: Mapping[str, str]) -> Layers:
    """The values of the file, the environment and ``flags`` (the ``load_config``
    flags without the None ones), the stronger over the weaker."""
    flags = dict(flags)
    layers = Layers()
    source = "flag --config" if "config" in flags else "environment TOOLPOOL_CONFIG"
    path = flags.pop("config", None) or env.get("TOOLPOOL_CONFIG")
    toml_path = Path(os.path.expanduser(str(path))) if path else default_config_path(env)
    if toml_path.is_file():
        layers.file(toml_path)
    elif path:
        raise ConfigError(f"no configuration file at {toml_path} ({source})")
    layers.environment(env)
    layers.flags(flags)
    return layers


def _unknown(what: str, key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {what} {key!r} ({hint}known: {', '.join(sorted(known))})"


class Layers:
    """The values chosen so far, each with the source that set it."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.limits: dict[str, Any] = {}
        self.tool_limits: dict[str, dict[str, Any]] = {}
        self.network_resolve: dict[str, Pin] = {}

    def set(self, name: str, value: Any, source: str, *, text: bool) -> None:
        setting = BY_NAME.get(name)
        if setting is None:
            raise ConfigError(f"{source}: " + _unknown("setting", name, [*BY_NAME, *TABLES]))
        self.values[name] = setting.parse(value, source, text=text)
        self.sources[name] = source

    def limit(self, into: dict[str, Any], name: Any, value: Any, source: str, text: bool) -> None:
        setting = LIMITS_BY_NAME.get(name)
        if setting is None:
            raise ConfigError(f"{source}: " + _unknown("limit", str(name), LIMITS_BY_NAME))
        into[name] = setting.parse(value, source, text=text)

    def file(self, path: Path) -> None:
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        limits = table.pop("limits", {})
        if not isinstance(limits, dict):
            raise ConfigError(f"{path}: limits must be a table ([limits])")
        for name, value in limits.items():
            self.limit(self.limits, name, value, f"{path} [limits]", text=False)
        tools = table.pop("tool_limits", {})
        if not isinstance(tools, dict) or not all(isinstance(t, dict) for t in tools.values()):
            raise ConfigError(f"{path}: tool_limits must hold tables ([tool_limits.TOOL])")
        for tool, overrides in tools.items():
            into = self.tool_limits.setdefault(tool, {})
            for name, value in overrides.items():
                self.limit(into, name, value, f"{path} [tool_limits.{tool}]", text=False)
        pins = table.pop("network_resolve", {})
        if not isinstance(pins, dict):
            raise ConfigError(f'{path}: network_resolve must be a table ("NAME" = "IP:PORT")')
        for name, target in pins.items():
            self.pin(name, target, f"{path} [network_resolve]")
        for name, value in table.items():
            self.set(name, value, str(path), text=False)

    def pin(self, name: Any, target: Any, source: str) -> None:
        try:
            key, pin = parse_pin(name, target)
        except PinError as exc:
            raise ConfigError(f"{source}: network_resolve {exc}") from None
        self.network_resolve[key] = pin

    def pins(self, items: Iterable[str], source: str) -> None:
        """``NAME=IP[:PORT]`` items (the variable's, comma-separated; the flags')."""
        for item in items:
            name, sep, target = item.strip().partition("=")
            if not sep:
                raise ConfigError(f"{source}: {item!r}: expected NAME=IP or NAME=IP:PORT")
            self.pin(name.strip(), target.strip(), source)

    def environment(self, env: Mapping[str, str]) -> None:
        text = env.get("TOOLPOOL_NETWORK_RESOLVE", "")
        if text.strip():
            self.pins(text.split(","), "environment TOOLPOOL_NETWORK_RESOLVE")
        for setting in SETTINGS:
            if setting.env in env:
                self.set(setting.name, env[setting.env], f"environment {setting.env}", text=True)
        for setting in LIMIT_SETTINGS:
            if setting.env in env:
                source = f"environment {setting.env}"
                self.limit(self.limits, setting.name, env[setting.env], source, text=True)

    def flags(self, flags: Mapping[str, Any]) -> None:
        for name, value in flags.items():
            if name == "limits":
                for limit, text in value.items():
                    flag = LIMITS_BY_NAME[limit].flag if limit in LIMITS_BY_NAME else "--limits"
                    self.limit(self.limits, limit, text, f"flag {flag}", isinstance(text, str))
            elif name == "tool_limit":
                for item in value:
                    self.tool_limit(item)
            elif name == "network_resolve":
                for item in value:
                    self.pins([item], "flag --network-resolve")
            else:
                flag = BY_NAME[name].flag if name in BY_NAME else "--" + name
                self.set(name, value, f"flag {flag}", text=isinstance(value, str))

    def tool_limit(self, item: str) -> None:
        """``--tool-limit TOOL.NAME=VALUE``."""
        match = re.fullmatch(r"([^.=\s]+)\.([^=\s]+)=(.*)", item.strip(), re.DOTALL)
        if match is None or not (match[1] + match[2]).isprintable():
            raise ConfigError(
                f"flag --tool-limit {item!r}: expected TOOL.LIMIT=VALUE (bash.wall_seconds=600)"
            )
        tool, name, text = match.groups()
        # The value is shown quoted by ``limit``; the source names the tool and the limit.
        source = f"flag --tool-limit {tool}.{name}"
        self.limit(self.tool_limits.setdefault(tool, {}), name, text, source, text=True)
