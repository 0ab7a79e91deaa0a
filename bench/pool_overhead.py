"""Per-call overhead through the worker pool, beside its floor, measured in one run.

    .venv/bin/python bench/pool_overhead.py [--calls 2000] [--json out.json]

Four paths, each timing a no-op call end to end, one at a time:

1. floor: a raw pyzmq ROUTER ↔ DEALER round trip to an echo process over ipc://,
   carrying the same msgpack frames a call carries (Execute out, Result back);
2. pool: ``WorkerPool.run`` of the no-op tool (dispatch, worker, result);
3. pipeline + pool: a one-call turn through the coordinator (P1-P12, scheduler,
   events) with the PoolExecutor;
4. pipeline in-process: the same turn with the InProcessExecutor (no process hop).

Medians and p99 in microseconds, and each path's median as a multiple of the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq
import zmq.asyncio

from bench.common import REPO, env, percentile
from bench.tools import bench_noop
from toolpool import ToolCall
from toolpool.cancel import CancelToken
from toolpool.engine import Coordinator, InProcessExecutor
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.protocol import CallContext, CallStatus, Execute, Result, encode
from toolpool.sandbox import Limits


async def timed(calls: int, once: Callable[[], Awaitable[Any]]) -> list[float]:
    for _ in range(min(200, calls // 5)):  # warm up: caches, allocator, branch predictors
        await once()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await once()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


async def floor(calls: int, runtime: Path) -> list[float]:
    """Raw ROUTER ↔ DEALER round trips with a call's frames, to a separate process."""
    request = encode(
        Execute(
            "c1",
            "bench_noop",
            {},
            CallContext(workspace="/tmp", session_id="s"),
            Limits().to_dict(),
        )
    )
    reply = encode(
        Result("c1", CallStatus.OK, {"call_id": "c1", "tool_name": "bench_noop", "content": []})
    )
    endpoint = f"ipc://{runtime}/floor.sock"
    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)
    echo = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bench.floor", "echo", endpoint, reply.hex()), cwd=REPO, env=env()
    )
    try:
        identity, _ = await router.recv_multipart()

        async def once() -> None:
            await router.send_multipart([identity, request])
            await router.recv_multipart()

        return await timed(calls, once)
    finally:
        await router.send_multipart([identity, b"stop"])
        await asyncio.wait_for(echo.wait(), 5)
        router.close(0)
        context.term()


async def measure(calls: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    # A short name: the daemon's Unix sockets are made below it.
    with tempfile.TemporaryDirectory(prefix="tpb-") as tmp:
        runtime = Path(tmp)
        results["floor: raw pyzmq round trip"] = await floor(calls, runtime)
        os.environ["PYTHONPATH"] = env()["PYTHONPATH"]  # the workers import bench.tools
        config = PoolConfig(min_workers=1, max_workers=1, tool_modules=("bench.tools",))
        async with WorkerPool(config) as pool:
            context = CallContext(workspace=tmp, session_id="s")
            execute = Execute("c1", "bench_noop", {}, context, {})
            limits = Limits()

            async def pool_once() -> None:
                await pool.run(
                    execute, network=False, token=CancelToken(), on_progress=print, limits=limits
                )

            results["pool.run"] = await timed(calls, pool_once)
            pooled = Coordinator([bench_noop], executor=PoolExecutor(pool))
            session = pooled.open_session(tmp)
            results["pipeline + pool"] = await timed(
                calls, lambda: pooled.run_turn(session, [ToolCall("c1", "bench_noop", {})])
            )
        local = Coordinator([bench_noop], executor=InProcessExecutor())
        local_session = local.open_session(tmp)
        results["pipeline in-process"] = await timed(
            calls, lambda: local.run_turn(local_session, [ToolCall("c1", "bench_noop", {})])
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.calls))
    base = statistics.median(results["floor: raw pyzmq round trip"])
    print(f"{'path':<32} {'p50 µs':>9} {'p99 µs':>9} {'× floor':>8}")
    for name, samples in results.items():
        p50 = statistics.median(samples)
        print(f"{name:<32} {p50:>9.0f} {percentile(samples, 99):>9.0f} {p50 / base:>8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"calls": args.calls, "samples_us": results}))


if __name__ == "__main__":
    main()
