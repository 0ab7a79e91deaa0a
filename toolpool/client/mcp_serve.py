"""``toolpool mcp serve``: the daemon's tools, to any MCP client, over stdio.

It is a client of the daemon; when no daemon answers it starts one in the
background, and stops it at exit unless other clients use it by then. One MCP
connection is one toolpool session (the workspace is the current directory or
``--workspace``) with one open turn for the whole connection:

- ``tools/list`` gives the daemon's tools in MCP form (``toolpool.providers.mcp``:
  input schema, ``readOnlyHint``/``destructiveHint`` from the capabilities,
  concurrency safety under ``_meta["toolpool/concurrencySafe"]``);
- each ``tools/call`` is appended to the open turn and answered with its result, so
  it goes through the whole pipeline (validation, read-before-write, gate,
  breaker, workers), and calls that arrive while others run are scheduled by the
  turn's rules (S2): safe calls side by side, unsafe ones alone, in arrival order;
- the call's progress reports (P9) become MCP progress notifications when the
  request asked for them (a progress token), numbered 1, 2, 3… with the text as
  the message;
- an MCP cancellation of a request cancels its call, as an interrupt does: a
  running call's worker gets SIGTERM, a queued one never starts.

stdout carries the protocol and nothing else: every other word goes to stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

import toolpool
from toolpool.client import (
    AsyncClient,
    AsyncSession,
    AsyncTurn,
    ClientError,
    ClientProtocolError,
)
from toolpool.client.control import ControlError, ExitCode, ensure_running, stop_background
from toolpool.models import ToolCall, ToolEnd, ToolResult, ToolUpdate, UpdateKind
from toolpool.providers import results_to_mcp
from toolpool.runtime import running_pid

CANCEL_TIMEOUT = 5.0  # seconds a cancellation waits for the daemon's answer


class McpConnection:
    """One MCP connection's toolpool side: a session of the daemon and its open turn."""

    def __init__(self, client: AsyncClient, session: AsyncSession, turn: AsyncTurn) -> None:
        self.client = client
        self.session = session
        self.turn = turn
        self._ids = itertools.count(1)
        self._calls: dict[str, MemoryObjectSendStream[str | ToolResult]] = {}
        self._tools: list[types.Tool] | None = None

    def server(self) -> Server[Any]:
        """The MCP server that answers for this connection."""
        return Server(
            "toolpool",
            version=toolpool.__version__,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if self._tools is None:  # the daemon's tools do not change while it runs
            definitions = await self.client.tools("mcp")
            self._tools = [types.Tool.model_validate(d) for d in definitions]
        return types.ListToolsResult(tools=self._tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        call_id = f"mcp-{next(self._ids)}"
        # Filed before the call exists, so none of its events can arrive unclaimed.
        events, received = anyio.create_memory_object_stream[str | ToolResult](math.inf)
        self._calls[call_id] = events
        try:
            await self.turn.add([ToolCall(call_id, params.name, params.arguments or {})])
            result = await _follow(ctx, received)
        except anyio.get_cancelled_exc_class():
            # The client cancelled the request (or hung up): stop the call in the daemon.
            with anyio.move_on_after(CANCEL_TIMEOUT, shield=True):
                with contextlib.suppress(ClientError):
                    await self.turn.cancel(call_id)
            raise
        finally:
            self._calls.pop(call_id, None)
            events.close()
            received.close()
        (body,) = results_to_mcp([result])
        return types.CallToolResult.model_validate(body)

    async def route_events(self) -> None:
        """Hand each call its progress reports, then its result, in the turn's order."""
        async for event in self.turn.follow():  # the connection may live for hours
            if isinstance(event, ToolUpdate) and event.kind is UpdateKind.PROGRESS:
                events = self._calls.get(event.call_id)
                if events is not None:
                    events.send_nowait(_text(event.data))
            elif isinstance(event, ToolEnd):
                events = self._calls.pop(event.call_id, None)
                if events is not None:
                    events.send_nowait(event.result)
                    events.close()


async def _follow(
    ctx: ServerRequestContext[Any, Any], events: MemoryObjectReceiveStream[str | ToolResult]
) -> ToolResult:
    """Report a call's progress as it comes (when the request asked for it: the SDK
    sends nothing without a progress token); return its result."""
    count = 0  # MCP wants progress to grow with every notification, even without a total
    async for item in events:
        if isinstance(item, ToolResult):
            return item
        count += 1
        await ctx.session.report_progress(count, None, item)
    raise ClientProtocolError("the daemon's turn ended without the call's result")


def _text(data: Any) -> str:
    return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def serve(workspace: Path, runtime_dir: Path) -> int:
    """Serve one MCP connection on stdin/stdout until it ends (or SIGTERM/SIGINT);
    return how many other clients the daemon has left."""
    async with AsyncClient(runtime_dir=runtime_dir, name="toolpool mcp serve") as client:
        async with client.session(workspace) as session:
            turn = await session.submit([], open=True)
            connection = McpConnection(client, session, turn)
            server = connection.server()
            try:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(connection.route_events)
                    tasks.start_soon(_cancel_on_signal, tasks.cancel_scope)
                    async with stdio_server() as (read_stream, write_stream):
                        options = server.create_initialization_options()
                        await server.run(read_stream, write_stream, options)
                    tasks.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True), contextlib.suppress(ClientError):
                    await turn.close()
        status = await client.status()
    return max(0, int(status.get("clients", 1)) - 1)


def serve_stdio(
    workspace: Path,
    runtime_dir: Path,
    *,
    log_file: Path | None = None,
    drain_grace: float = 10.0,
) -> int:
    """``toolpool mcp serve``: its exit status. When no daemon runs it starts one
    (logging to ``log_file``), and stops it at exit (``drain_grace`` is its setting)
    unless other clients use it by then."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        ours = ensure_running(runtime_dir, log_file=log_file, out=sys.stderr)
    except ControlError as exc:
        print(f"toolpool: error: mcp serve: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    others, code = 0, ExitCode.FAILED
    try:
        others = anyio.run(serve, workspace.resolve(), runtime_dir)
        code = ExitCode.OK
    except* ClientError as failures:  # the daemon went away, or refused the session
        for failure in failures.exceptions:
            print(f"toolpool: error: mcp serve: {failure}", file=sys.stderr)
    finally:
        if ours is not None and running_pid(runtime_dir) == ours:
            if others:
                print(
                    f"toolpool: note: mcp serve: the daemon goes on for {others} other clients",
                    file=sys.stderr,
                )
            else:
                stop_background(runtime_dir, drain_grace=drain_grace, out=sys.stderr)
    return code
