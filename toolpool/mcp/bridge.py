"""``python -m toolpool.mcp.bridge``: the session with one imported MCP server, in a
process of its own.

Why a process between the daemon and the server: the MCP session (the SDK, its
transport, the server's pipes) lives outside the coordinator, so a server that
hangs, crashes or floods cannot stall or break the daemon; the workers running
the server's proxy tools (toolpool.mcp.proxy) only exchange frames with it.

Its life: connect to the server (start it over stdio, or reach its URL), list its
tools and tell the daemon (``BridgeReady`` on stdout); then answer workers'
``McpCall``s on a ROUTER socket, each call concurrently, until the daemon closes
our stdin, sends SIGTERM, or dies (parent death signal). When the connection
breaks mid-call (the server crashed or exited), the calls in flight fail with a
message saying so and the next call reconnects, restarting a stdio server.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import zmq
import zmq.asyncio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult

from toolpool.mcp.config import McpServerConfig
from toolpool.protocol import (
    BridgeReady,
    McpCall,
    McpCancel,
    McpProgress,
    McpResult,
    Message,
    ProtocolError,
    decode,
    encode,
    write_frame,
)
from toolpool.sandbox import linux

log = logging.getLogger("toolpool.mcp.bridge")

CONNECT_TIMEOUT = 30.0  # seconds a server has to start and answer the handshake
MAX_TOOL_PAGES = 100  # a tools/list that pages on for ever cannot hang the start
# Errors that mean the connection itself is gone, not just this call.
_TRANSPORT_ERRORS = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


class LinkDown(Exception):
    """The server cannot be reached: it did not start, answer or list its tools."""


@dataclass(eq=False)
class _Attempt:
    """One try at connecting, awaited by every call that needs the session."""

    done: anyio.Event = field(default_factory=anyio.Event)
    client: Client | None = None
    failure: str = ""


class ServerLink:
    """The session with the server, opened on demand and reopened after it broke.

    One task (``run``) owns the session: the SDK's transports hold task groups,
    which must be entered and left by the same task. Calls ask for the session
    (``session``) and report a broken one (``broken``); the owner then closes it —
    a stdio server is stopped, and killed if it does not go — and opens a new one
    when the next call asks.
    """

    def __init__(self, config: McpServerConfig, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.config = config
        self.connect_timeout = connect_timeout
        self._client: Client | None = None
        self._attempt: _Attempt | None = None
        self._wanted = anyio.Event()
        self._broken = anyio.Event()

    def _client_for_config(self) -> Client:
        config = self.config
        if config.url is not None:
            return Client(config.url)
        assert config.command is not None
        return Client(
            StdioServerParameters(
                command=config.command, args=list(config.args), env=config.env, cwd=config.cwd
            )
        )

    async def session(self) -> Client:
        """The open session; connect first when there is none. ``LinkDown`` when the
        server cannot be reached."""
        if self._client is not None:
            return self._client
        if self._attempt is None:
            self._attempt = _Attempt()
            self._wanted.set()
        attempt = self._attempt
        await attempt.done.wait()
        if attempt.client is None:
            raise LinkDown(attempt.failure)
        return attempt.client

    def broken(self, client: Client) -> None:
        """A call found ``client``'s connection gone: close it, reconnect on demand."""
        if client is self._client:
            self._client = None  # the next call waits for a new session, not this one
            self._broken.set()

    async def run(self) -> None:
        """Own the session for the bridge's whole life."""
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            self._broken = anyio.Event()
            attempt = self._attempt
            assert attempt is not None
            try:
                with anyio.CancelScope(
                    deadline=anyio.current_time() + self.connect_timeout
                ) as handshake:
                    async with self._client_for_config() as client:
                        handshake.deadline = math.inf  # a connected session has no deadline
                        self._connected(attempt, client)
                        await self._broken.wait()
                if attempt.client is None:
                    attempt.failure = f"no answer within {self.connect_timeout:g} s"
            except Exception as exc:  # the server would not start, or broke on the way
                attempt.failure = attempt.failure or describe(exc)
                log.warning("MCP server %s: %s", self.config.name, describe(exc))
            finally:
                self._client = None
                if self._attempt is attempt:
                    self._attempt = None
                attempt.done.set()

    def _connected(self, attempt: _Attempt, client: Client) -> None:
        self._client = attempt.client = client
        self._attempt = None
        attempt.done.set()
        log.info("MCP server %s: connected (%s)", self.config.name, client.protocol_version)

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools, every page, as MCP ``Tool`` dicts."""
        client = await self.session()
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        try:
            for _ in range(MAX_TOOL_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += [
                    t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools
                ]
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as exc:
            raise LinkDown(f"tools/list failed: {describe(exc)}") from exc
        return tools


def describe(exc: BaseException) -> str:
    """One line for an exception, the leaves of an exception group included."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__


def result_content(result: CallToolResult) -> list[dict[str, Any]]:
    """A result's content blocks as dicts; structured content as JSON text when the
    server sent nothing else."""
    content = [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in result.content]
    if not content and result.structured_content is not None:
        content = [{"type": "text", "text": json.dumps(result.structured_content)}]
    return content


