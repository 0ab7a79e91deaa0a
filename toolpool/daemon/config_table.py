"""The daemon's settings table: every setting once — its kind (type, range or
choices: ``value_kinds.py``), its documentation, its variable and its flag (SPEC E2, E3).

``SETTINGS`` holds the top-level settings, a ``DaemonConfig`` field each, in its order;
``LIMIT_SETTINGS`` the per-call limits (``[limits]``, ``[tool_limits.TOOL]``), a row
per ``Limits`` field. The file, the environment and the flags (``config_sources.py``)
and a ``DaemonConfig`` made in code (``config.py``) all read values through these rows,
and so share their parsers and messages: a bad value is a ``ConfigError`` of one line
naming the setting, where it came from and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
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
from toolpool.errors import ToolpoolError
from toolpool.protocol import CHUNK_BYTES
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import MECHANISMS

MIN_CLIENT_BUFFER = 2 * CHUNK_BYTES
NETWORK_CEILINGS = ("off", "policy", "open")  # by rank: session_options.network_rank


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
BY_NAME: Mapping[str, Setting] = {s.name: s for s in SETTINGS}
LIMITS_BY_NAME: Mapping[str, Setting] = {s.name: s for s in LIMIT_SETTINGS}
