"""The daemon's side of imported MCP servers: one bridge process per server, and the
proxy tools their servers offer.

``import_mcp_servers`` starts a bridge (``python -m toolpool.mcp.bridge``) for every
server of the ``mcpServers`` file, in parallel, and waits for each one's tools. It
writes them to a file in the daemon's runtime directory and names that file in
``$TOOLPOOL_MCP_TOOLS``, which the coordinator and the zygote (and so every worker)
inherit; the tool module ``toolpool.mcp.imported`` builds the same proxy tools from
it in each of them. A server that cannot be reached, or a tool toolpool cannot use,
is logged and left out: the daemon runs without it, and its ``status`` (so ``daemon
start``, ``status`` and ``tools``) says what was left out and why. On the way out the
bridges are stopped — asked by closing their stdin, then ended with their whole
process tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.errors import ToolDefinitionError
from toolpool.mcp.config import McpServerConfig, load_mcp_servers, proxy_tool_name
from toolpool.mcp.proxy import TOOLS_FILE_ENV, proxy_tools, write_tools_file
from toolpool.protocol import HEADER_BYTES, BridgeReady, ProtocolError, decode, frame_length
from toolpool.registry import ToolSpec
from toolpool.runtime import ensure_private, write_private
from toolpool.sandbox.terminate import ProcessTree, terminate

log = logging.getLogger("toolpool.mcp")

TOOL_MODULE = "toolpool.mcp.imported"
START_TIMEOUT = 40.0  # the bridge's own connect timeout (30 s), and its start-up
# A bridge asked to stop closes its stdio server: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL.
STOP_GRACE = 6.0


@dataclass(frozen=True, slots=True)
class Imported:
    """What the daemon got of its MCP servers: the tool module to load for their tools,
    and what was left out — ``{"server": …, "reason": …}``, with ``"tool"`` for a tool
    left out of a server that started."""

    tool_modules: tuple[str, ...] = ()
    left_out: tuple[dict[str, str], ...] = ()


@dataclass(eq=False)
class BridgeProcess:
    """A running bridge, and what it said when it started."""

    config: McpServerConfig
    endpoint: str
    log_path: Path
    process: asyncio.subprocess.Process
    tools: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    def log_tail(self, lines: int = 5) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return " | ".join(tail)


class McpBridges:
    """The bridges of one daemon: started together, stopped together."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tools_file = directory / "tools.json"
        self.bridges: list[BridgeProcess] = []
        self.entries: list[dict[str, Any]] = []  # the tools file: one entry per proxy tool
        self.left_out: list[dict[str, str]] = []  # servers and tools left out, and why

    @property
    def tool_modules(self) -> tuple[str, ...]:
        """The tool module to load besides the configured ones (none without tools)."""
        return (TOOL_MODULE,) if self.entries else ()

    async def start(self, servers: Sequence[McpServerConfig]) -> None:
        ensure_private(self.directory)
        started = await asyncio.gather(
            *(self._start_one(i, server) for i, server in enumerate(servers))
        )
        self.bridges = [b for b in started if b is not None]
        self.entries = _entries(self.bridges, self.left_out)
        write_tools_file(self.tools_file, self.entries)
        os.environ[TOOLS_FILE_ENV] = str(self.tools_file)

    async def _start_one(self, index: int, server: McpServerConfig) -> BridgeProcess | None:
        config_path = self.directory / f"bridge-{index}.json"
        write_private(config_path, json.dumps(server.to_dict()))  # env may hold secrets
        endpoint = f"ipc://{self.directory / f'bridge-{index}.sock'}"
        log_path = self.directory / f"bridge-{index}.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "toolpool.mcp.bridge"),
                *("--config", str(config_path), "--endpoint", endpoint),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fd,
            )
        finally:
            os.close(log_fd)
        bridge = BridgeProcess(server, endpoint, log_path, process)
        try:
            ready = await asyncio.wait_for(_read_ready(process), START_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
            bridge.error = f"the bridge did not start ({exc!r})"
        else:
            bridge.tools, bridge.error = ready.tools, ready.error
        if bridge.error:
            self.left_out.append({"server": server.name, "reason": bridge.error})
            log.error(
                "MCP server %s is left out: %s%s",
                server.name,
                bridge.error,
                f" (bridge log: {bridge.log_tail()})" if bridge.log_tail() else "",
            )
            await _stop(bridge)
            return None
        log.info("MCP server %s: %d tools imported", server.name, len(bridge.tools))
        return bridge

    async def close(self) -> None:
        """Stop every bridge (and so its server); remove the runtime files. Nothing is
        left running."""
        bridges, self.bridges = self.bridges, []
        await asyncio.gather(*(_stop(b) for b in bridges))
        if os.environ.get(TOOLS_FILE_ENV) == str(self.tools_file):
            del os.environ[TOOLS_FILE_ENV]
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        servers = ", ".join(b.config.name for b in self.bridges) or "none"
        return f"<McpBridges servers: {servers}; {len(self.entries)} tools>"


async def _read_ready(process: asyncio.subprocess.Process) -> BridgeReady:
    assert process.stdout is not None
    header = await process.stdout.readexactly(HEADER_BYTES)
    message = decode(await process.stdout.readexactly(frame_length(header)))
    if not isinstance(message, BridgeReady):
        raise ProtocolError(f"expected bridge_ready, got {message.type.value}")
    return message


async def _stop(bridge: BridgeProcess) -> None:
    process = bridge.process
    if process.stdin is not None:
        process.stdin.close()  # the bridge's signal to stop
    try:
        await asyncio.wait_for(process.wait(), STOP_GRACE)
    except TimeoutError:
        log.warning("the bridge of MCP server %s did not stop; ending it", bridge.config.name)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, terminate, ProcessTree(process.pid), 1.0)
        await process.wait()


