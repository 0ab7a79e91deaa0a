"""A small MCP server written with the SDK, for the import tests: the daemon starts it
over stdio through a bridge (``python -m tests.mcp_fixture_server --name NAME``), or
it serves streamable HTTP (``--http-port PORT``).

Its tools answer, sleep, report progress, fail and return an image; ``slow`` writes
a marker file when its request is cancelled, so a test can see the cancellation
reach the server.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, ToolAnnotations

from tests.support import PNG_1X1

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False)

server = MCPServer("toolpool-fixture")


@server.tool(title="Echo", annotations=READ_ONLY)
def echo(text: str) -> str:
    """Answer with the text given."""
    return text


@server.tool(annotations=READ_ONLY)
async def pause(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return f"paused {seconds}"


@server.tool()
async def slow(seconds: float, ctx: Context, marker: str = "") -> str:
    """Report three steps of progress, then sleep; write ``marker`` if cancelled."""
    try:
        for step in (1, 2, 3):
            await ctx.report_progress(step, 3, f"step {step}")
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        if marker:
            Path(marker).write_text("cancelled")
        raise
    return f"slept {seconds}"


@server.tool()
def fail(message: str) -> str:
    """Fail with the message given."""
    raise ToolError(message)


@server.tool(annotations=READ_ONLY)
def picture() -> ImageContent:
    """A one-pixel PNG."""
    return ImageContent(data=base64.b64encode(PNG_1X1).decode(), mime_type="image/png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="fixture", help="tells two copies apart in ps")
    parser.add_argument("--http-port", type=int, help="serve streamable HTTP, not stdio")
    args = parser.parse_args()
    if args.http_port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http_port)
