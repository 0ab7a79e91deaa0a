"""The toolpool daemon: one long-running coordinator process per user (SPEC D1).

``toolpool daemon`` runs it in the foreground (``run_foreground``), the way a service
manager wants it; ``toolpool daemon start|stop|status`` (``toolpool.client.control``)
manage one in the background through its pid file. It wires the engine (sessions,
pipeline, scheduler) to the worker pool and the server. SIGTERM (or SIGINT) drains:
no new turns, running turns get ``drain_grace`` seconds and are then aborted, workers
are stopped; a second SIGTERM ends at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from toolpool.daemon import logs
from toolpool.daemon.audit import AuditLog, AuditLogRefused
from toolpool.daemon.config import DaemonConfig, tool_registry
from toolpool.daemon.server import Server, curve_keys, is_loopback
from toolpool.daemon.shipped import SessionTools
from toolpool.engine.coordinator import Coordinator
from toolpool.errors import ToolpoolError
from toolpool.images import default_cache_root
from toolpool.mcp.bridges import Imported, import_mcp_servers
from toolpool.mcp.config import McpConfigError
from toolpool.pool import PoolError, PoolExecutor, WorkerPool
from toolpool.pool.peers import LOCAL_DOMAIN, PeerGuard
from toolpool.pool.shell_process import remove_stale_shells
from toolpool.registry import ToolRegistry
from toolpool.runtime import (
    AUDIT_NAME,
    ENDPOINT_NAME,
    PID_NAME,
    SCRATCH_PREFIX,
    SOCKET_NAME,
    SPILL_PREFIX,
    PathSettingError,
    ensure_private,
    path_setting,
    private_dir,
    process_alive,
    running_pid,
    write_private,
)
from toolpool.sandbox.cgroups import remove_stale_cgroups
from toolpool.sandbox.layers import remove_layers
from toolpool.sandbox.policy import Policy, default_deny_read

log = logging.getLogger("toolpool.daemon")


class DaemonError(ToolpoolError):
    """The daemon cannot start (another one runs, a bad address, no workers…)."""


def _check_tcp(config: DaemonConfig) -> tuple[bytes, bytes] | None:
    """CURVE keys for the TCP endpoint; refuse a non-loopback address without them."""
    assert config.tcp is not None
    if config.curve_secret_key is None:
        if not is_loopback(config.tcp):
            raise DaemonError(
                f"refusing to listen on {config.tcp} without CURVE authentication: set "
                "curve_secret_key and curve_authorized_keys, or use a loopback address"
            )
        return None
    if config.curve_authorized_keys is None:
        raise DaemonError("curve_secret_key needs curve_authorized_keys (clients' public keys)")
    path = config.curve_secret_key
    with path_setting("curve_secret_key", path, "it cannot be read"):
        try:
            return curve_keys(path)
        except ValueError as exc:  # a file, but not zmq.auth's key file
            raise PathSettingError(
                f"curve_secret_key = {str(path)!r}: no CURVE secret key in it ({exc})"
            ) from None


async def serve(config: DaemonConfig) -> int:
    """Run the daemon until SIGTERM/SIGINT; return its exit status."""
    with path_setting("runtime_dir", config.runtime_dir, "it cannot be made"):
        runtime = ensure_private(config.runtime_dir)
    other = running_pid(runtime)
    if other is not None:
        raise DaemonError(f"a daemon is already running (pid {other}) in {runtime}")
    curve = _check_tcp(config) if config.tcp else None
    (runtime / SOCKET_NAME).unlink(missing_ok=True)  # a stale socket of a dead daemon
    _remove_stale_run_directories(runtime)
    try:
        mcp_servers = import_mcp_servers(config.mcp_servers, runtime / f"mcp-{os.getpid()}")
        async with mcp_servers as imported:
            tool_modules = (*config.tool_modules, *imported.tool_modules)
            # The tools are loaded here before any worker starts: a module that fails
            # is one line naming it (SPEC E2), not a zygote's traceback in the log.
            registry = tool_registry(tool_modules)
            return await _serve(config, runtime, curve, tool_modules, registry, imported)
    except McpConfigError as exc:
        raise DaemonError(str(exc)) from exc


STALE_RUN_PREFIXES = ("workers-", "mcp-", SCRATCH_PREFIX, SPILL_PREFIX)


def _remove_stale_run_directories(runtime: Path) -> None:
    """The directories of earlier runs, named ``<kind>-<pid>``: the workers' and MCP
    bridges' (each run leaves its own, with the worker logs, for a look after it
    stopped or crashed), the sessions' scratch and the clients' spill (removed at a
    clean stop, left by a crash: SPEC X8, L7). The next start removes those whose pid
    is not alive (or is ours: a dead daemon's pid reused), the cgroups such a daemon
    left and the processes of its background shells, and logs what it removed."""
    removed = []
    layers = 0  # sessions whose layers went: their checkpoints and forks with them (B11)
    for prefix in STALE_RUN_PREFIXES:
        for stale in runtime.glob(f"{prefix}*"):
            pid = stale.name.removeprefix(prefix)
            if not pid.isdigit() or not stale.is_dir() or stale.is_symlink():
                continue
            if int(pid) == os.getpid() or not process_alive(int(pid)):
                found = len(list((stale / "s").glob("*.l"))) if prefix == "workers-" else 0
                try:
                    remove_layers(stale)  # its sessions' layers unmounted first (V12)
                except OSError as exc:
                    log.warning("left %s: %s", stale, exc)
                    continue
                removed.append(stale.name)
                layers += found
    if removed:
        log.info("removed what an earlier daemon left in %s: %s", runtime, ", ".join(removed))
    if layers:
        log.warning(
            "removed the layers of %d sessions of an earlier daemon: their checkpoints "
            "and forks are gone",
            layers,
        )
    cgroups = remove_stale_cgroups(lambda pid: pid != os.getpid() and process_alive(pid))
    if cgroups:
        log.info("removed the cgroups an earlier daemon left: %s", ", ".join(cgroups))
    shells = remove_stale_shells(lambda pid: pid != os.getpid() and process_alive(pid))
    if shells:
        log.info("killed what an earlier daemon's background shells left: pids %s", shells)


async def _serve(
    config: DaemonConfig,
    runtime: Path,
    curve: tuple[bytes, bytes] | None,
    tool_modules: tuple[str, ...],
    registry: ToolRegistry,
    imported: Imported,
) -> int:
    pool = WorkerPool(
        config.pool_config(
            runtime_dir=runtime / f"workers-{os.getpid()}",
            tool_modules=tool_modules,
            policy=confinement_policy(config, runtime),
        )
    )
    try:
        await pool.start()
        try:
            _check_required_sandbox(pool, config)
        except PoolError:
            await pool.close()
            raise
    except PoolError as exc:
        raise DaemonError(f"the worker pool did not start: {exc}") from exc
    scratch = runtime / f"{SCRATCH_PREFIX}{os.getpid()}"  # removed at stop (SPEC X8)
    spill = runtime / f"{SPILL_PREFIX}{os.getpid()}"  # frames waiting for clients (L5)
    try:
        private_dir(scratch)
        private_dir(spill)
    except Exception:
        await pool.close()
        raise
    coordinator = Coordinator(
        registry,
        executor=PoolExecutor(pool, tool_limits=config.tool_limits),
        max_tool_concurrency=config.max_tool_concurrency,
        max_tool_errors=config.max_tool_errors,
        scratch_root=scratch,
        turn_output_chars=config.turn_output_chars,
        trace=False,  # the spans are the clients' to make, under their agents' traces (R3)
    )
    try:
        audit = _open_audit_log(config)
        _note_audit_log(runtime, config)
    except Exception:
        await pool.close()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(spill, ignore_errors=True)
        raise
    server = Server(
        coordinator,
        pool,
        approval_timeout=config.approval_timeout,
        client_buffer_bytes=config.client_buffer_bytes,
        client_stall_seconds=config.client_stall_seconds,
        max_sessions_per_client=config.max_sessions_per_client,
        max_sessions=config.max_sessions,
        spill_dir=spill,
        audit=audit,
        network=config.network,
        session_tools=SessionTools(config.session_tools),
        mcp_left_out=imported.left_out,
    )
    authenticator = None
    try:
        authenticator = _start_authenticator(server, pool, config, curve is not None)
        ipc = server.bind(f"ipc://{runtime / SOCKET_NAME}", zap_domain=LOCAL_DOMAIN)
        tcp = None
        if config.tcp:
            tcp = server.bind(f"tcp://{config.tcp}", curve=curve)
    except Exception:
        if authenticator is not None:
            authenticator.stop()
        await pool.close()
        if audit is not None:
            audit.close()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(spill, ignore_errors=True)
        raise
    if os.geteuid() == 0:
        log.warning(ROOT_WARNING)
    server.start()
    # The stop signals are ours before anyone can know the daemon is up (the endpoint
    # file): a TERM sent the moment it appears must not meet the default action.
    stopping = asyncio.Event()
    terms = 0

    def on_signal() -> None:
        nonlocal terms
        terms += 1
        if terms == 1:
            log.info("stopping: draining running turns (a second signal ends at once)")
            stopping.set()
        else:
            log.info("stopping at once")
            server.abort_everything()

    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    endpoint = {
        "pid": os.getpid(),
        "ipc": ipc,
        "tcp": tcp,
        "server_public_key": None if curve is None else curve[0].decode(),
    }
    write_private(runtime / ENDPOINT_NAME, json.dumps(endpoint))
    write_private(runtime / PID_NAME, str(os.getpid()))
    log.info("daemon ready on %s%s", ipc, f" and {tcp}" if tcp else "")

    try:
        await stopping.wait()
        await server.drain(config.drain_grace)
        if authenticator is not None:
            authenticator.stop()  # before the server's context ends: it holds a socket in it
        await server.close()
        await pool.close(polite=terms < 2)
    finally:
        # Stopping already: a signal now (a second TERM from whoever waits for the
        # exit) must not kill the last clean-up with the default action. The loop's
        # handler stays, doing nothing, until the loop closes (removing it would put
        # the default action back, if only for an instant); run_foreground ignores
        # the signals once it has.
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, _ignored)
        for name in (ENDPOINT_NAME, PID_NAME, SOCKET_NAME):
            (runtime / name).unlink(missing_ok=True)
        coordinator.close()
        if audit is not None:
            audit.close()  # after the last turn: every call's line is written (R2)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(spill, ignore_errors=True)
        # From here, until the process ends, a stop signal waits in the main thread
        # (other threads either block it, as ZeroMQ's do, or still run the loop's
        # handler): none meets the default action the loop's closing puts back.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    log.info("daemon stopped")
    return 0


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def _ignored() -> None:
    """A stop signal while the daemon stops already: nothing more to do."""


def _open_audit_log(config: DaemonConfig) -> AuditLog | None:
    """The audit log, or a DaemonError of one line naming the setting, the path and
    why it cannot be the log (SPEC R6, E2)."""
    if config.audit_log is None:
        return None
    setting = f"audit_log = {str(config.audit_log)!r}"
    try:
        return AuditLog(
            config.audit_log,
            max_bytes=config.audit_max_bytes,
            backups=config.audit_backups,
            arguments=config.audit_arguments,
        )
    except AuditLogRefused as exc:
        raise DaemonError(
            f"{setting}: {exc}; remove what is there, or set audit_log to another path"
        ) from exc
    except OSError as exc:
        raise DaemonError(f"{setting}: it cannot be opened: {exc.strerror or exc}") from exc


def _note_audit_log(runtime: Path, config: DaemonConfig) -> None:
    """Where this daemon's audit log is, for ``toolpool audit`` to find it without
    the configuration that named it (a flag): kept in the runtime dir after a stop,
    gone when a daemon starts there without one (SPEC R1)."""
    pointer = runtime / AUDIT_NAME
    if config.audit_log is None:
        pointer.unlink(missing_ok=True)
    else:
        write_private(pointer, os.path.abspath(config.audit_log))


def _start_authenticator(
    server: Server, pool: WorkerPool, config: DaemonConfig, curve: bool
) -> PeerGuard:
    """The ZAP handler: the local socket refuses the pool's confined processes (X2),
    TCP clients need an authorized CURVE key."""
    authenticator = PeerGuard(server.context, pool.confines)
    authenticator.start()
    if curve:
        authenticator.configure_curve(domain="*", location=str(config.curve_authorized_keys))
    return authenticator


ROOT_WARNING = (
    "the daemon runs as root: commands run without capabilities but still pass owner "
    "checks on root's files, and Python tools run as root; a dedicated unprivileged user "
    "is the safer way to run the daemon"
)


def confinement_policy(config: DaemonConfig, runtime: Path) -> Policy:
    """What confined code may not see: deny_read (toolpool's default list unless
    configured), the runtime dir, the key files (X2, X6, X9) and, with images on, the
    image cache (V13: its layers are mounted read-only, never reached by name)."""
    deny = default_deny_read() if config.deny_read is None else config.deny_read
    keys = [p for p in (config.curve_secret_key, config.curve_authorized_keys) if p is not None]
    if config.image_dirs:
        keys.append(config.image_cache or default_cache_root())
    return Policy(
        hidden=(*deny, str(runtime), *(str(k) for k in keys)),
        env_passthrough=config.env_passthrough,
        private_run=config.private_run,
    )


def _check_required_sandbox(pool: WorkerPool, config: DaemonConfig) -> None:
    """Refuse to run when a mechanism the operator requires is off (X11)."""
    off = {m.name: m.detail for m in pool.profile.mechanisms if not m.active}
    missing = sorted(set(config.require_sandbox) & set(off))
    unknown = sorted(set(config.require_sandbox) - {m.name for m in pool.profile.mechanisms})
    if unknown:
        raise PoolError(f"require_sandbox names unknown mechanisms {unknown}")
    if missing:
        reasons = "; ".join(f"{name}: {off[name]}" for name in missing)
        raise PoolError(f"required sandbox mechanisms are off ({reasons})")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (a dependency on Linux): its loop turns,
    callbacks and timers cost a fraction of asyncio's, and every call takes several."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_foreground(config: DaemonConfig) -> int:
    """Run the daemon; 0 when it stopped. A reason not to start (a ToolpoolError: the
    daemon's own, a tool module's, the pool's) is logged and raised, for the command
    line to say in one line; so is anything else that ends it at start."""
    if config.log_file is None:
        logs.configure(config.log_level, None)
    else:
        with path_setting("log_file", config.log_file, "it cannot be opened"):
            logs.configure(config.log_level, config.log_file)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            code = runner.run(serve(config))
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # the loop's handlers went with it
        return code
    except (ToolpoolError, OSError) as exc:
        log.error("%s", exc)
        raise
    except Exception as exc:  # a bug: the command line shows it (its traceback on demand)
        log.error("the daemon failed: %s: %s", type(exc).__name__, exc)
        raise
