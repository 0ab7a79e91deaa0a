"""Every message: the ``Message`` union, and the table of types derived from it.

The union is the one list of message classes: ``MESSAGE_CLASSES`` (type name →
class) is read from it, and each class's field checks from its type hints
(``fields.struct``). A message type without its class, or two classes of one type,
fail here, at import.
"""

from __future__ import annotations

from typing import Any, TypeAlias, get_args

from toolpool.protocol.bridge import BridgeReady, McpCall, McpCancel, McpProgress, McpResult
from toolpool.protocol.client import (
    Accepted,
    Ack,
    Append,
    ApprovalReply,
    ApprovalRequest,
    Branch,
    Bye,
    CancelCall,
    Chunk,
    CloseSession,
    EndTurn,
    Error,
    Hello,
    OpenSession,
    Ping,
    Reply,
    SessionOpened,
    Status,
    Steer,
    Submit,
    Tools,
    TurnEvent,
    Welcome,
)
from toolpool.protocol.fields import Struct, struct
from toolpool.protocol.kinds import MessageType
from toolpool.protocol.wire import (
    Cancel,
    Execute,
    Exited,
    Heartbeat,
    Preview,
    Progress,
    Ready,
    Result,
    ShellReply,
    ShellRequest,
    Shutdown,
    Spawn,
    Spawned,
    Withdrawn,
)

Message: TypeAlias = (
    # pool ⇄ worker, pool ⇄ zygote
    Ready
    | Execute
    | Progress
    | Preview
    | Result
    | Heartbeat
    | Shutdown
    | ShellRequest
    | ShellReply
    | Cancel
    | Withdrawn
    | Spawn
    | Spawned
    | Exited
    # client ⇄ daemon
    | Hello
    | Welcome
    | OpenSession
    | SessionOpened
    | CloseSession
    | Submit
    | Accepted
    | Append
    | CancelCall
    | EndTurn
    | TurnEvent
    | Steer
    | Branch
    | ApprovalRequest
    | ApprovalReply
    | Status
    | Tools
    | Reply
    | Error
    | Ping
    | Bye
    | Chunk
    | Ack
    # MCP bridges
    | BridgeReady
    | McpCall
    | McpProgress
    | McpResult
    | McpCancel
)


def _table() -> dict[str, type[Any]]:
    table: dict[str, type[Any]] = {}
    for cls in get_args(Message):
        kind: MessageType = cls.type
        if kind.value in table:
            raise TypeError(f"{cls.__name__} and {table[kind.value].__name__} are both {kind}")
        table[kind.value] = cls
    missing = [kind.value for kind in MessageType if kind.value not in table]
    if missing:
        raise TypeError(f"message types without a class in Message: {missing}")
    return table


MESSAGE_CLASSES: dict[str, type[Any]] = _table()
STRUCTS: dict[str, Struct] = {kind: struct(cls) for kind, cls in MESSAGE_CLASSES.items()}
