"""The nodes of a ``ToolpoolCluster``: one ``NodeDaemon`` actor per Ray node, kept in
step with Ray's node table.

A watcher thread reads the node table every ``refresh_seconds`` (and the cluster's
``session()``/``status()`` do when it is older): an actor is started on each node
that joined, with the daemon's server key the driver made for it, and the nodes
that left are marked lost; each ready daemon's status (sessions, queued calls) is
polled as often, for placement. After a transport failure, ``diagnose`` looks into
whether the node is lost (it left the cluster, its actor or daemon died).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray
import zmq
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from toolpool.client import Client, ClientError
from toolpool.errors import ToolpoolError
from toolpool.ray.errors import ClusterError, NodeLost
from toolpool.ray.node import NodeDaemon, NodeEndpoint
from toolpool.ray.placement import NodeLoad, NodeState

log = logging.getLogger("toolpool.ray")

# A lost node's signs take a moment to show (its raylet's end reaches the node table
# after its processes' end reaches us): how long a transport failure is looked into.
LOSS_GRACE = 10.0
ACTOR_ANSWER = 1.0  # seconds a living actor takes to answer ``statistics``


@dataclass
class DaemonNode:
    """What the driver knows of one node (changed under the table's lock)."""

    node_id: str
    address: str
    server_public: bytes
    actor: Any
    starting: Any  # the ObjectRef of the actor's start(), until it is collected
    state: NodeState = NodeState.STARTING
    endpoint: NodeEndpoint | None = None
    control: Client | None = None
    error: str | None = None
    sessions: int = 0
    queued_calls: int = 0
    placed: int = 0
    polled_at: float = -math.inf
    daemon: dict[str, Any] | None = None

    def load(self) -> NodeLoad:
        return NodeLoad(self.node_id, self.state, self.sessions, self.queued_calls, self.placed)


class NodeTable:
    """The nodes that get a daemon (``node_filter`` of a ``ray.nodes()`` entry), by
    Ray node id: read and changed under ``lock`` (the cluster's), kept current by a
    watcher thread from ``start()`` to ``close()``. ``client_keys`` is the driver's
    CURVE key pair."""

    def __init__(
        self,
        lock: threading.RLock,
        client_keys: tuple[bytes, bytes],
        *,
        settings: Mapping[str, Any],
        env: Mapping[str, str],
        node_filter: Callable[[Mapping[str, Any]], bool] | None,
        base_dir: str | None,
        start_timeout: float,
        refresh_seconds: float,
        client_timeout: float,
        actor_concurrency: int,
    ) -> None:
        self.lock = lock
        self.refresh_seconds = refresh_seconds
        self.start_timeout = start_timeout
        self.client_timeout = client_timeout
        self.nodes: dict[str, DaemonNode] = {}
        self._client_keys = client_keys
        self._settings = dict(settings)
        self._env = dict(env)
        self._filter = node_filter
        self._base_dir = base_dir
        self._actor: Any = ray.remote(NodeDaemon)
        self._actor_concurrency = actor_concurrency
        self._reconciled_at = -math.inf
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="toolpool-ray", daemon=True)

    def start(self) -> None:
        """A daemon on every node there is (waiting up to ``start_timeout``), then the
        watcher."""
        with self.lock:
            self.reconcile()
            self.collect(list(self.nodes.values()), self.start_timeout)
        self._watcher.start()

    def close(self) -> None:
        """The watcher stopped (the nodes' daemons stay: ``stop``)."""
        self._closed.set()
        if self._watcher.is_alive():
            self._watcher.join()

    def raise_if_lost(self, node_id: str) -> None:
        """``NodeLost`` when the node is known to be lost (no I/O)."""
        node = self.nodes.get(node_id)
        if node is not None and node.state is NodeState.LOST:
            raise NodeLost(node_id, node.error or "it left the Ray cluster")

    def diagnose(self, node_id: str) -> str | None:
        """After a transport failure: why the node is lost (it left the Ray cluster,
        its actor or daemon died), looked into for up to ``LOSS_GRACE`` seconds;
        None when it is not (the failure was something else)."""
        with self.lock:
            node = self.nodes.get(node_id)
        if node is None:
            return None
        deadline = time.monotonic() + LOSS_GRACE
        while node.state is not NodeState.LOST:
            reason = _why_lost(node)
            if reason is not None:
                with self.lock:
                    self.lose(node, reason)
            elif time.monotonic() >= deadline:
                return None
            else:
                time.sleep(0.2)
        return node.error

    def _watch(self) -> None:
        while not self._closed.wait(self.refresh_seconds):
            try:
                with self.lock:
                    if not self._closed.is_set():
                        self.reconcile()
                        self.collect(list(self.nodes.values()), 0)
            except Exception:  # Ray went away under us: the next session() will say so
                log.exception("toolpool.ray: reading the Ray cluster's nodes failed")

    def refresh(self, force: bool = False) -> None:
        if force or time.monotonic() - self._reconciled_at >= self.refresh_seconds:
            self.reconcile()
        self.collect(list(self.nodes.values()), 0)
        self._poll(force)

    def reconcile(self) -> None:
        """Ray's node table against ours: an actor for each node that joined, the
        nodes that left marked lost."""
        alive = {
            n["NodeID"]: n
            for n in _ray_nodes()
            if n.get("Alive") and (self._filter is None or self._filter(n))
        }
        self._reconciled_at = time.monotonic()
        for node in list(self.nodes.values()):
            if node.node_id not in alive and node.state is not NodeState.LOST:
                self.lose(node, "it left the Ray cluster")
        for node_id, info in alive.items():
            if node_id not in self.nodes:
                self._launch(node_id, str(info["NodeManagerAddress"]))

    def _launch(self, node_id: str, address: str) -> None:
        server_public, server_secret = zmq.curve_keypair()
        actor = self._actor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            num_cpus=0,  # it waits on a process and unpacks files: no CPU slot of the node
            max_concurrency=self._actor_concurrency,  # workspaces prepared side by side
            max_restarts=0,  # a new actor would not have its predecessor's daemon
        ).remote(
            node_id,
            address,
            server_secret,
            self._client_keys[0],
            self._settings,
            self._env,
            self._base_dir,
        )
        starting = actor.start.remote(self.start_timeout)
        self.nodes[node_id] = DaemonNode(node_id, address, server_public, actor, starting)

    def collect(self, nodes: list[DaemonNode], timeout: float) -> None:
        """The starts of ``nodes`` that have ended (waiting up to ``timeout`` for all)."""
        waiting = [n for n in nodes if n.state is NodeState.STARTING]
        if not waiting:
            return
        ready, _ = ray.wait(
            [n.starting for n in waiting], num_returns=len(waiting), timeout=timeout
        )
        done = set(ready)
        for node in waiting:
            if node.starting not in done:
                if timeout > 0:
                    node.state, node.error = NodeState.FAILED, "its daemon did not start in time"
                continue
            try:
                endpoint: NodeEndpoint = get(node.starting)
                if endpoint.server_public_key != node.server_public:
                    raise ClusterError("its daemon does not hold the key the driver made")
                control = Client(
                    endpoint.endpoint,
                    curve=(node.server_public, *self._client_keys),
                    timeout=self.client_timeout,
                    name="toolpool-ray-control",
                )
                control.connect()
            except (RayError, ToolpoolError) as exc:
                node.state, node.error = NodeState.FAILED, str(exc)
                log.warning("toolpool.ray: no daemon on node %s: %s", node.node_id[:12], exc)
                continue
            node.endpoint, node.control, node.state = endpoint, control, NodeState.READY

    def _poll(self, force: bool) -> None:
        """The ready daemons' status, when it is older than ``refresh_seconds``."""
        now = time.monotonic()
        for node in self.nodes.values():
            if node.state is not NodeState.READY or node.control is None:
                continue
            if not force and now - node.polled_at < self.refresh_seconds:
                continue
            try:
                status = node.control.status()
            except ClientError as exc:
                node.error = f"its daemon's status: {exc}"
                continue
            node.daemon = status
            node.sessions = len(status.get("sessions", ()))
            # Calls held at busy workers wait as much as those queued for one.
            node.queued_calls = int(status.get("queued_calls", 0)) + int(
                status.get("held_calls", 0)
            )
            node.placed, node.polled_at, node.error = 0, now, None

    def lose(self, node: DaemonNode, reason: str) -> None:
        if node.state is NodeState.LOST:
            return
        log.warning("toolpool.ray: node %s is lost: %s", node.node_id[:12], reason)
        node.state, node.error = NodeState.LOST, reason
        if node.control is not None:
            node.control.close()
            node.control = None

    def stop(self) -> None:
        """Every node's daemon stopped (its workers with it) and its actor ended."""
        with self.lock:
            nodes = list(self.nodes.values())
            for node in nodes:
                if node.control is not None:
                    node.control.close()
                    node.control = None
            stops = {
                n.node_id: n.actor.stop.remote() for n in nodes if n.state is not NodeState.LOST
            }
            for node_id, ref in stops.items():
                try:
                    ray.get(ref, timeout=self.start_timeout)
                except RayError as exc:
                    log.warning("toolpool.ray: node %s did not stop: %s", node_id[:12], exc)
            for node in nodes:
                with contextlib.suppress(RayError):
                    ray.kill(node.actor)


def get(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get``, with a task's own error (a WorkspaceError, a ClusterError) raised
    as itself rather than wrapped in Ray's."""
    try:
        return ray.get(ref, timeout=timeout)
    except RayTaskError as exc:
        if isinstance(exc.cause, ToolpoolError):
            raise exc.cause from None
        raise


def _ray_nodes() -> list[dict[str, Any]]:
    """Ray's node table, from its control store (GCS): every node, alive or not."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def _why_lost(node: DaemonNode) -> str | None:
    alive = any(n["NodeID"] == node.node_id and n.get("Alive") for n in _ray_nodes())
    if not alive:
        return "it left the Ray cluster"
    try:
        stats = ray.get(node.actor.statistics.remote(), timeout=ACTOR_ANSWER)
    except RayActorError:
        return "its toolpool actor died, and its daemon with it"
    except GetTimeoutError:
        return None
    if stats.daemon_exit is not None:
        return f"its daemon exited (status {stats.daemon_exit})"
    return None
