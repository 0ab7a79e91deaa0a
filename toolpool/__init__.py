"""toolpool: a tool-execution engine for AI coding agents.

The public names of the tool contract, the data model and the client library live
here; the coordinator, worker and sandbox layers are subpackages.

The client's names are imported on first use: a worker, which imports toolpool for
the tool contract, then never loads the client and asyncio (some 8 MB of memory).
"""

from typing import TYPE_CHECKING, Any

from toolpool.cancel import Cancelled, CancelSource
from toolpool.errors import ToolDefinitionError, ToolError, ToolpoolError
from toolpool.file_reads import FileReadRegister, FileReadStamp
from toolpool.function_tool import FunctionTool, tool
from toolpool.models import (
    ContentBlock,
    ErrorCode,
    Event,
    ImageBlock,
    MessageEnd,
    MessageStart,
    TextBlock,
    ToolCall,
    ToolEnd,
    ToolMessage,
    ToolResult,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    UpdateKind,
    event_from_dict,
)
from toolpool.registry import ToolRegistry, ToolSpec, tools_in_module
from toolpool.tool import (
    InterruptBehavior,
    Tool,
    ToolContext,
    ValidationResult,
    image_block,
)

if TYPE_CHECKING:
    from toolpool.client import (
        AsyncClient,
        Client,
        ClientError,
        ClientProtocolError,
        ClientTimeout,
        DaemonUnavailable,
        RequestFailed,
    )


def __getattr__(name: str) -> Any:
    """The client's names, imported when first asked for (PEP 562): a public name
    Python does not find here is one of them."""
    if name in __all__:
        from toolpool import client

        value = getattr(client, name)
        globals()[name] = value  # asked once
        return value
    raise AttributeError(f"module 'toolpool' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "CancelSource",
    "Cancelled",
    "Client",
    "ClientError",
    "ClientProtocolError",
    "ClientTimeout",
    "ContentBlock",
    "DaemonUnavailable",
    "ErrorCode",
    "Event",
    "FileReadRegister",
    "FileReadStamp",
    "FunctionTool",
    "ImageBlock",
    "InterruptBehavior",
    "MessageEnd",
    "MessageStart",
    "RequestFailed",
    "TextBlock",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolEnd",
    "ToolError",
    "ToolMessage",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "ToolStart",
    "ToolUpdate",
    "ToolpoolError",
    "TurnEnd",
    "UpdateKind",
    "ValidationResult",
    "event_from_dict",
    "image_block",
    "tool",
    "tools_in_module",
]
