"""The daemon's configuration: defaults, then a TOML file, then environment variables,
then command-line flags — each stronger than the one before (SPEC E2, E3).

The TOML file is ``--config``, else ``$TOOLPOOL_CONFIG``, else
``$XDG_CONFIG_HOME/toolpool/config.toml`` (``~/.config/toolpool/config.toml``) when it
exists. Its keys are the settings below; ``[limits]`` holds the default per-call
limits and ``[tool_limits.<tool>]`` the operator's per-tool ones. Environment
variables are ``TOOLPOOL_<SETTING>`` (lists comma-separated) and
``TOOLPOOL_LIMITS_<LIMIT>``; flags are ``--<setting-with-dashes>``,
``--limits-<limit>`` and ``--tool-limit TOOL.LIMIT=VALUE``. ``[network_resolve]``
pins names for the egress proxy (``"NAME" = "IP[:PORT]"``; SPEC N10), as do
``TOOLPOOL_NETWORK_RESOLVE`` (``NAME=IP[:PORT],…``) and ``--network-resolve
NAME=IP[:PORT]`` (repeatable).

One table (``SETTINGS``, ``LIMIT_SETTINGS``) describes every setting once: its kind
(type, range or choices), its documentation, its variable and its flag. The three
sources share its parsers, and so its messages: a bad value is a ``ConfigError`` of
one line naming the setting, where it came from and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.daemon.value_kinds import (
    Address,
    Boolean,
    Choice,
    Integer,
    Kind,
    Names,
    Number,
    PathKind,
    Refused,
)
from toolpool.egress.addresses import Pin, PinError, parse_pin
from toolpool.errors import ToolpoolError
from toolpool.protocol import CHUNK_BYTES
from toolpool.registry import ToolRegistry, tools_in_module
from toolpool.runtime import runtime_dir
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import MECHANISMS
from toolpool.session_options import DEFAULT_LAYER_BYTES

MIN_CLIENT_BUFFER = 2 * CHUNK_BYTES
NETWORK_CEILINGS = ("off", "policy", "open")  # by rank: session_options.network_rank
DEFAULT = "default"  # the source of a value nobody set


class ConfigError(ToolpoolError, ValueError):
    """A configuration value that cannot be used; the message says where it came from."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: where it is read from, what it may be, what it does."""

    name: str  # the DaemonConfig field, the TOML key, or the [limits] key
    kind: Kind
    doc: str
    env: str  # TOOLPOOL_MAX_WORKERS, TOOLPOOL_LIMITS_WALL_SECONDS
    flag: str  # --max-workers, --limits-wall-seconds

    def parse(self, value: Any, source: str, *, text: bool) -> Any:
        """The value, or a ConfigError naming this setting, ``source`` and what is allowed."""
        try:
            return self.kind.parse(value, text=text)
        except Refused as exc:
            raise ConfigError(f"{source}: {self.name} = {value!r}: {exc}") from None


def _setting(name: str, kind: Kind, doc: str) -> Setting:
    return Setting(name, kind, doc, f"TOOLPOOL_{name.upper()}", "--" + name.replace("_", "-"))


_MODULES = Names("module names or .py paths")
_MECHANISMS_OFF = tuple(m for m in MECHANISMS if m != "rlimits")  # rlimits cannot be off
_PATHS = Names("paths")