def failed(call: McpCall, text: str) -> McpResult:
    return McpResult(call.call_id, [{"type": "text", "text": text}], is_error=True)


class Bridge:
    """Workers' calls, run against the server one task each.

    Each proxy call comes on a DEALER socket of its own, so its ZeroMQ identity
    names the call; call ids are the model's and may repeat across sessions.
    """

    def __init__(self, link: ServerLink, socket: zmq.asyncio.Socket) -> None:
        self.link = link
        self.socket = socket
        self._calls: dict[bytes, anyio.CancelScope] = {}

    @property
    def name(self) -> str:
        return self.link.config.name

    async def serve(self) -> None:
        async with anyio.create_task_group() as tasks:
            while True:
                frames = await self.socket.recv_multipart()
                if len(frames) != 2:
                    log.warning("dropped a message of %d frames", len(frames))
                    continue
                identity, frame = frames
                try:
                    message = decode(frame)
                except ProtocolError as exc:
                    log.warning("dropped a bad frame: %s", exc)
                    continue
                if isinstance(message, McpCall):
                    # Made here, not in the task: a cancel may arrive before it starts.
                    scope = self._calls[identity] = anyio.CancelScope()
                    tasks.start_soon(self._run, identity, message, scope)
                elif isinstance(message, McpCancel) and identity in self._calls:
                    log.info("call %s cancelled", message.call_id)
                    self._calls[identity].cancel()

    async def _send(self, identity: bytes, message: Message) -> None:
        await self.socket.send_multipart([identity, encode(message)])

    async def _run(self, identity: bytes, call: McpCall, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                result = await self._call(identity, call)
            if scope.cancelled_caught:  # the worker waits for this to know we heard it
                result = failed(call, "Cancelled.")
            await self._send(identity, result)
        finally:
            self._calls.pop(identity, None)

    async def _call(self, identity: bytes, call: McpCall) -> McpResult:
        try:
            client = await self.link.session()
        except LinkDown as exc:
            return failed(call, f'MCP server "{self.name}" is not available: {exc}')

        async def forward(progress: float, total: float | None, message: str | None) -> None:
            await self._send(identity, McpProgress(call.call_id, progress, total, message))

        try:
            result = await client.call_tool(call.tool, call.arguments, progress_callback=forward)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                return failed(call, f'MCP server "{self.name}" refused the call: {exc.message}')
            self.link.broken(client)
            return failed(
                call,
                f'MCP server "{self.name}" closed the connection during the call (it exited '
                "or crashed); the next call reconnects to it.",
            )
        except _TRANSPORT_ERRORS as exc:
            self.link.broken(client)
            return failed(call, f'The connection to MCP server "{self.name}" broke: {exc!r}')
        except Exception as exc:  # an answer the SDK could not read, a bad schema…
            return failed(call, f'MCP server "{self.name}": the call failed: {describe(exc)}')
        return McpResult(call.call_id, result_content(result), result.is_error)


async def _until_stopped() -> None:
    """Return when the daemon closes our stdin or sends SIGTERM."""
    async with anyio.create_task_group() as waiters:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            waiters.cancel_scope.cancel()

        async def on_end_of_input() -> None:
            while True:
                await anyio.wait_readable(0)
                if not os.read(0, 4096):
                    break
            waiters.cancel_scope.cancel()

        waiters.start_soon(on_signal)
        waiters.start_soon(on_end_of_input)


@asynccontextmanager
async def _router(endpoint: str) -> AsyncIterator[zmq.asyncio.Socket]:
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.bind(endpoint)
        if endpoint.startswith("ipc://"):
            os.chmod(endpoint[len("ipc://") :], 0o600)
        yield socket
    finally:
        socket.close()
        context.term()


async def run(config: McpServerConfig, endpoint: str, frames: BinaryIO) -> int:
    """The bridge's life; its exit status."""
    link = ServerLink(config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(link.run)
        try:
            tools = await link.list_tools()
        except LinkDown as exc:
            write_frame(frames, BridgeReady(config.name, error=str(exc)))
            tasks.cancel_scope.cancel()
            return 1
        async with _router(endpoint) as socket:
            write_frame(frames, BridgeReady(config.name, tools))
            tasks.start_soon(Bridge(link, socket).serve)
            await _until_stopped()
            tasks.cancel_scope.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolpool-mcp-bridge")
    parser.add_argument("--config", type=Path, required=True, help="the server, as JSON")
    parser.add_argument("--endpoint", required=True, help="where workers reach us")
    args = parser.parse_args(argv)
    try:
        # SIGTERM, not SIGKILL: a bridge stops its stdio server before it goes.
        linux.die_with_parent(signal.SIGTERM)
    except ProcessLookupError:
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the daemon
    # Our stdout carries frames to the daemon: anything else printed goes to the log.
    frames = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    config = McpServerConfig.from_dict(json.loads(args.config.read_text()))
    code: int = anyio.run(run, config, args.endpoint, frames)
    return code


if __name__ == "__main__":
    sys.exit(main())
