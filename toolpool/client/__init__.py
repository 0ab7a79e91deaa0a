"""The client library: programs submit turns to the toolpool daemon (SPEC D5).

``Client`` blocks; ``AsyncClient`` is for asyncio. Both are thin drivers of one
sans-IO connection (``connection.Connection``: requests → frames, frames → replies
and events, all the routing and state); each owns its socket and its way of
waiting, nothing more. They raise only transport errors (``ClientError`` and kin)
and hand tool failures back as results. The library imports the protocol and the
data model, never the daemon.
"""

from toolpool.client.aio import AsyncClient, AsyncSession, AsyncTurn
from toolpool.client.branching import (
    Change,
    Checkpoint,
    Checkpoints,
    CommitConflict,
    Rewound,
    SkippedCheckpoint,
)
from toolpool.client.core import ApprovalRequested
from toolpool.client.errors import (
    ClientError,
    ClientProtocolError,
    ClientTimeout,
    DaemonUnavailable,
    RequestFailed,
)
from toolpool.client.sync import Client, Session, Turn

__all__ = [
    "ApprovalRequested",
    "AsyncClient",
    "AsyncSession",
    "AsyncTurn",
    "Change",
    "Checkpoint",
    "Checkpoints",
    "Client",
    "ClientError",
    "ClientProtocolError",
    "ClientTimeout",
    "CommitConflict",
    "DaemonUnavailable",
    "RequestFailed",
    "Rewound",
    "Session",
    "SkippedCheckpoint",
    "Turn",
]
