"""``ToolpoolCluster``: one toolpool daemon on each node of a Ray cluster, and
sessions placed on them.

The driver (the program that calls ``ray.init``) makes the CURVE keys: one server
key pair per node and one client key pair for itself. Each node gets a
``NodeDaemon`` actor pinned there (node affinity, not soft), which writes the
daemon's configuration, starts it on the node's IP and prepares workspaces. The
driver talks to each daemon as any client would, over TCP with CURVE: a control
client for its status, and one ``Client`` per session (a sync client belongs to one
thread; many sessions are used from many threads).

Nodes come and go (``nodes.py``, the ``NodeTable``: an actor on each node that
joined, those that left marked lost). A session on a lost node raises ``NodeLost``;
new sessions go elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import ray
import zmq
from ray.exceptions import RayActorError, RayError

from toolpool.client import ApprovalRequested, Client, ClientError, RequestFailed, Session
from toolpool.ray.errors import ClusterError, NodeLost
from toolpool.ray.nodes import DaemonNode, NodeTable, get
from toolpool.ray.placement import NodeState, NoNode, choose_node
from toolpool.ray.session import ClusterSession
from toolpool.ray.workspace import GitSource

log = logging.getLogger("toolpool.ray")

WorkspaceSource = str | os.PathLike[str] | bytes | GitSource | Any  # Any: a ray.ObjectRef
ApprovalHandler = Callable[[ApprovalRequested], Any]


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
        self._start_timeout = start_timeout
        self._client_timeout = client_timeout
        self._git_timeout = git_timeout
        self._client_keys = zmq.curve_keypair()
        self._sessions: dict[str, ClusterSession] = {}
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._table = NodeTable(
            self._lock,
            self._client_keys,
            settings=settings or {},
            env=env or {},
            node_filter=node_filter,
            base_dir=base_dir,
            start_timeout=start_timeout,
            refresh_seconds=refresh_seconds,
            client_timeout=client_timeout,
            actor_concurrency=actor_concurrency,
        )
        self._nodes = self._table.nodes
        self._table.start()

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
                self._table.refresh()
                target = self._pick(node, tried)
                target.placed += 1
            try:
                return self._open(target, workspace_source, on_approval, options)
            except NodeLost:
                if node is not None:
                    raise
                tried.add(target.node_id)

    def _pick(self, pinned: str | None, tried: set[str]) -> DaemonNode:
        if pinned is not None:
            if pinned not in self._nodes:
                self._table.reconcile()
            chosen = self._nodes.get(pinned)
            if chosen is None:
                raise ClusterError(f"no node {pinned[:12]} with a toolpool daemon in the cluster")
            if chosen.state is NodeState.LOST:
                raise NodeLost(pinned, chosen.error or "it left the Ray cluster")
            self._table.collect([chosen], self._start_timeout)
        elif not any(n.state is NodeState.READY for n in self._nodes.values()):
            self._table.collect(list(self._nodes.values()), self._start_timeout)
        loads = [n.load() for n in self._nodes.values() if n.node_id not in tried]
        try:
            return self._nodes[choose_node(loads, pinned)]
        except NoNode as exc:
            errors = {n.node_id[:12]: n.error for n in self._nodes.values() if n.error}
            raise ClusterError(f"{exc}{f' ({errors})' if errors else ''}") from None

    def _open(
        self,
        target: DaemonNode,
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
                curve=(target.server_public, *self._client_keys),
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

    def _prepare(self, node: DaemonNode, key: str, source: WorkspaceSource) -> str:
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
        return str(get(ref))

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

    # -- nodes (nodes.py) -------------------------------------------------------------------

    def raise_if_lost(self, node_id: str) -> None:
        """``NodeLost`` when the node is known to be lost (no I/O)."""
        self._table.raise_if_lost(node_id)

    def diagnose(self, node_id: str) -> str | None:
        """After a transport failure: why the node is lost, or None when it is not."""
        return self._table.diagnose(node_id)

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise ClusterError("the cluster is shut down")

    # -- the whole -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Every node's state and its daemon's status, and the totals."""
        with self._lock:
            self._check_open()
            self._table.refresh(force=True)
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
        self._table.close()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            with contextlib.suppress(ClientError, RayError):
                session.close()
        self._table.stop()
