"""A session placed on a node: an ordinary client session behind a thin proxy that
turns the loss of its node into ``NodeLost``.

Every request goes to the toolpool ``Session`` (and ``Turn``) unchanged. Before it,
the proxy asks the cluster whether the node is known to be lost (a flag: no I/O);
after a transport failure, it has the cluster find out (Ray's node table, the
node's actor) and raises ``NodeLost`` when the node is gone. A wait for results is
cut into slices of the cluster's refresh period, so that a node that vanished
without closing its connections (a partition) is noticed within a slice of the
cluster seeing it, instead of at the caller's timeout.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from toolpool.client import Client, ClientError, ClientTimeout, RequestFailed, Session, Turn
from toolpool.client.core import TurnItem, results_as
from toolpool.models import ToolResult
from toolpool.ray.errors import NodeLost

T = TypeVar("T")


class Placement(Protocol):
    """What a session asks of the cluster that placed it (``ToolpoolCluster``)."""

    refresh_seconds: float  # how often the cluster reads Ray's node table

    def raise_if_lost(self, node_id: str) -> None: ...

    def diagnose(self, node_id: str) -> str | None: ...

    def release(self, session: ClusterSession) -> None: ...

    def adopt(self, owner: ClusterSession, session: Session) -> ClusterSession: ...


class ClusterSession:
    """A toolpool session on one node of the cluster (``node_id``), on ``workspace``
    (a path on that node). Use it as a ``toolpool.Session``; ``session`` is the
    client session itself. Closing it closes its client and removes a workspace the
    cluster made for it — once its forks (``fork``), which share both, are closed too."""

    def __init__(
        self,
        cluster: Placement,
        node_id: str,
        key: str,
        client: Client,
        session: Session,
        workspace: str,
        made: bool,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.client = client
        self.session = session
        self.workspace = workspace
        self.made = made  # the cluster made the workspace, and removes it at close
        self._cluster = cluster
        self.closed = False
        self.owner: ClusterSession | None = None  # a fork's: whose client and workspace
        self._forks = 0  # forks open on this session's client and workspace

    @property
    def id(self) -> str:
        return self.session.id

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<ClusterSession {self.id} on node {self.node_id[:12]} "
            f"({state}, workspace {self.workspace})>"
        )

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def guarded(self, request: Callable[[], T]) -> T:
        """``request()``, with the node's loss as ``NodeLost``."""
        self._cluster.raise_if_lost(self.node_id)
        try:
            return request()
        except RequestFailed:
            raise  # the daemon answered: its node is there
        except ClientTimeout:
            self._cluster.raise_if_lost(self.node_id)
            raise
        except ClientError as exc:
            reason = self._cluster.diagnose(self.node_id)
            if reason is not None:
                raise NodeLost(self.node_id, reason) from exc
            raise

    def waited(self, wait: Callable[[float], T], timeout: float | None) -> T:
        """``wait(seconds)`` in slices of the cluster's refresh period until it
        returns or ``timeout`` (None: no end) has passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = self._cluster.refresh_seconds
            if deadline is not None:
                step = max(0.0, min(step, deadline - time.monotonic()))
            try:
                return self.guarded(functools.partial(wait, step))
            except ClientTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def submit(self, calls: Any, **options: Any) -> ClusterTurn:
        """``Session.submit``: ToolCalls or model output; ``format``, ``open``,
        ``events`` as there."""
        return ClusterTurn(self, self.guarded(lambda: self.session.submit(calls, **options)))

    def interrupt(self) -> None:
        self.guarded(self.session.interrupt)

    def abort(self) -> None:
        self.guarded(self.session.abort)

    def fork(self, n: int = 1, at: str | None = None, **options: Any) -> list[ClusterSession]:
        """``Session.fork``: ``n`` sessions at checkpoint ``at`` (now by default), on
        this session's node — their layers are stacked on its (SPEC B12) — sharing its
        client and workspace, which stay until the last of them closes."""
        owner = self.owner or self
        forks = self.guarded(lambda: self.session.fork(n, at, **options))
        owner._forks += len(forks)
        return [self._cluster.adopt(owner, fork) for fork in forks]

    def close(self) -> None:
        """End the session, close its client, release its workspace. Best effort, as
        ``Session.close``: a lost node has ended everything already. A session whose
        forks are open leaves its client and workspace to the last of them."""
        if self.closed:
            return
        self.closed = True
        owner = self.owner or self
        try:
            self.session.close()
        finally:
            if self.owner is not None:
                owner._forks -= 1
                self._cluster.release(self)
            if owner.closed and owner._forks == 0:
                try:
                    owner.client.close()
                finally:
                    self._cluster.release(owner)


class ClusterTurn:
    """A turn of a ``ClusterSession``: ``toolpool.Turn``'s methods, each guarded.
    ``turn`` is the client's turn itself."""

    def __init__(self, session: ClusterSession, turn: Turn) -> None:
        self.session = session
        self.turn = turn
        self.id = turn.id
        self.call_ids = turn.call_ids

    @property
    def events(self) -> list[TurnItem]:
        return self.turn.events

    def __iter__(self) -> Iterator[TurnItem]:
        return self._items(iter(self.turn))

    def follow(self) -> Iterator[TurnItem]:
        return self._items(self.turn.follow())

    def _items(self, items: Iterator[TurnItem]) -> Iterator[TurnItem]:
        while True:
            try:
                yield self.session.guarded(lambda: next(items))
            except StopIteration:
                return

    def results(self, timeout: float | None = None) -> tuple[ToolResult, ...]:
        return self.session.waited(self.turn.results, timeout)

    def results_as(self, format: str, timeout: float | None = None) -> Any:
        """The results in a provider's shape ("openai", "anthropic", …)."""
        return results_as(self.results(timeout), format)

    def result(self, call_id: str, timeout: float | None = None) -> ToolResult:
        return self.session.waited(lambda step: self.turn.result(call_id, step), timeout)

    def add(self, calls: Any, *, format: str | None = None) -> list[str]:
        return self.session.guarded(lambda: self.turn.add(calls, format=format))

    def cancel(self, call_id: str) -> None:
        self.session.guarded(lambda: self.turn.cancel(call_id))

    def close(self) -> None:
        self.session.guarded(self.turn.close)

    def interrupt(self) -> None:
        self.session.interrupt()

    def abort(self) -> None:
        self.session.abort()
