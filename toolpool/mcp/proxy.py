"""Proxy tools: the tools of an imported MCP server, as toolpool tools.

A proxy tool keeps the server's schema and description. Its capabilities come from
the server's annotations only when the server is trusted: ``readOnlyHint`` makes it
read-only, and so concurrency-safe (S1). An untrusted server's tools are neither,
so each runs alone. Executing one sends ``McpCall`` to the server's bridge and waits
for ``McpResult``, forwarding ``McpProgress`` as progress (P9); a cancelled call
(the worker cancels the task on SIGTERM) sends ``McpCancel``. A failure anywhere on
the way is a ``ToolError``: an error result for the model, never a daemon failure.

The daemon describes the proxy tools in a file (``write_tools_file``); the tool
module ``toolpool.mcp.imported`` builds them from it (``load_tools``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from toolpool.errors import ToolError
from toolpool.models import ContentBlock, ImageBlock, TextBlock
from toolpool.protocol import (
    McpCall,
    McpCancel,
    McpProgress,
    McpResult,
    ProtocolError,
    decode,
    encode,
)
from toolpool.runtime import write_private
from toolpool.tool import Arguments, ToolContext

TOOLS_FILE_ENV = "TOOLPOOL_MCP_TOOLS"
# A running bridge accepts the connection at once; a refused one (a socket file left
# behind by a killed bridge, or none) is reported at once too. This is the backstop.
CONNECT_TIMEOUT = 5.0
CANCEL_ANSWER_TIMEOUT = 1.0  # well within the pool's grace for a cancelled call


class McpProxyTool:
    """One tool of an imported MCP server, run through the server's bridge."""

    def __init__(
        self,
        name: str,
        *,
        server: str,
        tool: str,
        endpoint: str,
        definition: Mapping[str, Any],
        trusted: bool,
    ) -> None:
        annotations = definition.get("annotations") or {}
        self.name = name
        self.server = server
        self.tool = tool
        self.endpoint = endpoint
        self.trusted = trusted
        self.description = str(definition.get("description") or "")
        self.schema: dict[str, Any] = dict(definition.get("inputSchema") or {"type": "object"})
        self._title = str(definition.get("title") or annotations.get("title") or tool)
        # An untrusted server's hints could make a destructive tool run beside others.
        self._read_only = trusted and annotations.get("readOnlyHint") is True

    def label(self) -> str:
        return self._title

    def read_only(self, args: Arguments) -> bool:
        return self._read_only

    async def execute(self, args: Arguments, ctx: ToolContext) -> list[ContentBlock]:
        result = await call_bridge(
            self.endpoint,
            McpCall(ctx.call_id, self.tool, args),
            ctx.report_progress,
            what=f'the bridge of MCP server "{self.server}"',
        )
        blocks = [content_block(block) for block in result.content] or [TextBlock("")]
        if result.is_error:
            text = "\n".join(b.text for b in blocks if isinstance(b, TextBlock)).strip()
            raise ToolError(text or f'MCP tool "{self.tool}" failed', details={"mcp": self.server})
        return blocks

    def __repr__(self) -> str:
        trust = "trusted" if self.trusted else "untrusted"
        return f"<McpProxyTool {self.name!r} → {self.server}/{self.tool} ({trust})>"


def content_block(block: Mapping[str, Any]) -> ContentBlock:
    """An MCP content block as toolpool content: text and images as they are; audio,
    resources and links as a line of text that says what they were."""
    kind = block.get("type")
    if kind == "text":
        return TextBlock(str(block.get("text", "")))
    if kind == "image":
        return ImageBlock(str(block.get("data", "")), str(block.get("mimeType", "image/png")))
    if kind == "resource_link":
        return TextBlock(f"[resource {block.get('uri')}: {block.get('name', '')}]")
    if kind == "resource":
        resource = block.get("resource") or {}
        if "text" in resource:
            return TextBlock(str(resource["text"]))
        return TextBlock(f"[{resource.get('mimeType', 'binary')} resource {resource.get('uri')}]")
    if kind == "audio":
        return TextBlock(f"[{block.get('mimeType', 'audio')} audio not shown]")
    return TextBlock(json.dumps(dict(block), ensure_ascii=False))


