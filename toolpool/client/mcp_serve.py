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

import itertools
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import NoBackChannelError

import toolpool
from toolpool.client import AsyncClient, ClientError
from toolpool.client.control import ControlError, ExitCode, ensure_running, stop_background
from toolpool.client.core import ApprovalRequested
from toolpool.client.toolbox import AsyncToolbox
from toolpool.providers import results_to_mcp
from toolpool.runtime import running_pid


class McpConnection:
    """One MCP connection's toolpool side: a toolbox (one session, one open turn)."""

    def __init__(self, client: AsyncClient, toolbox: AsyncToolbox) -> None:
        self.client = client
        self.toolbox = toolbox
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
        if self._tools is None:  # the session's tools do not change while it runs
            profile = self.toolbox.options.get("tool_profile", "toolpool")
            definitions = await self.client.tools("mcp", profile)
            self._tools = [types.Tool.model_validate(d) for d in definitions]
        return types.ListToolsResult(tools=self._tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        count = itertools.count(1)  # MCP wants progress to grow with every notification

        async def progress(data: Any) -> None:
            # The SDK sends nothing when the request carries no progress token.
            await ctx.session.report_progress(next(count), None, _text(data))

        async def approval(request: ApprovalRequested) -> tuple[bool, str]:
            return await _elicited(ctx, request)

        result = await self.toolbox.call(
            params.name, params.arguments or {}, on_progress=progress, on_approval=approval
        )
        (body,) = results_to_mcp([result])
        return types.CallToolResult.model_validate(body)


async def _elicited(
    ctx: ServerRequestContext[Any, Any], request: ApprovalRequested
) -> tuple[bool, str]:
    """The gate's question to the MCP client's user, as a form elicitation; a client
    that cannot be asked so (no ``elicitation`` capability) denies, saying why."""
    asked = types.ClientCapabilities(elicitation=types.ElicitationCapability())
    if not ctx.session.check_client_capability(asked):
        return False, (
            f'"{request.call.name}" needs approval (the session\'s gate), and this MCP '
            "client cannot be asked: it does not support elicitation"
        )
    preview = request.preview if isinstance(request.preview, str) else None
    message = f"Allow {request.label}?\n{json.dumps(request.call.arguments, ensure_ascii=False)}"
    if preview:
        message += f"\n\n{preview}"
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"reason": {"type": "string", "title": "Why not (when you decline)"}},
    }
    try:
        answer = await ctx.session.elicit_form(message, schema, ctx.request_id)
    except NoBackChannelError:
        # The protocol of 2026-07-28 has no server-initiated requests: its elicitation
        # is an ``input_required`` result, which this server does not make yet.
        return False, (
            f'"{request.call.name}" needs approval (the session\'s gate), and this MCP '
            f"client cannot be asked: its protocol ({ctx.protocol_version}) lets the "
            "server ask only through input_required results"
        )
    if answer.action == "accept":
        return True, ""
    reason = str((answer.content or {}).get("reason") or "")
    return False, reason or f'The user did not allow "{request.call.name}".'


def _text(data: Any) -> str:
    return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def serve(workspace: Path, runtime_dir: Path, options: dict[str, Any] | None = None) -> int:
    """Serve one MCP connection on stdin/stdout until it ends (or SIGTERM/SIGINT),
    with a session of ``options``; return how many other clients the daemon has left."""
    async with AsyncClient(runtime_dir=runtime_dir, name="toolpool mcp serve") as client:
        async with AsyncToolbox(client, workspace, call_ids="mcp", **(options or {})) as toolbox:
            connection = McpConnection(client, toolbox)
            server = connection.server()
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_cancel_on_signal, tasks.cancel_scope)
                async with stdio_server() as (read_stream, write_stream):
                    initialization = server.create_initialization_options()
                    await server.run(read_stream, write_stream, initialization)
                tasks.cancel_scope.cancel()
        status = await client.status()
    return max(0, int(status.get("clients", 1)) - 1)


def serve_stdio(
    workspace: Path,
    runtime_dir: Path,
    *,
    log_file: Path | None = None,
    drain_grace: float = 10.0,
    options: dict[str, Any] | None = None,
) -> int:
    """``toolpool mcp serve``: its exit status. When no daemon runs it starts one
    (logging to ``log_file``), and stops it at exit (``drain_grace`` is its setting)
    unless other clients use it by then. ``options`` are the session's."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        ours = ensure_running(runtime_dir, log_file=log_file, out=sys.stderr)
    except ControlError as exc:
        print(f"toolpool: error: mcp serve: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    others, code = 0, ExitCode.FAILED
    try:
        others = anyio.run(serve, workspace.resolve(), runtime_dir, options)
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
