"""The wire format: every message that crosses a process boundary, and its codec.

One frozen dataclass per message type, whose docstring says who sends it and what
answers it (``docs/protocol.md`` puts them together, with a turn's sequence):

- ``wire``: pool ⇄ worker (``Execute`` → ``Progress``… → ``Result``; a call's
  ``ShellRequest`` → ``ShellReply``) and pool ⇄ zygote;
- ``client``: client ⇄ daemon (sessions, turns, approvals, status);
- ``bridge``: MCP bridges ⇄ daemon and workers;
- ``messages``: the ``Message`` union, the one list the type table is derived from;
- ``fields``: the field checks, derived from the classes' type hints;
- ``frames``: ``encode``/``decode`` (``ProtocolError``, and only that, for bad bytes)
  and length-prefixed frames over pipes;
- ``chunks``: messages larger than ``CHUNK_BYTES`` as ``Chunk`` frames, and back;
- ``events``: a turn's events in their wire form, each result once.

States travel as ``StrEnum`` values (the same strings on the wire). The protocol
version is checked once, at the handshakes (``Ready``, ``Hello``); a peer speaking
another version is refused there.
"""

from toolpool.protocol.bridge import BridgeReady, McpCall, McpCancel, McpProgress, McpResult
from toolpool.protocol.chunks import Reassembly, chunked
from toolpool.protocol.client import (
    Accepted,
    Ack,
    Append,
    ApprovalReply,
    ApprovalRequest,
    Branch,
    BranchAction,
    Bye,
    CancelCall,
    Chunk,
    CloseSession,
    EndTurn,
    Error,
    EventSelection,
    FailureCode,
    Hello,
    OpenSession,
    Ping,
    Reply,
    SessionOpened,
    ShippedTool,
    ShippedTools,
    Status,
    Steer,
    SteerAction,
    Submit,
    Tools,
    TurnEvent,
    Welcome,
)
from toolpool.protocol.events import EventReader, event_to_wire
from toolpool.protocol.frames import (
    HEADER_BYTES,
    EncodedExecute,
    ExecuteFrames,
    decode,
    encode,
    frame_length,
    framed,
    read_frame,
    write_frame,
)
from toolpool.protocol.kinds import (
    CHUNK_BYTES,
    MAX_FRAME_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_SHIPPED_BYTES,
    MAX_SHIPPED_SCHEMA_BYTES,
    MAX_SHIPPED_TOOLS,
    PROTOCOL_VERSION,
    MessageType,
    ProtocolError,
)
from toolpool.protocol.messages import MESSAGE_CLASSES, Message
from toolpool.protocol.wire import (
    CallContext,
    CallStatus,
    Cancel,
    Execute,
    Exited,
    Heartbeat,
    Preview,
    Progress,
    Ready,
    Result,
    ShellAction,
    ShellReply,
    ShellRequest,
    Shutdown,
    Spawn,
    Spawned,
    Withdrawn,
)

__all__ = [
    "CHUNK_BYTES",
    "HEADER_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_SHIPPED_BYTES",
    "MAX_SHIPPED_SCHEMA_BYTES",
    "MAX_SHIPPED_TOOLS",
    "MESSAGE_CLASSES",
    "PROTOCOL_VERSION",
    "Accepted",
    "Ack",
    "Append",
    "ApprovalReply",
    "ApprovalRequest",
    "Branch",
    "BranchAction",
    "BridgeReady",
    "Bye",
    "CallContext",
    "CallStatus",
    "Cancel",
    "CancelCall",
    "Chunk",
    "CloseSession",
    "EncodedExecute",
    "EndTurn",
    "Error",
    "EventReader",
    "EventSelection",
    "Execute",
    "ExecuteFrames",
    "Exited",
    "FailureCode",
    "Heartbeat",
    "Hello",
    "McpCall",
    "McpCancel",
    "McpProgress",
    "McpResult",
    "Message",
    "MessageType",
    "OpenSession",
    "Ping",
    "Preview",
    "Progress",
    "ProtocolError",
    "Ready",
    "Reassembly",
    "Reply",
    "Result",
    "SessionOpened",
    "ShellAction",
    "ShellReply",
    "ShellRequest",
    "ShippedTool",
    "ShippedTools",
    "Shutdown",
    "Spawn",
    "Spawned",
    "Status",
    "Steer",
    "SteerAction",
    "Submit",
    "Tools",
    "TurnEvent",
    "Welcome",
    "Withdrawn",
    "chunked",
    "decode",
    "encode",
    "event_to_wire",
    "frame_length",
    "framed",
    "read_frame",
    "write_frame",
]
