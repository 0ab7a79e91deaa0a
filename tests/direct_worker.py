"""One real worker process, spoken to directly: the test is its pool — a ROUTER
socket that the worker's two lines connect to — so that what the worker reads and
sends is seen message by message, part by part (docs/protocol.md, "Several calls
to a message")."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import zmq

from toolpool.protocol import (
    CallContext,
    Cancel,
    Execute,
    Heartbeat,
    Message,
    Ready,
    Shutdown,
    decode,
    encode,
)
from toolpool.worker.channel import CONTROL_SUFFIX
from toolpool.worker.main import WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
WORKER_ID = "w1"
# The worker's life, as the zygote would start it, with the test tools loaded.
_SERVE = """
import base64, json, sys
from toolpool.registry import ToolRegistry, tools_in_module
from toolpool.worker.main import WorkerConfig, serve
registry = ToolRegistry(check_schemas=False)
for tool in tools_in_module("tests.worker_tools"):
    registry.add(tool)
config = json.loads(sys.argv[1])
config["session_tools"] = base64.b64decode(config["session_tools"])
sys.exit(serve(WorkerConfig.from_dict(config), registry))
"""
# A hang guard far past anything waited for here (a loaded machine is slow, not stuck).
WAIT_MS = 30_000


class DirectWorker:
    """A worker process and the socket it answers to; ``calls`` counts the ZeroMQ
    messages and parts the worker sent on its call line (heartbeats apart)."""

    def __init__(
        self,
        tmp_path: Path,
        workspace: Path,
        *,
        result_hold: float = 0.001,
        bound: tuple[str, bytes] | None = None,
    ) -> None:
        """``bound``: the worker serves that session's shipped tools (its id, their
        pickle), as a pool's bound worker does (SPEC A6)."""
        self.workspace = workspace
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{tmp_path}/pool.sock"
        self._router.bind(endpoint)
        config = WorkerConfig(
            worker_id=WORKER_ID,
            endpoint=endpoint,
            heartbeat_interval=60.0,  # one heartbeat as it starts, then none in a test
            result_hold=result_hold,
            bound_session="" if bound is None else bound[0],
        )
        given = config.to_dict()
        given["session_tools"] = base64.b64encode(b"" if bound is None else bound[1]).decode()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, json.dumps(given)], cwd=ROOT
        )
        self._tickets = 0
        self.messages: list[tuple[bytes, list[Message]]] = []  # (line, parts) as they came
        said = [(line, parts[0]) for line, parts in self._wait(2)]
        # Its handshake on both lines (a bound worker's says whether its tools loaded).
        self.ready = [ready for _, ready in said if isinstance(ready, Ready)]
        lines = sorted(line for line, ready in said if isinstance(ready, Ready))
        assert lines == [WORKER_ID.encode(), (WORKER_ID + CONTROL_SUFFIX).encode()]
        self.messages.clear()

    def execute(
        self, tool: str, arguments: dict[str, Any], call_id: str, session: str = "s"
    ) -> Execute:
        self._tickets += 1
        context = CallContext(session_id=session, workspace=str(self.workspace))
        return Execute(call_id, tool, arguments, context, {}, {}, self._tickets)

    def send(self, *parts: Execute | bytes) -> None:
        """One message of ``parts`` on the worker's call line (bytes as they are)."""
        frames = [p if isinstance(p, bytes) else encode(p) for p in parts]
        self._router.send_multipart([WORKER_ID.encode(), *frames])

    def cancel(self, ticket: int, *, running: bool = True) -> None:
        control = (WORKER_ID + CONTROL_SUFFIX).encode()
        self._router.send_multipart([control, encode(Cancel(ticket, running=running))])

    def _wait(self, count: int) -> list[tuple[bytes, list[Message]]]:
        """The next ``count`` messages other than heartbeats, as (line, parts)."""
        got: list[tuple[bytes, list[Message]]] = []
        while len(got) < count:
            assert self._router.poll(WAIT_MS), f"waited for {count} messages, got {got}"
            line, *frames = self._router.recv_multipart()
            parts = [decode(f) for f in frames]
            if all(isinstance(p, Heartbeat) for p in parts):
                continue
            got.append((line, parts))
            self.messages.append((line, parts))
        return got

    def receive(self, count: int = 1) -> list[list[Message]]:
        """The parts of the next ``count`` messages on either line."""
        return [parts for _, parts in self._wait(count)]

    def call_line(self) -> list[list[Message]]:
        """The parts of every message the worker sent on its call line so far."""
        return [parts for line, parts in self.messages if line == WORKER_ID.encode()]

    def close(self) -> None:
        if self._process.poll() is None:
            self._router.send_multipart([WORKER_ID.encode(), encode(Shutdown("test over"))])
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._router.close()
        self._context.term()
