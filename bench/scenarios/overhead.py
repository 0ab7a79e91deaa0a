"""Scenario 1, overhead: a no-op call through the full stack (client → daemon →
pipeline → worker → back), beside the raw two-hop pyzmq floor and a direct
in-process call, one call at a time, in one run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench.common import REPO, daemon, env, summary
from bench.tools import bench_noop, noop
from toolpool import Client, ToolCall, ToolResult
from toolpool.engine import Coordinator, InProcessExecutor
from toolpool.models import (
    Event,
    MessageEnd,
    MessageStart,
    TextBlock,
    ToolEnd,
    ToolMessage,
    TurnEnd,
)
from toolpool.protocol import Submit, TurnEvent, encode, event_to_wire

NAME = "overhead"


def _call_frames() -> tuple[bytes, bytes]:
    """A one-call Submit and the events that end its turn (in one frame, as the daemon
    batches them): a call's frame sizes."""
    call = ToolCall("c1", "bench_noop", {})
    submit = encode(Submit("r1", "0123456789ab", [call.to_dict()], "toolpool"))
    result = ToolResult("c1", "bench_noop", (TextBlock("ok"),))
    message = ToolMessage.from_result(result)
    ending: list[Event] = [
        ToolEnd("c1", "bench_noop", result),
        MessageStart(message),
        MessageEnd(message),
        TurnEnd((result,)),
    ]
    end = encode(TurnEvent("0123456789ab", [event_to_wire(e) for e in ending]))
    return submit, end


def floor(calls: int, warmup: int) -> list[float]:
    request, reply = _call_frames()
    with tempfile.TemporaryDirectory(prefix="toolpool-floor-") as tmp:
        client_ep, worker_ep = f"ipc://{tmp}/client.sock", f"ipc://{tmp}/worker.sock"
        run = [sys.executable, "-m", "bench.floor"]
        relay = subprocess.Popen([*run, "relay", client_ep, worker_ep], cwd=REPO, env=env())
        echo = subprocess.Popen([*run, "echo", worker_ep, reply.hex()], cwd=REPO, env=env())
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.connect(client_ep)
        try:
            samples = []
            for i in range(warmup + calls):
                started = time.perf_counter()
                socket.send(request)
                socket.recv()
                if i >= warmup:
                    samples.append((time.perf_counter() - started) * 1e6)
            socket.send(b"stop")
            socket.recv()
        finally:
            socket.close(0)
            context.term()
            relay.wait(10)
            echo.wait(10)
    return samples


def full_stack(calls: int, warmup: int, workspace: Path) -> tuple[list[float], dict[str, Any]]:
    with daemon(workers=2) as running:
        idle_memory = running.memory()
        with Client(runtime_dir=running.runtime) as client, client.session(workspace) as session:
            samples = []
            for i in range(warmup + calls):
                started = time.perf_counter()
                (result,) = session.submit([ToolCall(f"c{i}", "bench_noop", {})]).results()
                elapsed = (time.perf_counter() - started) * 1e6
                assert result.text == "ok", result.text
                if i >= warmup:
                    samples.append(elapsed)
    return samples, idle_memory


def direct(calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        noop()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def in_process_pipeline(calls: int, warmup: int, workspace: Path) -> list[float]:
    coordinator = Coordinator([bench_noop], executor=InProcessExecutor())
    session = coordinator.open_session(workspace)

    async def measure() -> list[float]:
        samples = []
        for i in range(warmup + calls):
            started = time.perf_counter()
            await coordinator.run_turn(session, [ToolCall(f"c{i}", "bench_noop", {})])
            if i >= warmup:
                samples.append((time.perf_counter() - started) * 1e6)
        return samples

    return asyncio.run(measure())


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    calls, warmup = (200, 50) if quick else (3000, 300)
    floor_us = floor(calls, warmup)
    stack_us, idle_memory = full_stack(calls, warmup, workspace)
    samples = {
        "floor: raw pyzmq, two hops": floor_us,
        "toolpool: client → daemon → worker": stack_us,
        "in-process pipeline (no process hop)": in_process_pipeline(calls, warmup, workspace),
        "direct function call": direct(calls),
    }
    return {
        "samples_us": samples,
        "summary_us": {name: summary(values) for name, values in samples.items()},
        "idle_memory": idle_memory,
    }