SETTINGS: tuple[Setting, ...] = (
    _setting("runtime_dir", PathKind(), "private directory for the socket, pid and logs"),
    _setting("tcp", Address(), "also listen on HOST:PORT (non-loopback needs CURVE keys)"),
    _setting("curve_secret_key", PathKind(), "the server's CURVE key file (zmq.auth format)"),
    _setting("curve_authorized_keys", PathKind(), "a directory of the clients' public keys"),
    _setting("tool_modules", _MODULES, "modules whose tools the daemon offers"),
    _setting(
        "session_tools",
        Choice(("local", "any", "off")),
        "who may ship tools of their program with a session (A5): clients on the Unix "
        "socket (local), TCP clients too (any), none (off)",
    ),
    _setting("min_workers", Integer(0), "pre-started workers"),
    _setting("max_workers", Integer(1), "the most workers; past them, calls queue"),
    _setting("max_tool_concurrency", Integer(1), "safe calls of a turn run side by side"),
    _setting("max_tool_errors", Integer(0), "consecutive failures that disable a tool; 0: never"),
    _setting("cancel_grace", Number(0), "seconds a cancelled call has before its worker is killed"),
    _setting("drain_grace", Number(0), "seconds running turns get on SIGTERM"),
    _setting("approval_timeout", Number(0, above=True), "seconds an approval waits"),
    _setting("max_calls_per_worker", Integer(1), "calls a worker runs before it is replaced"),
    _setting("max_worker_rss", Integer(1, "BYTES"), "bytes; a worker above it is recycled"),
    _setting("hold_calls", Boolean(), "a busy worker may hold the next read-only call (H4)"),
    _setting("worker_calls_per_frame", Integer(1), "at max_workers, calls a frame and held (H4)"),
    _setting("worker_cpus", Number(0, above=True, metavar="CPUS"), "each worker's CPU quota"),
    _setting(
        "sandbox_disabled",
        Names("sandbox mechanisms", _MECHANISMS_OFF, unique=True),
        "sandbox mechanisms to switch off",
    ),
    _setting(
        "require_sandbox",
        Names("sandbox mechanisms", MECHANISMS, unique=True),
        "sandbox mechanisms that must be on, or the daemon does not start",
    ),
    _setting("deny_read", _PATHS, "paths hidden from commands and file tools"),
    _setting(
        "env_passthrough",
        Names("environment variable names", pattern=r"[A-Za-z_][A-Za-z0-9_]*"),
        "daemon environment variables commands may see",
    ),
    _setting("private_run", Boolean(), "/run and /var/run private inside commands"),
    _setting("log_level", Choice(("debug", "info", "warning", "error")), "what is logged"),
    _setting("log_file", PathKind(), "the log's file (default: stderr)"),
    _setting("mcp_servers", PathKind(), 'MCP servers to import ({"mcpServers": …} JSON)'),
    _setting("audit_log", PathKind(), "a JSON line per call goes to this file (R1)"),
    _setting("audit_arguments", Boolean(), "the audit log holds the arguments, not only a hash"),
    _setting("audit_max_bytes", Integer(4096, "BYTES"), "the audit log is rotated at this size"),
    _setting("audit_backups", Integer(0), "rotated audit logs kept (PATH.1 … PATH.N)"),
    _setting(
        "client_buffer_bytes",
        Integer(MIN_CLIENT_BUFFER, "BYTES"),
        "bytes out to one client unread; past them, frames wait on disk",
    ),
    _setting(
        "client_stall_seconds",
        Number(0, above=True),
        "a client with a full buffer that reads nothing this long is let go",
    ),
    _setting("max_sessions_per_client", Integer(1), "open sessions one client may hold"),
    _setting("max_sessions", Integer(1), "open sessions in the daemon"),
    _setting(
        "turn_output_chars",
        Integer(0, "CHARS"),
        "model-facing text of one turn's results; 0: no budget",
    ),
    _setting(
        "background_wall_seconds",
        Number(0, above=True),
        "seconds a background shell (bash run_in_background) may run",
    ),
    _setting("max_background_shells_per_client", Integer(1), "shells one client runs at once"),
    _setting("max_background_shells", Integer(1), "background shells the daemon runs at once"),
    _setting(
        "layer_bytes",
        Integer(1024 * 1024, "BYTES"),
        "a session's writable layers, unless it says (overlay and image roots, overlay workspaces)",
    ),
    _setting("image_dirs", _PATHS, "where session image roots may lie (empty: images off)"),
    _setting("image_cache", PathKind(), "the unpacked image layers' cache directory"),
    _setting("image_cache_bytes", Integer(1024 * 1024, "BYTES"), "the image cache's bound"),
    _setting(
        "network",
        Choice(NETWORK_CEILINGS),
        "the most a session's network may be: off, a policy of names, or open (N1)",
    ),
)

_LIMIT_DOCS = {
    "wall_seconds": "seconds a call may run",
    "cpu_seconds": "CPU seconds of a call (all its processes)",
    "memory_bytes": "bytes of memory of a call",
    "processes": "processes a call may run at once",
    "file_size_bytes": "the largest file a call may write",
    "output_bytes": "bytes of result and printed output",
    "open_files": "open files of each process",
    "tmp_bytes": "the size of a command's private /tmp",
    "spill_bytes": "command output kept in the spill file",
    "network": "commands may reach the network",
}


def _limit_setting(f: dataclasses.Field[Any]) -> Setting:
    default = f.default
    kind: Kind
    if isinstance(default, bool):
        kind = Boolean()
    elif isinstance(default, float):
        kind = Number(0, above=True)
    else:
        kind = Integer(1, "BYTES" if f.name.endswith("_bytes") else "N")
    dashed = f.name.replace("_", "-")
    return Setting(
        f.name,
        kind,
        _LIMIT_DOCS.get(f.name, "a per-call limit"),
        f"TOOLPOOL_LIMITS_{f.name.upper()}",
        f"--limits-{dashed}",
    )


