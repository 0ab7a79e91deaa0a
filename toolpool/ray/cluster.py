"""``ToolpoolCluster``: one toolpool daemon on each node of a Ray cluster, and
sessions placed on them.

The driver (the program that calls ``ray.init``) makes the CURVE keys: one server
key pair per node and one client key pair for itself. Each node gets a
``NodeDaemon`` actor pinned there (node affinity, not soft), which writes the
daemon's configuration, starts it on the node's IP and prepares workspaces. The
driver talks to each daemon as any client would, over TCP with CURVE: a control
client for its status, and one ``Client`` per session (a sync client belongs to one
thread; many sessions are used from many threads).

Nodes come and go: a watcher thread reads Ray's node table every
``refresh_seconds`` (and ``session()``/``status()`` do when it is older), starts an
actor on each node that joined and marks those that left as lost. A session on a
lost node raises ``NodeLost``; new sessions go elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray
import zmq
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from toolpool.client import ApprovalRequested, Client, ClientError, RequestFailed, Session
from toolpool.errors import ToolpoolError
from toolpool.ray.errors import ClusterError, NodeLost
from toolpool.ray.node import NodeDaemon, NodeEndpoint
from toolpool.ray.placement import NodeLoad, NodeState, NoNode, choose_node
from toolpool.ray.session import ClusterSession
from toolpool.ray.workspace import GitSource

log = logging.getLogger("toolpool.ray")

# A lost node's signs take a moment to show (its raylet's end reaches the node table
# after its processes' end reaches us): how long a transport failure is looked into.
LOSS_GRACE = 10.0
ACTOR_ANSWER = 1.0  # seconds a living actor takes to answer ``statistics``

WorkspaceSource = str | os.PathLike[str] | bytes | GitSource | Any  # Any: a ray.ObjectRef
ApprovalHandler = Callable[[ApprovalRequested], Any]


@dataclass
class _Node:
    """What the driver knows of one node (changed under the cluster's lock)."""

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


class ToolpoolCluster:
    """One toolpool daemon per Ray node; ``session()`` places a session on one.

    ``settings`` are the daemons' settings (DaemonConfig names: ``min_workers``,
    ``limits`` …, but the address, keys and runtime directory, which the cluster
    sets); ``env`` is added to the daemons' environment (``PYTHONPATH`` for tool
    modules); ``node_filter(node)`` chooses the nodes (a ``ray.nodes()`` entry) that
    get a daemon; ``base_dir`` is where, on each node, the actor keeps the daemon's
    files and the workspaces (default: the node's temporary directory). Needs
    ``ray.init()`` first. A context manager; ``shutdown()`` stops everything.
    """

    def __init__(
        self,
        *,
        settings: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        node_filter: Callable[[Mapping[str, Any]], bool] | None = None,
        base_dir: str | None = None,
        start_timeout: float = 120.0,
        refresh_seconds: float = 1.0,
        client_timeout: float = 30.0,
        git_timeout: float = 600.0,
        actor_concurrency: int = 16,
    ) -> None:
        if not ray.is_initialized():
            raise ClusterError("ToolpoolCluster needs a Ray cluster: call ray.init() first")
        self.refresh_seconds = refresh_seconds
        self._settings = dict(settings or {})
        self._env = dict(env or {})
        self._filter = node_filter
        self._base_dir = base_dir
        self._start_timeout = start_timeout
        self._client_timeout = client_timeout
        self._git_timeout = git_timeout
        self._actor: Any = ray.remote(NodeDaemon)
        self._actor_concurrency = actor_concurrency
        self._client_public, self._client_secret = zmq.curve_keypair()
        self._nodes: dict[str, _Node] = {}
        self._sessions: dict[str, ClusterSession] = {}
        self._lock = threading.RLock()
        self._reconciled_at = -math.inf
        self._closed = threading.Event()
        with self._lock:
            self._reconcile()
            self._collect(list(self._nodes.values()), start_timeout)
        self._watcher = threading.Thread(target=self._watch, name="toolpool-ray", daemon=True)
        self._watcher.start()

    def __enter__(self) -> ToolpoolCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        with self._lock:
            states = [n.state.value for n in self._nodes.values()]
            sessions = len(self._sessions)
        counted = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
        return f"<ToolpoolCluster nodes: {counted or 'none'}; {sessions} sessions>"

    # -- sessions ------------------------------------------------------------------------

    def session(
        self,
        workspace_source: WorkspaceSource,
        *,
        node: str | None = None,
        on_approval: ApprovalHandler | None = None,
        **options: Any,
    ) -> ClusterSession:
        """Open a session on ``node`` (a Ray node id) or on the least loaded node,
        on a workspace prepared there from ``workspace_source`` (a path on the node,
        a tarball as bytes or as an ObjectRef, a ``GitSource``). ``options`` are
        ``Client.session``'s. A node found lost on the way is left for another
        (unless pinned: then ``NodeLost``)."""
        tried: set[str] = set()
        while True:
            with self._lock:
                self._check_open()
                self._refresh()
                target = self._pick(node, tried)
                target.placed += 1
            try:
                return self._open(target, workspace_source, on_approval, options)
            except NodeLost:
                if node is not None:
                    raise
                tried.add(target.node_id)

    def _pick(self, pinned: str | None, tried: set[str]) -> _Node:
        if pinned is not None:
            if pinned not in self._nodes:
                self._reconcile()
            chosen = self._nodes.get(pinned)
            if chosen is None:
                raise ClusterError(f"no node {pinned[:12]} with a toolpool daemon in the cluster")
            if chosen.state is NodeState.LOST:
                raise NodeLost(pinned, chosen.error or "it left the Ray cluster")
            self._collect([chosen], self._start_timeout)
        elif not any(n.state is NodeState.READY for n in self._nodes.values()):
            self._collect(list(self._nodes.values()), self._start_timeout)
        loads = [n.load() for n in self._nodes.values() if n.node_id not in tried]
        try:
            return self._nodes[choose_node(loads, pinned)]
        except NoNode as exc:
            errors = {n.node_id[:12]: n.error for n in self._nodes.values() if n.error}
            raise ClusterError(f"{exc}{f' ({errors})' if errors else ''}") from None

    def _open(
        self,
        target: _Node,
        source: WorkspaceSource,
        on_approval: ApprovalHandler | None,
        options: dict[str, Any],
    ) -> ClusterSession:
        key = uuid.uuid4().hex
        assert target.endpoint is not None
        made = not isinstance(source, str | os.PathLike)
        client = None
        try:
            workspace = self._prepare(target, key, source)
            client = Client(
                target.endpoint.endpoint,
                curve=(target.server_public, self._client_public, self._client_secret),
                timeout=self._client_timeout,
                name="toolpool-ray",
            )
            client.connect()
            session = client.session(workspace, on_approval=on_approval, **options)
        except BaseException as exc:
            if client is not None:
                client.close()
            if made:
                with contextlib.suppress(RayError):
                    ray.get(target.actor.release.remote(key), timeout=self._client_timeout)
            with self._lock:
                target.placed -= 1
            if isinstance(exc, RayActorError | ClientError) and not isinstance(exc, RequestFailed):
                reason = self.diagnose(target.node_id)
                if reason is not None:
                    raise NodeLost(target.node_id, reason) from exc
            raise
        placed = ClusterSession(self, target.node_id, key, client, session, workspace, made)
        with self._lock:
            self._sessions[key] = placed
        return placed

    def _prepare(self, node: _Node, key: str, source: WorkspaceSource) -> str:
        if isinstance(source, GitSource):
            ref = node.actor.clone.remote(key, source, self._git_timeout)
        elif isinstance(source, bytes | bytearray | memoryview):
            ref = node.actor.unpack.remote(key, bytes(source))
        elif isinstance(source, ray.ObjectRef):
            ref = node.actor.unpack.remote(key, source)  # Ray hands the actor the bytes
        elif isinstance(source, str | os.PathLike):
            ref = node.actor.local.remote(os.fspath(source))
        else:
            raise TypeError(
                "workspace_source: expected a path on the node, a tarball (bytes or an "
                f"ObjectRef) or a GitSource, not {type(source).__name__}"
            )
        return str(_get(ref))

    def adopt(self, owner: ClusterSession, session: Session) -> ClusterSession:
        """A fork of ``owner``'s, on its node, with its client and workspace."""
        fork = ClusterSession(
            self, owner.node_id, uuid.uuid4().hex, owner.client, session, owner.workspace, False
        )
        fork.owner = owner
        with self._lock:
            self._sessions[fork.key] = fork
            node = self._nodes.get(owner.node_id)
            if node is not None:
                node.placed += 1
        return fork

    def release(self, session: ClusterSession) -> None:
        """A session closed: forget it, and remove the workspace made for it."""
        with self._lock:
            self._sessions.pop(session.key, None)
            node = self._nodes.get(session.node_id)
            if node is None or node.state is NodeState.LOST:
                return
            node.placed -= 1
        if session.made:
            with contextlib.suppress(RayError):
                ray.get(node.actor.release.remote(session.key), timeout=self._client_timeout)

    # -- nodes ---------------------------------------------------------------------------

    def raise_if_lost(self, node_id: str) -> None:
        """``NodeLost`` when the node is known to be lost (no I/O)."""
        node = self._nodes.get(node_id)
        if node is not None and node.state is NodeState.LOST:
            raise NodeLost(node_id, node.error or "it left the Ray cluster")

    def diagnose(self, node_id: str) -> str | None:
        """After a transport failure: why the node is lost (it left the Ray cluster,
        its actor or daemon died), looked into for up to ``LOSS_GRACE`` seconds;
        None when it is not (the failure was something else)."""
        with self._lock:
            node = self._nodes.get(node_id)
        if node is None:
            return None
        deadline = time.monotonic() + LOSS_GRACE
        while node.state is not NodeState.LOST:
            reason = _why_lost(node)
            if reason is not None:
                with self._lock:
                    self._lose(node, reason)
            elif time.monotonic() >= deadline:
                return None
            else:
                time.sleep(0.2)
        return node.error

    def _watch(self) -> None:
        while not self._closed.wait(self.refresh_seconds):
            try:
                with self._lock:
                    if not self._closed.is_set():
                        self._reconcile()
                        self._collect(list(self._nodes.values()), 0)
            except Exception:  # Ray went away under us: the next session() will say so
                log.exception("toolpool.ray: reading the Ray cluster's nodes failed")

    def _refresh(self, force: bool = False) -> None:
        if force or time.monotonic() - self._reconciled_at >= self.refresh_seconds:
            self._reconcile()
        self._collect(list(self._nodes.values()), 0)
        self._poll(force)

    def _reconcile(self) -> None:
        """Ray's node table against ours: an actor for each node that joined, the
        nodes that left marked lost."""
        alive = {
            n["NodeID"]: n
            for n in _ray_nodes()
            if n.get("Alive") and (self._filter is None or self._filter(n))
        }
        self._reconciled_at = time.monotonic()
        for node in list(self._nodes.values()):
            if node.node_id not in alive and node.state is not NodeState.LOST:
                self._lose(node, "it left the Ray cluster")
        for node_id, info in alive.items():
            if node_id not in self._nodes:
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
            self._client_public,
            self._settings,
            self._env,
            self._base_dir,
        )
        starting = actor.start.remote(self._start_timeout)
        self._nodes[node_id] = _Node(node_id, address, server_public, actor, starting)

    def _collect(self, nodes: list[_Node], timeout: float) -> None:
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
                endpoint: NodeEndpoint = _get(node.starting)
                if endpoint.server_public_key != node.server_public:
                    raise ClusterError("its daemon does not hold the key the driver made")
                control = Client(
                    endpoint.endpoint,
                    curve=(node.server_public, self._client_public, self._client_secret),
                    timeout=self._client_timeout,
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
        for node in self._nodes.values():
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

    def _lose(self, node: _Node, reason: str) -> None:
        if node.state is NodeState.LOST:
            return
        log.warning("toolpool.ray: node %s is lost: %s", node.node_id[:12], reason)
        node.state, node.error = NodeState.LOST, reason
        if node.control is not None:
            node.control.close()
            node.control = None

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise ClusterError("the cluster is shut down")

    # -- the whole -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Every node's state and its daemon's status, and the totals."""
        with self._lock:
            self._check_open()
            self._refresh(force=True)
            nodes = {
                n.node_id: {
                    "state": n.state.value,
                    "address": n.address,
                    "endpoint": None if n.endpoint is None else n.endpoint.endpoint,
                    "server_public_key": n.server_public.decode(),
                    "daemon_pid": None if n.endpoint is None else n.endpoint.daemon_pid,
                    "actor_pid": None if n.endpoint is None else n.endpoint.actor_pid,
                    "sessions": n.sessions if n.state is NodeState.READY else 0,
                    "queued_calls": n.queued_calls if n.state is NodeState.READY else 0,
                    "error": n.error,
                    "daemon": n.daemon if n.state is NodeState.READY else None,
                }
                for n in self._nodes.values()
            }
            placed = len(self._sessions)
        return {
            "nodes": nodes,
            "ready_nodes": sum(n["state"] == NodeState.READY.value for n in nodes.values()),
            "sessions": sum(n["sessions"] for n in nodes.values()),
            "queued_calls": sum(n["queued_calls"] for n in nodes.values()),
            "cluster_sessions": placed,  # open sessions this driver placed
        }

    def shutdown(self) -> None:
        """Close every session, stop every daemon (its workers with it), remove every
        workspace and directory the actors made, end the actors. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._watcher.join()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            with contextlib.suppress(ClientError, RayError):
                session.close()
        with self._lock:
            nodes = list(self._nodes.values())
            for node in nodes:
                if node.control is not None:
                    node.control.close()
                    node.control = None
            stops = {
                n.node_id: n.actor.stop.remote() for n in nodes if n.state is not NodeState.LOST
            }
            for node_id, ref in stops.items():
                try:
                    ray.get(ref, timeout=self._start_timeout)
                except RayError as exc:
                    log.warning("toolpool.ray: node %s did not stop: %s", node_id[:12], exc)
            for node in nodes:
                with contextlib.suppress(RayError):
                    ray.kill(node.actor)


def _get(ref: Any, timeout: float | None = None) -> Any:
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


def _why_lost(node: _Node) -> str | None:
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