def _entries(
    bridges: Sequence[BridgeProcess], left_out: list[dict[str, str]]
) -> list[dict[str, Any]]:
    """One tools-file entry per usable tool. A tool whose schema toolpool cannot use,
    or whose name is taken, is logged and left out (into ``left_out``) rather than
    failing the daemon."""
    entries: list[dict[str, Any]] = []
    names: set[str] = set()
    for bridge in bridges:
        for definition in bridge.tools:
            tool = str(definition.get("name", ""))
            name = proxy_tool_name(bridge.config.name, tool)
            entry: dict[str, Any] = {
                "name": name,
                "server": bridge.config.name,
                "tool": tool,
                "endpoint": bridge.endpoint,
                "trusted": bridge.config.trusted,
                "definition": definition,
            }
            try:
                (proxy,) = proxy_tools([entry])
                ToolSpec(proxy)
            except (ToolDefinitionError, TypeError, ValueError) as exc:
                log.warning("MCP tool %s/%s is left out: %s", bridge.config.name, tool, exc)
                left_out.append({"server": bridge.config.name, "tool": tool, "reason": str(exc)})
                continue
            if name in names:
                log.warning(
                    "MCP tool %s/%s is left out: %s is taken", bridge.config.name, tool, name
                )
                reason = f"{name} is taken"
                left_out.append({"server": bridge.config.name, "tool": tool, "reason": reason})
                continue
            names.add(name)
            entries.append(entry)
    return entries


@contextlib.asynccontextmanager
async def import_mcp_servers(path: Path | None, directory: Path) -> AsyncIterator[Imported]:
    """While in the context, the bridges of the servers in ``path`` (an ``mcpServers``
    JSON file; none when None) run; it gives the tool modules to load for them and
    what was left out. ``McpConfigError`` for a file that cannot be used."""
    if path is None:
        yield Imported()
        return
    servers = load_mcp_servers(path)
    bridges = McpBridges(directory)
    try:
        await bridges.start(servers)
        yield Imported(bridges.tool_modules, tuple(bridges.left_out))
    finally:
        await bridges.close()