def progress_text(message: McpProgress) -> str:
    """What a progress report of the server reads as in a ``tool_update``."""
    if message.message:
        return message.message
    if message.total:
        return f"{message.progress:g}/{message.total:g}"
    return f"{message.progress:g}"


# One ZeroMQ context per worker process, made on first use: the zygote imports this
# module before it forks, and a context must not cross a fork.
_context: tuple[int, zmq.asyncio.Context] | None = None


def _zmq_context() -> zmq.asyncio.Context:
    global _context
    if _context is None or _context[0] != os.getpid():
        _context = (os.getpid(), zmq.asyncio.Context(io_threads=1))
    return _context[1]


async def call_bridge(
    endpoint: str, call: McpCall, on_progress: Callable[[str], None], *, what: str
) -> McpResult:
    """Send ``call`` to the bridge at ``endpoint``; its result. Progress goes to
    ``on_progress``. A bridge that does not answer or goes away raises ``ToolError``;
    a cancelled wait tells the bridge to cancel the call."""
    socket = _zmq_context().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)  # what is queued still leaves as the socket closes
    monitor = socket.get_monitor_socket(
        zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
    )
    poller = zmq.asyncio.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    socket.connect(endpoint)
    try:
        await socket.send(encode(call))
        connected = False
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while True:
            timeout = None if connected else max(0.0, deadline - time.monotonic())
            ready = dict(await poller.poll(None if timeout is None else timeout * 1000))
            if monitor in ready:
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    raise ToolError(f"{what} went away during the call")
                if event == zmq.EVENT_CONNECT_RETRIED and not connected:
                    raise ToolError(f"{what} does not answer")  # refused: nobody listens
                connected = connected or event == zmq.EVENT_CONNECTED
            if socket in ready:
                try:
                    message = decode(await socket.recv())
                except ProtocolError as exc:
                    raise ToolError(f"{what} sent a bad frame: {exc}") from None
                if isinstance(message, McpResult):
                    return message
                if isinstance(message, McpProgress):
                    on_progress(progress_text(message))
            elif not connected and time.monotonic() >= deadline:
                raise ToolError(f"{what} does not answer")
    except asyncio.CancelledError:
        await _cancel(socket, call.call_id)
        raise
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)
        socket.close()


async def _cancel(socket: zmq.asyncio.Socket, call_id: str) -> None:
    """Tell the bridge, and wait a moment for its answer: a cancelled call's worker is
    retired right after, and messages still queued in it would be lost."""
    with contextlib.suppress(zmq.ZMQError, ProtocolError, TimeoutError):
        async with asyncio.timeout(CANCEL_ANSWER_TIMEOUT):
            await socket.send(encode(McpCancel(call_id)))
            while not isinstance(decode(await socket.recv()), McpResult):
                pass


def proxy_tools(entries: Iterable[Mapping[str, Any]]) -> list[McpProxyTool]:
    """Proxy tools from the entries of a tools file (see ``write_tools_file``)."""
    return [
        McpProxyTool(
            str(entry["name"]),
            server=str(entry["server"]),
            tool=str(entry["tool"]),
            endpoint=str(entry["endpoint"]),
            definition=entry["definition"],
            trusted=bool(entry["trusted"]),
        )
        for entry in entries
    ]


def write_tools_file(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write the entries ``proxy_tools`` reads: name (toolpool's), server, tool (the
    server's name for it), endpoint (its bridge), trusted, definition (the server's
    MCP ``Tool``)."""
    write_private(path, json.dumps({"tools": entries}))


def load_tools(path: str | None) -> list[McpProxyTool]:
    """The proxy tools of the tools file at ``path``; none without a path."""
    if not path:
        return []
    return proxy_tools(json.loads(Path(path).read_text())["tools"])
