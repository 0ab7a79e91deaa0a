"""What ``status`` and ``tools`` answer: the daemon's state, read, never changed."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from toolpool.daemon.records import Address, ClientState, SessionEntry
from toolpool.egress.rules import NetworkPolicy
from toolpool.engine.coordinator import Coordinator
from toolpool.pool import WorkerPool
from toolpool.providers import definitions
from toolpool.session_options import DEFAULT_LAYER_BYTES, ImageRoot, SessionOptions


def _shipped(entry: SessionEntry) -> list[str]:
    """The names of the tools the session's client shipped (its own, beside ours)."""
    return [spec.name for spec in entry.session.tools if spec.binding is entry.binding]


def _bound(pool: WorkerPool | None, entry: SessionEntry) -> list[int]:
    if pool is None or entry.binding is None:
        return []
    return pool.bindings.workers(entry.binding)


def daemon_status(
    coordinator: Coordinator,
    pool: WorkerPool | None,
    sessions: Mapping[str, SessionEntry],
    clients: Mapping[Address, ClientState],
    *,
    draining: bool,
    started_at: float,
    closing: int,
    approvals: int,
    mcp_left_out: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """Sessions (their background shells too), clients and what waits for them, the
    pool's workers, the sandbox."""
    shells = {} if pool is None else pool.shells.listing()
    sandboxes = {} if pool is None else pool.shells.sandboxes.listing()
    by_session = {}
    for session_id, entry in sessions.items():
        stats = entry.session.statistics()
        by_session[session_id] = {
            "workspace": stats.workspace,
            "turns": len(entry.turns),
            "files_read": stats.files_read,
            "breaker_failures": stats.breaker_failures,
            "open_breakers": entry.session.breaker.statistics().open,
            "turn_running": stats.turn_running,
            "shells": shells.get(session_id, []),
            "shell": entry.session.options.shell.value,
            "sandboxes": sandboxes.get(session_id, []),  # V1: network, state, pid
            "environment": _environment(entry.session.options, pool, session_id),
            "network": _network(entry.session.options, pool, session_id),
            "shipped_tools": [] if entry.binding is None else _shipped(entry),  # A5
            "bound_workers": _bound(pool, entry),  # A6: the pids of its tools' workers
        }
    status: dict[str, Any] = {
        "pid": os.getpid(),
        "uptime_seconds": round(time.time() - started_at, 1),
        "draining": draining,
        "clients": len(clients),
        "session_tables": {  # all 0 once every session is closed (L6)
            "sessions": len(sessions),
            "engine": len(coordinator.sessions),
            "closing": closing,
            "approvals": approvals,
        },
        "client_buffers": {  # what is on its way to each client (L5)
            c.address[1].hex(): {"name": c.name, **c.outbox.statistics()} for c in clients.values()
        },
        "sessions": by_session,
        "tools": coordinator.registry.names(),
        "max_tool_concurrency": coordinator.max_tool_concurrency,
        "max_tool_errors": coordinator.max_tool_errors,
        "running_as_root": os.geteuid() == 0,
        # MCP servers, and tools of theirs, the daemon started without (SPEC E9).
        "mcp_left_out": list(mcp_left_out),
    }
    if pool is not None:
        workers = pool.statistics()
        status["workers"] = workers.workers
        status["queued_calls"] = workers.queued
        status["held_calls"] = workers.held
        status["workers_started"] = workers.started
        status["workers_replaced"] = workers.replaced
        status["replacement_ms"] = workers.replacement_ms
        status["zygotes_replaced"] = workers.zygotes_replaced
        status["zygote_recovery_ms"] = workers.zygote_recovery_ms
        status["sandbox"] = workers.profile
        status["background_shells"] = len(pool.shells.running())
        status["sandbox_retries"] = pool.sandbox_retries  # X12: failed before, started again
        status["egress_proxy"] = pool.egress.statistics()  # N3: its process
    return status


def _network(options: SessionOptions, pool: WorkerPool | None, session_id: str) -> dict[str, Any]:
    """A session's network (N1) and, for a policy once its proxy serves it, the
    proxy's counters (N8): connections, allowed, denied, asked, active, dropped,
    bytes up and down."""
    network = options.network
    if not isinstance(network, NetworkPolicy):
        return {"mode": network.value}
    shown: dict[str, Any] = {"mode": "policy", "policy": network.to_wire()}
    counters = None if pool is None else pool.egress.counters(session_id)
    if counters is not None:
        shown["proxy"] = counters
    return shown


def tool_definitions(coordinator: Coordinator, format: str) -> list[dict[str, Any]]:
    """The tools' definitions in toolpool's form or a provider's (ValueError if unknown)."""
    specs = list(coordinator.registry)
    if format == "toolpool":
        return [spec.definition() for spec in specs]
    return definitions(specs, format)


def _environment(
    options: SessionOptions, pool: WorkerPool | None, session_id: str
) -> dict[str, Any]:
    """The session's root and workspace modes and its writable layers' size and use
    (SPEC V12–V14; ``layer_used_bytes`` once they are made)."""
    root = options.root
    found: dict[str, Any] = {
        "root": root.value,
        "workspace_mode": options.workspace_mode.value,
    }
    if isinstance(root, ImageRoot):
        found["image"] = root.image
    if root.value != "host" or options.workspace_mode.value != "direct":
        default = DEFAULT_LAYER_BYTES if pool is None else pool.config.layer_bytes
        found["layer_bytes"] = options.layer_bytes or default
        used = None if pool is None else pool.shells.sandboxes.layer_used(session_id)
        if used is not None:
            found["layer_used_bytes"] = used
        if pool is not None and pool.branches.tracks(session_id):  # B1, B3
            found["checkpoints"] = len(pool.branches.history(session_id))
            found["forked_from"] = pool.branches.forked_from(session_id)
        # A daemon not run as root mounts them in a user namespace of its own (V17).
        found["layers_in"] = "host" if os.geteuid() == 0 else "user namespace"
        if root.value == "overlay" and os.geteuid() != 0:
            found["root_writable"] = "only what the daemon's user may write on the host"
    return found
