"""One node's toolpool, run by a Ray actor pinned there: the daemon process it
supervises, and the workspaces it prepares for the sessions placed on the node.

The daemon is an ordinary ``python -m toolpool daemon run --config FILE``: its
configuration is a TOML file written here (the settings the driver gave, and the
ones this actor owns: the runtime directory, the TCP address on the node's IP, the
CURVE keys), so the daemon is the same program as on a single machine. It dies with
the actor (``tether``); the actor stops it (SIGTERM, then its whole tree) on
``stop`` and when it is collected. What a killed actor left on the node's disk is
removed by the next actor that starts there (``remove_stale_roots``).

This class is plain Python: the cluster makes it a Ray actor, tests may run it
in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from toolpool.client.control import start_failure
from toolpool.errors import ToolpoolError
from toolpool.ray import workspace
from toolpool.ray.errors import ClusterError, WorkspaceError
from toolpool.runtime import process_alive, read_endpoint
from toolpool.sandbox.terminate import ProcessTree, terminate

ROOT_PREFIX = "toolpool-ray-"  # + the actor's pid + "-" + mkdtemp's letters
# Settings this actor owns: the daemon must be reachable, and only by the driver.
OWNED = ("runtime_dir", "tcp", "curve_secret_key", "curve_authorized_keys", "log_file")
# What a cluster's daemon uses unless the driver says otherwise: a node's daemon is
# stopped with its actor, which should not wait out a long drain.
DEFAULTS: dict[str, Any] = {"drain_grace": 2.0, "log_level": "info"}
STOP_GRACE = 5.0  # seconds the daemon's tree gets after the second SIGTERM


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    """Where a node's daemon answers, and who runs it."""

    node_id: str
    endpoint: str  # tcp://HOST:PORT
    server_public_key: bytes
    daemon_pid: int
    actor_pid: int


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    node_id: str
    actor_pid: int
    daemon_pid: int | None
    daemon_exit: int | None  # the daemon's exit status once it ended
    root: str | None  # the actor's directory on the node (keys, config, workspaces)


