"""The daemon's configuration: defaults, then a TOML file, then environment variables,
then command-line flags — each stronger than the one before (SPEC E2, E3).

The TOML file's keys are the settings; ``[limits]`` holds the default per-call limits
and ``[tool_limits.<tool>]`` the operator's per-tool ones. Environment variables are
``TOOLPOOL_<SETTING>`` (lists comma-separated) and ``TOOLPOOL_LIMITS_<LIMIT>``; flags
are ``--<setting-with-dashes>``, ``--limits-<limit>`` and ``--tool-limit
TOOL.LIMIT=VALUE``. ``[network_resolve]`` pins names for the egress proxy (``"NAME" =
"IP[:PORT]"``; SPEC N10), as do ``TOOLPOOL_NETWORK_RESOLVE`` (``NAME=IP[:PORT],…``)
and ``--network-resolve NAME=IP[:PORT]`` (repeatable).

Three modules, one job each: ``config_table.py`` describes every setting once (its
kind, documentation, variable and flag); ``config_sources.py`` reads the file, the
environment and the flags through it; this one makes the ``DaemonConfig``, judges the
settings together, finds the tool modules and gives the pool its configuration. A
setting the pool has too has the pool's default, and reaches the pool as it is set
(``DaemonConfig.pool_config``; SPEC E11).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.daemon.config_sources import read_layers
from toolpool.daemon.config_table import SETTINGS, ConfigError
from toolpool.egress.addresses import Pin
from toolpool.pool.workers import PoolConfig
from toolpool.registry import ToolRegistry, tools_in_module
from toolpool.runtime import runtime_dir
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.policy import Policy

DEFAULT = "default"  # the source of a value nobody set

_POOL_FIELDS = {f.name: f for f in dataclasses.fields(PoolConfig)}


def _pool_default(name: str) -> Any:
    """The default of a setting the pool has too: the pool's own (``PoolConfig``), so
    the setting has one default whether a daemon or a program makes the pool."""
    pool = _POOL_FIELDS[name]
    if pool.default_factory is not dataclasses.MISSING:
        return field(default_factory=pool.default_factory)
    return field(default=pool.default)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The daemon's settings: a field per row of the table (``SETTINGS``, in its
    order; what each does is its row's ``doc``) and the tables ``limits``,
    ``tool_limits`` and ``network_resolve``."""

    runtime_dir: Path = field(default_factory=runtime_dir)
    tcp: str | None = None  # "127.0.0.1:7777": also listen there
    curve_secret_key: Path | None = None  # the server's key file (zmq.auth format)
    curve_authorized_keys: Path | None = None  # a directory of clients' public keys
    tool_modules: tuple[str, ...] = ("toolpool.tools",)
    # Who may ship tools with a session (SPEC A6): the Unix socket's clients, the
    # daemon's own user; "any": TCP clients too; "off": none.
    session_tools: str = "local"
    # The settings the pool has too take its defaults (POOL_SETTINGS): a
    # ``_pool_default`` each, here and below.
    min_workers: int = _pool_default("min_workers")
    max_workers: int = _pool_default("max_workers")
    max_tool_concurrency: int = 10
    max_tool_errors: int = 3
    cancel_grace: float = _pool_default("cancel_grace")
    drain_grace: float = 10.0  # seconds running turns get to finish on SIGTERM
    approval_timeout: float = 120.0
    max_calls_per_worker: int = _pool_default("max_calls_per_worker")
    max_worker_rss: int = _pool_default("max_worker_rss")
    hold_calls: bool = _pool_default("hold_calls")
    worker_calls_per_frame: int = _pool_default("worker_calls_per_frame")
    worker_cpus: float = _pool_default("worker_cpus")
    sandbox_disabled: frozenset[str] = _pool_default("sandbox_disabled")
    require_sandbox: frozenset[str] = frozenset()  # refuse to start when one is off (X11)
    deny_read: tuple[str, ...] | None = None  # None: toolpool's default list (X9)
    env_passthrough: tuple[str, ...] = ()  # daemon variables commands may see (X9)
    private_run: bool = True  # /run and /var/run private inside commands (X2)
    limits: Limits = _pool_default("limits")
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
    background_wall_seconds: float = _pool_default("background_wall_seconds")
    max_background_shells_per_client: int = _pool_default("max_background_shells_per_client")
    max_background_shells: int = _pool_default("max_background_shells")
    # A session's environment (SPEC V12–V14; docs/environments.md).
    layer_bytes: int = _pool_default("layer_bytes")
    image_dirs: tuple[str, ...] = ()  # images off
    image_cache: Path | None = None  # None: the pool's (~/.cache/toolpool/images)
    image_cache_bytes: int = _pool_default("image_cache_bytes")
    # A session's network (SPEC N1, N10; docs/security.md): the most it may be, and
    # names the egress proxy sends where the operator says.
    network: str = "open"
    network_resolve: dict[str, Pin] = _pool_default("network_resolve")

    def __post_init__(self) -> None:
        # A config made in code meets the same table as one loaded (no sources to name).
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if value is not None:
                setting.parse(value, "DaemonConfig", text=False)
        _check_relations(lambda name: getattr(self, name), {})
        _check_network(self.network, self.limits, self.tool_limits, {})

    def pool_config(
        self, *, runtime_dir: Path, tool_modules: tuple[str, ...], policy: Policy
    ) -> PoolConfig:
        """The pool's configuration: every setting it has too as set here, and what
        the daemon makes as it starts — the workers' directory in its runtime dir, the
        tool modules with its MCP servers', the confinement policy (SPEC E11)."""
        given = {name: getattr(self, name) for name in POOL_SETTINGS}
        if self.image_cache is not None:
            given["image_cache"] = self.image_cache
        return PoolConfig(
            **given,
            runtime_dir=runtime_dir,
            tool_modules=tool_modules,
            policy=policy,
            image_dirs=tuple(Path(p) for p in self.image_dirs),
        )

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


# The settings the pool has too, by the same name and meaning: their defaults are the
# pool's, and pool_config passes them as they are. Four fields share a name with the
# pool's but not their form, and the daemon makes the pool's own: runtime_dir (the
# pool's is a directory in it), tool_modules (the MCP servers' join them), image_dirs
# (paths) and image_cache (None: the pool's default).
_DAEMON_MADE = frozenset({"runtime_dir", "tool_modules", "image_dirs", "image_cache"})
POOL_SETTINGS = tuple(
    f.name
    for f in dataclasses.fields(DaemonConfig)
    if f.name in _POOL_FIELDS and f.name not in _DAEMON_MADE
)
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
    layers = read_layers({k: v for k, v in (flags or {}).items() if v is not None}, env)
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
