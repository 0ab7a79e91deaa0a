"""What every part of the wire shares: the version, the frame limit, the one error
type, and the names of the message types."""

from __future__ import annotations

from enum import StrEnum

from toolpool.errors import ToolpoolError

# 3: the daemon sends no message_start/message_end (the client makes them, SPEC L2),
# and a message to a client may have several parts (docs/protocol.md).
PROTOCOL_VERSION = 3
# The largest frame a peer may send: small enough that a bad peer cannot make us
# allocate without bound. Daemon → client messages larger than CHUNK_BYTES travel as
# ``Chunk`` frames (SPEC L3), up to MAX_MESSAGE_BYTES reassembled.
MAX_FRAME_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024 * 1024
# The largest pickle of a session's shipped tools (SPEC A5): each worker bound to the
# session is spawned with it, through the zygote's pipe.
MAX_SHIPPED_BYTES = 16 * 1024 * 1024
# The most tools one session ships, and the largest schema of one (its JSON): the
# daemon compiles each schema as the session opens, on its event loop (SPEC L10).
MAX_SHIPPED_TOOLS = 64
MAX_SHIPPED_SCHEMA_BYTES = 64 * 1024


class ProtocolError(ToolpoolError):
    """Bytes that are not a valid toolpool message (or a message of another version).

    ``request_id`` is the id the frame carried when it could be read that far (a map
    with a string ``request_id``), so that a daemon can still answer the request.
    """

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class MessageType(StrEnum):
    """The ``t`` of a frame: one value per message class (``messages.MESSAGE_CLASSES``)."""

    # pool ⇄ worker
    READY = "ready"
    EXECUTE = "execute"
    PROGRESS = "progress"
    PREVIEW = "preview"
    RESULT = "result"
    HEARTBEAT = "heartbeat"
    SHUTDOWN = "shutdown"
    SHELL_REQUEST = "shell_request"
    SHELL_REPLY = "shell_reply"
    CANCEL = "cancel"
    WITHDRAWN = "withdrawn"
    # pool ⇄ zygote
    SPAWN = "spawn"
    SPAWNED = "spawned"
    EXITED = "exited"
    # client ⇄ daemon
    HELLO = "hello"
    WELCOME = "welcome"
    OPEN_SESSION = "open_session"
    SESSION_OPENED = "session_opened"
    CLOSE_SESSION = "close_session"
    SUBMIT = "submit"
    ACCEPTED = "accepted"
    APPEND = "append"
    CANCEL_CALL = "cancel_call"
    END_TURN = "end_turn"
    TURN_EVENT = "turn_event"
    STEER = "steer"
    BRANCH = "branch"
    APPROVAL_REQUEST = "approval_request"
    APPROVAL_REPLY = "approval_reply"
    STATUS = "status"
    TOOLS = "tools"
    REPLY = "reply"
    ERROR = "error"
    PING = "ping"
    BYE = "bye"
    CHUNK = "chunk"
    ACK = "ack"
    # MCP bridge ⇄ daemon, worker ⇄ MCP bridge
    BRIDGE_READY = "bridge_ready"
    MCP_CALL = "mcp_call"
    MCP_PROGRESS = "mcp_progress"
    MCP_RESULT = "mcp_result"
    MCP_CANCEL = "mcp_cancel"