LIMIT_SETTINGS: tuple[Setting, ...] = tuple(_limit_setting(f) for f in dataclasses.fields(Limits))
_BY_NAME = {s.name: s for s in SETTINGS}
_LIMITS_BY_NAME = {s.name: s for s in LIMIT_SETTINGS}


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    runtime_dir: Path = field(default_factory=runtime_dir)
    tcp: str | None = None  # "127.0.0.1:7777": also listen there
    curve_secret_key: Path | None = None  # the server's key file (zmq.auth format)
    curve_authorized_keys: Path | None = None  # a directory of clients' public keys
    tool_modules: tuple[str, ...] = ("toolpool.tools",)
    # Who may ship tools with a session (SPEC A6): the Unix socket's clients, the
    # daemon's own user; "any": TCP clients too; "off": none.
    session_tools: str = "local"
    min_workers: int = 2
    max_workers: int = 4
    max_tool_concurrency: int = 10
    max_tool_errors: int = 3
    cancel_grace: float = 2.0
    drain_grace: float = 10.0  # seconds running turns get to finish on SIGTERM
    approval_timeout: float = 120.0
    max_calls_per_worker: int = 1000
    max_worker_rss: int = 512 * 1024 * 1024
    hold_calls: bool = True  # at max_workers, a busy worker holds the next read-only call
    worker_calls_per_frame: int = 8  # at max_workers: calls per worker frame, held per worker
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
    # The record of every call (SPEC R1; docs/operations.md).
    audit_log: Path | None = None
    audit_arguments: bool = False  # the arguments themselves, not only their hash
    audit_max_bytes: int = 64 * 1024 * 1024
    audit_backups: int = 5
    # Floods (SPEC L5, L6; docs/operations.md).
    client_buffer_bytes: int = 64 * 1024 * 1024  # unacknowledged bytes out to one client
    client_stall_seconds: float = 120.0  # a held client not reading this long is let go
    max_sessions_per_client: int = 64
    max_sessions: int = 1024
    turn_output_chars: int = 400_000  # a turn's model-facing text (L4); 0: no budget
    background_wall_seconds: float = 3600.0  # a background shell's life (docs/workers.md)
    max_background_shells_per_client: int = 32  # running at once (L9; 16 per session)
    max_background_shells: int = 256
    # A session's environment (SPEC V12–V14; docs/environments.md).
    layer_bytes: int = DEFAULT_LAYER_BYTES
    image_dirs: tuple[str, ...] = ()  # images off
    image_cache: Path | None = None  # None: ~/.cache/toolpool/images
    image_cache_bytes: int = 10 * 1024**3
    # A session's network (SPEC N1, N10; docs/security.md): the most it may be, and
    # names the egress proxy sends where the operator says.
    network: str = "open"
    network_resolve: dict[str, Pin] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A config made in code meets the same table as one loaded (no sources to name).
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if value is not None:
                setting.parse(value, "DaemonConfig", text=False)
        _check_relations(lambda name: getattr(self, name), {})
        _check_network(self.network, self.limits, self.tool_limits, {})

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


_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(DaemonConfig)
    if f.default is not dataclasses.MISSING
}


def shown(value: Any) -> str:
    """A setting's value as a message shows it: as it is written (SPEC E8) — a path
    as its text, a list comma-separated as a flag gives it — never a Python repr."""
    if isinstance(value, Path):
        value = str(value)
    elif isinstance(value, tuple | list | frozenset | set):
        items = sorted(value) if isinstance(value, frozenset | set) else value
        value = ",".join(str(item) for item in items)
    return repr(value)


def _check_relations(get: Callable[[str], Any], sources: Mapping[str, str]) -> None:
    """What no single setting can say: the settings together (``get`` gives a value)."""

    def named(name: str) -> str:
        return f"{name} = {shown(get(name))} ({sources.get(name, DEFAULT)})"

    if get("min_workers") > get("max_workers"):
        raise ConfigError(
            f"{named('min_workers')} is more than {named('max_workers')}: "
            "min_workers must be at most max_workers"
        )
    if get("curve_secret_key") is not None and get("curve_authorized_keys") is None:
        raise ConfigError(
            f"{named('curve_secret_key')} needs curve_authorized_keys "
            "(a directory of the clients' public keys)"
        )


def _check_network(
    network: str,
    limits: Limits,
    tool_limits: Mapping[str, Mapping[str, Any]],
    sources: Mapping[str, str],
) -> None:
    """``limits.network = true`` is network "open" (N1): past a lower ceiling, it is
    a contradiction the operator must settle."""
    if network == "open":
        return
    opened = ["limits.network"] if limits.network else []
    opened += [f"tool_limits.{t}.network" for t, v in tool_limits.items() if v.get("network")]
    if opened:
        raise ConfigError(
            f"{opened[0]} = true means network = 'open', past network = {network!r} "
            f"({sources.get('network', DEFAULT)}): drop one of them"
        )