class NodeDaemon:
    """A node's daemon and workspaces. ``start`` first; ``stop`` last."""

    def __init__(
        self,
        node_id: str,
        host: str,
        server_secret_key: bytes,
        client_public_key: bytes,
        settings: Mapping[str, Any],
        env: Mapping[str, str],
        base_dir: str | None = None,
    ) -> None:
        clash = sorted(set(settings) & set(OWNED))
        if clash:
            raise ClusterError(f"the cluster sets {', '.join(clash)} of its daemons itself")
        self.node_id = node_id
        self._host = host
        self._server_secret = server_secret_key
        self._client_public = client_public_key
        self._settings = {**DEFAULTS, **settings}
        self._env = dict(env)
        self._base = Path(base_dir or tempfile.gettempdir())
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._keeper: threading.Thread | None = None
        self._workspaces: dict[str, Path] = {}
        self._lock = threading.Lock()

    # -- the daemon ----------------------------------------------------------------------

    def start(self, timeout: float) -> NodeEndpoint:
        """Start the daemon and wait until its endpoint is written."""
        remove_stale_roots(self._base)
        root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=self._base))
        self._root = root
        secret_file, authorized = self._write_keys(root / "keys")
        log = root / "daemon.log"
        config = root / "daemon.toml"
        config.write_text(to_toml(self._config(root, secret_file, authorized)))
        process = self._spawn(config, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            info = read_endpoint(root / "rt")
            if info is not None and info.get("pid") == process.pid and info.get("tcp"):
                return NodeEndpoint(
                    self.node_id,
                    str(info["tcp"]),  # the port the kernel gave it
                    str(info["server_public_key"]).encode(),
                    process.pid,
                    os.getpid(),
                )
            time.sleep(0.05)
        if process.poll() is None:
            self.stop()
            raise ClusterError(
                f"the daemon on node {self.node_id[:12]} did not answer in {timeout:g} s"
            )
        raise ClusterError(
            f"the daemon on node {self.node_id[:12]} exited at start "
            f"(status {process.returncode}): {start_failure(log, 0)}"
        )

    def _spawn(self, config: Path, log: Path) -> subprocess.Popen[bytes]:
        """``toolpool daemon run --config FILE`` through ``tether``, from a thread that
        lives exactly as long as the daemon: the death signal goes with the thread
        that forked the process, not with the process."""
        assert self._root is not None
        daemon = [sys.executable, "-m", "toolpool", "daemon", "run", "--config", str(config)]
        argv = [sys.executable, "-m", "toolpool.ray.tether", str(os.getpid()), "--", *daemon]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPOOL_")}
        env.update(self._env)
        spawned: list[subprocess.Popen[bytes] | OSError] = []
        ready = threading.Event()

        def keep() -> None:
            try:
                with open(log, "ab") as errors:
                    process = subprocess.Popen(
                        argv,
                        cwd=self._root,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=errors,
                        start_new_session=True,
                    )
                spawned.append(process)
            except OSError as exc:
                spawned.append(exc)
                return
            finally:
                ready.set()
            process.wait()

        self._keeper = threading.Thread(target=keep, name="toolpool-daemon", daemon=True)
        self._keeper.start()
        ready.wait()
        outcome = spawned[0]
        if isinstance(outcome, OSError):
            raise ClusterError(f"the daemon could not be started: {outcome}")
        self._process = outcome
        return outcome

    def _write_keys(self, keys: Path) -> tuple[Path, Path]:
        """The server's key file and the directory of the one authorized client key
        (the driver's), in zmq.auth's format: the daemon's curve settings."""
        authorized = keys / "authorized"
        authorized.mkdir(parents=True, mode=0o700)
        keys.chmod(0o700)
        secret_file = keys / "server.key_secret"
        _write_key_file(secret_file, zmq.curve_public(self._server_secret), self._server_secret)
        _write_key_file(authorized / "driver.key", self._client_public)
        return secret_file, authorized

    def _config(self, root: Path, secret_file: Path, authorized: Path) -> dict[str, Any]:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return {
            **self._settings,
            "runtime_dir": str(root / "rt"),
            "tcp": f"{host}:0",  # any free port: the daemon's endpoint file says which
            "curve_secret_key": str(secret_file),
            "curve_authorized_keys": str(authorized),
            "log_file": str(root / "daemon.log"),
        }

    def stop(self) -> str:
        """Stop the daemon (SIGTERM: it drains for its drain_grace; then its whole tree
        is ended) and remove everything this actor made. How far it had to go."""
        how = "not running"
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            drain = float(self._settings.get("drain_grace", DEFAULTS["drain_grace"]))
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(drain + STOP_GRACE)
            how = "stopped"
            if process.poll() is None:
                how = terminate(ProcessTree(process.pid), grace=STOP_GRACE).escalation.name
        if self._keeper is not None:
            self._keeper.join(STOP_GRACE)
        with self._lock:
            self._workspaces.clear()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        return how

    def __del__(self) -> None:
        # The actor's process exits without stop (ray.kill, the end of the job): its
        # daemon's tree ends now rather than at the death signal, and its files go.
        process = getattr(self, "_process", None)
        if process is not None and process.poll() is None:
            terminate(ProcessTree(process.pid), grace=1.0)
        root = getattr(self, "_root", None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def statistics(self) -> NodeStatistics:
        process = self._process
        return NodeStatistics(
            self.node_id,
            os.getpid(),
            None if process is None else process.pid,
            None if process is None else process.poll(),
            None if self._root is None else str(self._root),
        )

    # -- workspaces ----------------------------------------------------------------------

    def local(self, path: str) -> str:
        """A directory already on the node: checked, never removed."""
        return workspace.existing(path)

    def unpack(self, key: str, data: bytes) -> str:
        """A tarball unpacked into a directory of the session ``key``'s own."""
        into = self._new_workspace(key)
        try:
            workspace.unpack(data, into)
        except WorkspaceError:
            self.release(key)
            raise
        return str(into)

    def clone(self, key: str, source: workspace.GitSource, timeout: float) -> str:
        """A repository cloned and checked out into a directory of ``key``'s own."""
        into = self._new_workspace(key)
        try:
            workspace.clone(source, into, timeout)
        except WorkspaceError:
            self.release(key)
            raise
        return str(into)

    def release(self, key: str) -> bool:
        """Remove the session ``key``'s directory; whether there was one."""
        with self._lock:
            where = self._workspaces.pop(key, None)
        if where is None:
            return False
        shutil.rmtree(where, ignore_errors=True)
        return True

    def _new_workspace(self, key: str) -> Path:
        if self._root is None:
            raise ClusterError("the node's daemon is not started")
        if not re.fullmatch(r"[0-9a-f]{32}", key):
            raise WorkspaceError(f"not a session key: {key!r}")
        parent = self._root / "workspaces"
        parent.mkdir(mode=0o700, exist_ok=True)
        into = Path(tempfile.mkdtemp(prefix=f"{key[:8]}-", dir=parent))
        with self._lock:
            if key in self._workspaces:
                shutil.rmtree(into)
                raise WorkspaceError(f"session {key} has a workspace already")
            self._workspaces[key] = into
        return into


def remove_stale_roots(base: Path) -> list[str]:
    """The directories of actors that are gone (``toolpool-ray-<pid>-…`` whose pid is
    not alive): what a killed actor left. Their names."""
    removed = []
    for stale in base.glob(f"{ROOT_PREFIX}*"):
        pid = stale.name.removeprefix(ROOT_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or stale.is_symlink() or not stale.is_dir():
            continue
        if int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale.name)
    return removed


def _write_key_file(path: Path, public: bytes, secret: bytes | None = None) -> None:
    """A key file in zmq.auth's format (``zmq.auth.load_certificate`` reads it)."""
    lines = ["metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


# --- the daemon's TOML file -------------------------------------------------------------


def to_toml(settings: Mapping[str, Any]) -> str:
    """``settings`` as a TOML document: scalars and lists of scalars first, then each
    mapping as a table (``limits``, ``tool_limits.<tool>``)."""
    lines: list[str] = []
    _table(settings, (), lines)
    return "\n".join(lines) + "\n"


def _table(values: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    tables = {k: v for k, v in values.items() if isinstance(v, Mapping)}
    if path and (len(tables) < len(values) or not values):
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for key, value in values.items():
        if key not in tables:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, table in tables.items():
        _table(table, (*path, key), lines)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | os.PathLike):
        return json.dumps(os.fspath(value), ensure_ascii=False)  # JSON's escapes are TOML's
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return "[" + ", ".join(_value(v) for v in items) + "]"
    raise ToolpoolError(f"a daemon setting cannot be {type(value).__name__}: {value!r}")
