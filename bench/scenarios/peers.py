"""Scenario 6, peers: the same functions run by what a user might pick instead —
concurrent.futures.ProcessPoolExecutor, multiprocess.Pool, Ray when installed — beside
toolpool with as many workers, in the same run. Also grep through toolpool beside
the raw ripgrep command it runs."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.util
import os
import shutil
import statistics
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import multiprocess

from bench.common import daemon, summary
from bench.tools import noop, sleep_ms, spin_ms
from toolpool import Client, ToolCall
from toolpool.tools.support.ripgrep import RIPGREP_DEFAULTS, ripgrep_executable

NAME = "peers"
WORKERS = 2

# kind → (the function, its arguments, the toolpool tool, calls per batch)
WORK: dict[str, tuple[Callable[..., Any], tuple[Any, ...], str, dict[str, Any]]] = {
    "no-op": (noop, (), "bench_noop", {}),
    "sleep 20 ms": (sleep_ms, (20,), "bench_sleep", {"ms": 20}),
    "cpu 20 ms": (spin_ms, (20,), "bench_spin", {"ms": 20}),
}


def _batch_sizes(quick: bool) -> dict[str, int]:
    return {
        "no-op": 100 if quick else 1000,
        "sleep 20 ms": 20 if quick else 100,
        "cpu 20 ms": 20 if quick else 100,
    }


def _rates(
    batch: Callable[[Callable[..., Any], tuple[Any, ...], int], None],
    sizes: dict[str, int],
    repeats: int,
) -> dict[str, float]:
    """Calls per second of each kind of work, run by ``batch(function, args, n)``."""
    return {
        kind: sizes[kind] / _timed(functools.partial(batch, f, args, sizes[kind]), repeats)
        for kind, (f, args, _, _) in WORK.items()
    }


def _timed(run: Callable[[], Any], repeats: int) -> float:
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


def _latency(one: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        one()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    sizes = _batch_sizes(quick)
    repeats = 1 if quick else 3
    latency_n = 100 if quick else 1000
    throughput: dict[str, dict[str, float]] = {}
    latency: dict[str, dict[str, float]] = {}

    with concurrent.futures.ProcessPoolExecutor(WORKERS) as executor:
        executor.submit(noop).result()

        def executor_batch(f: Callable[..., Any], args: tuple[Any, ...], n: int) -> None:
            for future in [executor.submit(f, *args) for _ in range(n)]:
                future.result()

        throughput["ProcessPoolExecutor"] = _rates(executor_batch, sizes, repeats)
        latency["ProcessPoolExecutor"] = summary(
            _latency(lambda: executor.submit(noop).result(), latency_n)
        )

    with multiprocess.Pool(WORKERS) as pool:
        pool.apply(noop)

        def pool_batch(f: Callable[..., Any], args: tuple[Any, ...], n: int) -> None:
            for pending in [pool.apply_async(f, args) for _ in range(n)]:
                pending.get()

        throughput["multiprocess.Pool"] = _rates(pool_batch, sizes, repeats)
        latency["multiprocess.Pool"] = summary(_latency(lambda: pool.apply(noop), latency_n))

    with daemon(WORKERS) as running, Client(runtime_dir=running.runtime) as client:
        with client.session(workspace, max_tool_concurrency=16) as session:
            rates = {}
            for kind, (_, _, name, args) in WORK.items():
                calls = [ToolCall(f"c{i}", name, args) for i in range(sizes[kind])]
                session.submit(calls[:8]).results()  # warm up
                rates[kind] = sizes[kind] / _timed(
                    functools.partial(lambda c: session.submit(c).results(), calls), repeats
                )
            throughput["toolpool"] = rates
            counter = iter(range(10**9))
            latency["toolpool"] = summary(
                _latency(
                    lambda: session.submit(
                        [ToolCall(f"l{next(counter)}", "bench_noop", {})]
                    ).results(),
                    latency_n,
                )
            )
        grep = _grep(client, workspace, 3 if quick else 15)
    # The default quota holds each worker (and the rg it runs) to one CPU, while raw
    # rg uses every core: measured again with the quota at the machine's core count.
    cores = os.cpu_count() or 1
    with (
        daemon(WORKERS, settings={"TOOLPOOL_WORKER_CPUS": str(cores)}) as running,
        Client(runtime_dir=running.runtime) as client,
    ):
        grep["toolpool_all_cores_ms"] = _grep(client, workspace, 3 if quick else 15)["toolpool_ms"]
    grep["cores"] = cores

    ray_note = None
    if importlib.util.find_spec("ray") is None:
        ray_note = "Ray is not installed (pip install ray to compare with Ray tasks and actors)"
    else:  # pragma: no cover - only where Ray is installed
        throughput["Ray tasks"], latency["Ray tasks"] = _ray(sizes, repeats, latency_n)
    return {
        "workers": WORKERS,
        "batch_sizes": sizes,
        "throughput_calls_per_second": throughput,
        "latency_us": latency,
        "ray": ray_note,
        "grep": grep,
    }


def _grep(client: Any, workspace: Path, repeats: int) -> dict[str, Any]:
    """The same search, by raw rg (with the flags the grep tool passes) and through
    toolpool, over the whole standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    pattern = r"def test_\w+"
    argv = [ripgrep_executable(), *RIPGREP_DEFAULTS, "--files-with-matches", "--", pattern]
    raw = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(argv, cwd=stdlib, capture_output=True, check=False)
        raw.append((time.perf_counter() - started) * 1000)
    through = []
    with client.session(workspace, extra_roots=[str(stdlib)]) as session:
        for i in range(repeats):
            started = time.perf_counter()
            (result,) = session.submit(
                [
                    ToolCall(
                        f"g{i}",
                        "grep",
                        {"pattern": pattern, "path": str(stdlib), "head_limit": 100000},
                    )
                ]
            ).results()
            through.append((time.perf_counter() - started) * 1000)
            assert not result.is_error, result.text
    return {
        "pattern": pattern,
        "tree": str(stdlib),
        "raw_rg_ms": summary(raw),
        "toolpool_ms": summary(through),
    }


def _ray(
    sizes: dict[str, int], repeats: int, latency_n: int
) -> tuple[dict[str, float], dict[str, float]]:  # pragma: no cover
    import ray

    # Ray's sockets live under its temp dir, and a Unix socket's path is at most 107
    # bytes: a deep $TMPDIR (a test's) would not do.
    temp = tempfile.mkdtemp(prefix="tpray-", dir="/tmp")
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    try:
        remote = {f: ray.remote(f) for f, _, _, _ in WORK.values()}
        ray.get(remote[noop].remote())

        def ray_batch(f: Callable[..., Any], args: tuple[Any, ...], n: int) -> None:
            ray.get([remote[f].remote(*args) for _ in range(n)])

        rates = _rates(ray_batch, sizes, repeats)
        lat = summary(_latency(lambda: ray.get(remote[noop].remote()), latency_n))
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    return rates, lat
