"""What ``toolpool.ray`` raises, beside the client library's own errors."""

from __future__ import annotations

from toolpool.client import DaemonUnavailable
from toolpool.errors import ToolpoolError


class ClusterError(ToolpoolError):
    """The cluster cannot place a session: no node ready, an unknown node, Ray not
    initialised, a daemon that did not start."""


class NodeLost(ClusterError, DaemonUnavailable):
    """The session's node left the Ray cluster, or its toolpool actor died (its
    daemon dies with it): the session's calls are gone. A ``DaemonUnavailable``
    too, so code that handles a daemon going away handles this as well."""

    def __init__(self, node_id: str, reason: str) -> None:
        super().__init__(f"node {node_id[:12]} is lost: {reason}")
        self.node_id = node_id
        self.reason = reason


class WorkspaceError(ClusterError):
    """A session's workspace could not be prepared on its node (no such path there,
    a tarball that does not unpack, a clone or checkout that failed)."""
