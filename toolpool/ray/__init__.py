"""toolpool on a Ray cluster: one daemon per node, sessions placed on nodes.

    import ray
    from toolpool.ray import GitSource, ToolpoolCluster

    ray.init()
    with ToolpoolCluster(settings={"max_workers": 8}) as cluster:
        with cluster.session(GitSource("https://…/repo.git", "v1.2")) as session:
            results = session.submit(model_message).results_as("openai")

``ToolpoolCluster`` runs a ``NodeDaemon`` actor on every node (pinned there), which
supervises an ordinary toolpool daemon on the node's address, with CURVE keys the
driver made. ``cluster.session()`` picks the least loaded node (or the one named),
prepares the workspace there — a path on the node, a tarball (``pack``) shipped
through Ray's object store, or a git clone — and returns an ordinary client session
behind a proxy that raises ``NodeLost`` once its node is gone. The pipeline, the
scheduler, the sandbox and the provider formats are the daemon's, unchanged: this
package only places and prepares. It needs the ``ray`` extra
(``pip install 'toolpool[ray]'``).
"""

from toolpool.ray.cluster import ToolpoolCluster
from toolpool.ray.errors import ClusterError, NodeLost, WorkspaceError
from toolpool.ray.node import NodeDaemon, NodeEndpoint, NodeStatistics
from toolpool.ray.placement import NodeLoad, NodeState, choose_node
from toolpool.ray.session import ClusterSession, ClusterTurn
from toolpool.ray.workspace import GitSource, pack

__all__ = [
    "ClusterError",
    "ClusterSession",
    "ClusterTurn",
    "GitSource",
    "NodeDaemon",
    "NodeEndpoint",
    "NodeLoad",
    "NodeLost",
    "NodeState",
    "NodeStatistics",
    "ToolpoolCluster",
    "WorkspaceError",
    "choose_node",
    "pack",
]
