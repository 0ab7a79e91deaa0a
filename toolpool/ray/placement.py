"""Where a session goes: a decision from the nodes' loads; the cluster does the I/O.

A node's load is what its daemon's status said when it was last polled (open
sessions, queued calls) plus the sessions this driver placed there, less those it
closed, since: so a burst of placements between two polls spreads out instead of
piling onto the node that looked emptiest at the last poll.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class NodeState(StrEnum):
    STARTING = "starting"  # its actor and daemon are on their way up
    READY = "ready"  # its daemon answers; sessions may go there
    FAILED = "failed"  # its daemon did not start (the reason is in the status)
    LOST = "lost"  # the node left the cluster, or its actor died


@dataclass(frozen=True, slots=True)
class NodeLoad:
    node_id: str
    state: NodeState
    sessions: int = 0  # open sessions, as the daemon last said
    queued_calls: int = 0  # calls waiting for a worker, as the daemon last said
    placed: int = 0  # sessions opened (less those closed) by this driver since

    @property
    def load(self) -> int:
        return self.sessions + self.queued_calls + self.placed


class NoNode(Exception):
    """Why no node can take the session (the message says it)."""


def choose_node(nodes: Iterable[NodeLoad], pinned: str | None = None) -> str:
    """The node for the next session: ``pinned`` when the caller named one (it must
    be ready), else the ready node of least load (ties: the lowest node id, so the
    choice is reproducible). Raises ``NoNode`` when there is none."""
    ready = {n.node_id: n for n in nodes if n.state is NodeState.READY}
    if pinned is not None:
        if pinned not in ready:
            raise NoNode(f"node {pinned[:12]} is not ready")
        return pinned
    if not ready:
        raise NoNode("no node of the cluster has a ready toolpool daemon")
    return min(ready.values(), key=lambda n: (n.load, n.node_id)).node_id
