"""The daemon's configuration: defaults, then a TOML file, then environment variables,
then command-line flags — each stronger than the one before.

The TOML file is ``--config``, else ``$TOOLPOOL_CONFIG``, else
``$XDG_CONFIG_HOME/toolpool/config.toml`` (``~/.config/toolpool/config.toml``) when it
exists. Its keys are the field names below; ``[limits]`` holds the default per-call
limits and ``[tool_limits.<tool>]`` the operator's per-tool ones. Environment
variables are ``TOOLPOOL_<FIELD>`` (lists comma-separated) and
``TOOLPOOL_LIMITS_<LIMIT>``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError
from toolpool.protocol import CHUNK_BYTES
from toolpool.runtime import runtime_dir
from toolpool.sandbox.limits import Limits

MIN_CLIENT_BUFFER = 2 * CHUNK_BYTES


class ConfigError(ToolpoolError):
    """A configuration value that cannot be used; the message says where it came from."""


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    runtime_dir: Path = field(default_factory=runtime_dir)
    tcp: str | None = None  # "127.0.0.1:7777": also listen there
    curve_secret_key: Path | None = None  # the server's key file (zmq.auth format)
    curve_authorized_keys: Path | None = None  # a directory of clients' public keys
    tool_modules: tuple[str, ...] = ("toolpool.tools",)
    min_workers: int = 2
    max_workers: int = 4
    max_tool_concurrency: int = 10
    max_tool_errors: int = 3
    cancel_grace: float = 2.0
    drain_grace: float = 10.0  # seconds running turns get to finish on SIGTERM
    approval_timeout: float = 120.0
    max_calls_per_worker: int = 1000
    max_worker_rss: int = 512 * 1024 * 1024
    worker_cpus: float = 1.0
    sandbox_disabled: frozenset[str] = frozenset()
    require_sandbox: frozenset[str] = frozenset()  # refuse to start when one is off (X11)
    deny_read: tuple[str, ...] | None = None  # None: toolpool's default list (X9)
    env_passthrough: tuple[str, ...] = ()  # daemon variables commands may see (X9)
    private_run: bool = True  # /run and /var/run private inside commands (X2)
    limits: Limits = field(default_factory=Limits)
    tool_limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_level: str = "info"
    log_file: Path | None = None
    mcp_servers: Path | None = None  # an {"mcpServers": {...}} JSON file: servers to import
    # Floods (SPEC L5, L6; docs/operations.md).
    client_buffer_bytes: int = 64 * 1024 * 1024  # unacknowledged bytes out to one client
    client_stall_seconds: float = 120.0  # a held client not reading this long is let go
    max_sessions_per_client: int = 64
    max_sessions: int = 1024
    turn_output_chars: int = 400_000  # a turn's model-facing text (L4); 0: no budget

    def __post_init__(self) -> None:
        if self.client_buffer_bytes < MIN_CLIENT_BUFFER:
            raise ValueError(
                f"client_buffer_bytes must be at least {MIN_CLIENT_BUFFER} (two chunks), "
                f"not {self.client_buffer_bytes}"
            )
        if self.client_stall_seconds <= 0:
            raise ValueError("client_stall_seconds must be more than 0")
        if self.turn_output_chars < 0:
            raise ValueError("turn_output_chars must be 0 (no budget) or more")
        for name in ("max_sessions_per_client", "max_sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, frozenset | tuple):
                value = sorted(value) if isinstance(value, frozenset) else list(value)
            elif isinstance(value, Limits):
                value = value.to_dict()
            out[f.name] = value

        return out


def _path(v: Any) -> Path:
    return Path(os.path.expanduser(str(v)))


def _strings(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(s.strip() for s in v.split(",") if s.strip())
    if isinstance(v, list | tuple) and all(isinstance(s, str) for s in v):
        return tuple(v)
    raise ValueError("expected a list of strings")


def _bool_free_int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    return int(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _level(v: Any) -> str:
    level = str(v).lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ValueError("expected debug, info, warning or error")
    return level


_PARSE: dict[str, Callable[[Any], Any]] = {
    "runtime_dir": _path,
    "tcp": str,
    "curve_secret_key": _path,
    "curve_authorized_keys": _path,
    "tool_modules": _strings,
    "min_workers": _bool_free_int,
    "max_workers": _bool_free_int,
    "max_tool_concurrency": _bool_free_int,
    "max_tool_errors": _bool_free_int,
    "cancel_grace": float,
    "drain_grace": float,
    "approval_timeout": float,
    "max_calls_per_worker": _bool_free_int,
    "max_worker_rss": _bool_free_int,
    "worker_cpus": float,
    "sandbox_disabled": lambda v: frozenset(_strings(v)),
    "require_sandbox": lambda v: frozenset(_strings(v)),
    "deny_read": _strings,
    "env_passthrough": _strings,
    "private_run": _bool,
    "log_level": _level,
    "log_file": _path,
    "mcp_servers": _path,
    "client_buffer_bytes": _bool_free_int,
    "client_stall_seconds": float,
    "max_sessions_per_client": _bool_free_int,
    "max_sessions": _bool_free_int,
    "turn_output_chars": _bool_free_int,
}
_LIMIT_NAMES = {f.name for f in dataclasses.fields(Limits)}


def default_config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "toolpool" / "config.toml"


def load_config(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> DaemonConfig:
    """Defaults < TOML file < environment < flags (None flags are not given)."""
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    values: dict[str, Any] = {}
    limits = Limits()
    tool_limits: dict[str, dict[str, Any]] = {}

    path = flags.pop("config", None) or env.get("TOOLPOOL_CONFIG")
    explicit = path is not None
    toml_path = _path(path) if path else default_config_path(env)
    if toml_path.exists():
        try:
            table = tomllib.loads(toml_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{toml_path}: {exc}") from exc
        limits = _limits(limits, table.pop("limits", {}), f"{toml_path} [limits]")
        for tool, overrides in table.pop("tool_limits", {}).items():
            _limits(Limits(), overrides, f"{toml_path} [tool_limits.{tool}]")  # check only
            tool_limits[tool] = dict(overrides)
        values.update(_layer(table, str(toml_path)))
    elif explicit:
        raise ConfigError(f"no configuration file at {toml_path}")

    from_env = {
        name: env[f"TOOLPOOL_{name.upper()}"]
        for name in _PARSE
        if f"TOOLPOOL_{name.upper()}" in env
    }
    values.update(_layer(from_env, "environment (TOOLPOOL_*)"))
    env_limits = {
        name: env[f"TOOLPOOL_LIMITS_{name.upper()}"]
        for name in _LIMIT_NAMES
        if f"TOOLPOOL_LIMITS_{name.upper()}" in env
    }
    limits = _limits(limits, env_limits, "environment (TOOLPOOL_LIMITS_*)")
    values.update(_layer(flags, "command line"))
    try:
        return DaemonConfig(**values, limits=limits, tool_limits=tool_limits)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def _layer(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for key, value in raw.items():
        parse = _PARSE.get(key)
        if parse is None:
            known = ", ".join(sorted([*_PARSE, "limits", "tool_limits"]))
            raise ConfigError(f"{source}: unknown setting {key!r} (known: {known})")
        try:
            parsed[key] = parse(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {key} = {value!r}: {exc}") from None
    return parsed


def _limits(base: Limits, raw: Mapping[str, Any], source: str) -> Limits:
    converted: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in _LIMIT_NAMES:
            raise ConfigError(f"{source}: unknown limit {name!r} (known: {sorted(_LIMIT_NAMES)})")
        default = getattr(base, name)
        try:
            if isinstance(default, bool):
                converted[name] = (
                    value
                    if isinstance(value, bool)
                    else str(value).lower() in ("1", "true", "yes", "on")
                )
            else:
                converted[name] = type(default)(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {name} = {value!r}: {exc}") from None
    try:
        return base.merged(converted)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