def check_tool_modules(modules: tuple[str, ...], source: str) -> None:
    """Each module can be found: a missing one is one line naming it. Its code does
    not run here (``find_spec`` imports only its parent packages); ``tool_registry``
    runs it."""
    for ref in modules:
        if ref.endswith(".py") or "/" in ref:
            found = Path(ref).expanduser().is_file()
        else:
            try:
                found = importlib.util.find_spec(ref) is not None
            except (ImportError, ValueError):
                found = False
            except Exception as exc:  # a parent package that fails as it is imported
                raise ConfigError(
                    f"{source}: tool_modules = {shown(modules)}: importing {ref!r} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        if not found:
            raise ConfigError(
                f"{source}: tool_modules = {shown(modules)}: no module {ref!r} "
                "(expected an importable module name or a .py file)"
            )


def tool_registry(modules: Iterable[str]) -> ToolRegistry:
    """The tools of ``modules``, loaded here; any failure of a module (its import, a
    tool that breaks the contract) is a ConfigError of one line naming it."""
    tools: list[Any] = []
    for ref in modules:
        try:
            tools += tools_in_module(ref)
        except Exception as exc:  # the module is operator code: anything may go wrong
            raise ConfigError(
                f"tool_modules: {ref!r} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from None
    try:
        return ToolRegistry(tools)
    except Exception as exc:
        raise ConfigError(f"tool_modules: {type(exc).__name__}: {exc}") from None


def default_config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "toolpool" / "config.toml"


def _unknown(what: str, key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {what} {key!r} ({hint}known: {', '.join(sorted(known))})"


class _Layers:
    """The values chosen so far, each with the source that set it."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.limits: dict[str, Any] = {}
        self.tool_limits: dict[str, dict[str, Any]] = {}
        self.network_resolve: dict[str, Pin] = {}

    def set(self, name: str, value: Any, source: str, *, text: bool) -> None:
        setting = _BY_NAME.get(name)
        if setting is None:
            raise ConfigError(f"{source}: " + _unknown("setting", name, [*_BY_NAME, *_TABLES]))
        self.values[name] = setting.parse(value, source, text=text)
        self.sources[name] = source

    def limit(self, into: dict[str, Any], name: Any, value: Any, source: str, text: bool) -> None:
        setting = _LIMITS_BY_NAME.get(name)
        if setting is None:
            raise ConfigError(f"{source}: " + _unknown("limit", str(name), _LIMITS_BY_NAME))
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
                    flag = _LIMITS_BY_NAME[limit].flag if limit in _LIMITS_BY_NAME else "--limits"
                    self.limit(self.limits, limit, text, f"flag {flag}", isinstance(text, str))
            elif name == "tool_limit":
                for item in value:
                    self.tool_limit(item)
            elif name == "network_resolve":
                for item in value:
                    self.pins([item], "flag --network-resolve")
            else:
                flag = _BY_NAME[name].flag if name in _BY_NAME else "--" + name
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


_TABLES = ("limits", "tool_limits", "network_resolve")


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    check_modules: bool = True,
) -> DaemonConfig:
    """Defaults < TOML file < environment < flags (None flags are not given).

    ``flags`` maps setting names to values (text as the command line gives it, or the
    setting's own type), ``"config"`` to the TOML file, ``"limits"`` to a mapping of
    limits, ``"tool_limit"`` to ``TOOL.LIMIT=VALUE`` strings and
    ``"network_resolve"`` to ``NAME=IP[:PORT]`` strings. ``check_modules``:
    whether each tool module must be found (SPEC E2); the daemon's control commands,
    which only need its runtime directory, skip it."""
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    layers = _Layers()

    source = "flag --config" if "config" in flags else "environment TOOLPOOL_CONFIG"
    path = flags.pop("config", None) or env.get("TOOLPOOL_CONFIG")
    toml_path = Path(os.path.expanduser(str(path))) if path else default_config_path(env)
    if toml_path.is_file():
        layers.file(toml_path)
    elif path:
        raise ConfigError(f"no configuration file at {toml_path} ({source})")
    layers.environment(env)
    layers.flags(flags)
    try:
        limits = Limits().merged(layers.limits)
    except ValueError as exc:
        raise ConfigError(f"limits: {exc}") from None
    # Relations are judged with the sources at hand, before the dataclass judges them
    # again without: the message names where each value came from.
    _check_relations(lambda name: layers.values.get(name, _DEFAULTS.get(name)), layers.sources)
    network = layers.values.get("network", _DEFAULTS["network"])
    _check_network(network, limits, layers.tool_limits, layers.sources)
    made = DaemonConfig(
        **layers.values,
        limits=limits,
        tool_limits=layers.tool_limits,
        network_resolve=layers.network_resolve,
    )
    if check_modules:
        check_tool_modules(made.tool_modules, layers.sources.get("tool_modules", DEFAULT))
    return made
