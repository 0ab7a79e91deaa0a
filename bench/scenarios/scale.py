"""Scenario scale: toolpool on a Ray cluster (``toolpool.ray``) beside one daemon.

A Ray cluster of two nodes is started on this machine (head and worker, loopback
only). The same load — ``sessions`` concurrent sessions, each a thread of its own
with its own client, submitting one-call turns of ``bench_noop`` one after another —
runs against one daemon (a Unix socket), against a ``ToolpoolCluster`` restricted to
one node (TCP with CURVE, through the session proxy) and against one on both nodes.
Every daemon has the same workers. Also measured: what placing a session costs
(``cluster.session(...)`` against ``client.session(...)``, a path and a tarball),
the cluster's status poll, Ray's node table read, a tarball put into the object
store, and each daemon's memory. Both nodes share this machine's cores: the two-node
figures say what the placement and the second daemon cost, not what a second
machine would add.
"""

from __future__ import annotations

import base64
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psutil

from bench.common import TOOL_MODULES, daemon, env, summary
from bench.format import MiB, num, times
from toolpool import Client, ToolCall

NAME = "scale"
WORKERS = 2  # per daemon, min = max, as the single daemon's
HOST = "127.0.0.1"
PLACEMENTS = (10, 40)  # sessions opened one after another to time it: quick, full

Opener = Callable[[], AbstractContextManager[Any]]


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    import ray
    import ray._private.ray_constants as ray_constants
    from ray.cluster_utils import Cluster

    from toolpool.ray import ToolpoolCluster, pack

    counts = [8] if quick else [8, 32]
    calls = 30 if quick else 150
    repeats = 1 if quick else 3
    placements = PLACEMENTS[not quick]
    project = workspace / "scale"
    (project / "src").mkdir(parents=True, exist_ok=True)
    for i in range(50):  # a small repository's worth: ~1 MB that does not compress away
        text = base64.b64encode(os.urandom(15_000)).decode()
        (project / "src" / f"module{i}.py").write_text(f"DATA = {text!r}\n")
    tarball = pack(project)
    data: dict[str, Any] = {
        "workers_per_daemon": WORKERS,
        "calls_per_session": calls,
        "repeats": repeats,
        "calls_per_second": {},
        "placement_ms": {},
        "memory": {},
    }

    with daemon(WORKERS) as single:

        def one_client() -> AbstractContextManager[Any]:
            return _client_session(lambda: Client(runtime_dir=single.runtime), project)

        data["calls_per_second"]["one daemon"] = _rates(one_client, counts, calls, repeats)
        with Client(runtime_dir=single.runtime) as client:
            data["placement_ms"]["client.session (one client)"] = _timed_opens(
                lambda: client.session(project), placements
            )
        data["placement_ms"]["Client() + session"] = _timed_opens(one_client, placements)
        data["memory"]["one daemon"] = _tree_memory(single.pid)
        data["session_memory"] = _session_memory(single, project, 100 if quick else 500)

    # Ray turns a loopback address into the machine's own IP unless it believes it
    # runs without a cluster: say so, so that every process stays on 127.0.0.1.
    ray_constants.ENABLE_RAY_CLUSTER = False
    started = time.perf_counter()
    nodes: Any = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": HOST, "include_dashboard": False},
    )
    try:
        nodes.add_node(num_cpus=1, node_ip_address=HOST)
        ray.init(address=nodes.address, _node_ip_address=HOST, log_to_driver=False)
        nodes.wait_for_nodes()
        data["ray_start_seconds"] = round(time.perf_counter() - started, 1)
        head = str(nodes.head_node.node_id)
        # The same daemon again, with Ray's processes running beside it on the same
        # cores: what is the cluster's transport and what is Ray's own load.
        with daemon(WORKERS) as beside:

            def beside_ray() -> AbstractContextManager[Any]:
                return _client_session(lambda: Client(runtime_dir=beside.runtime), project)

            data["calls_per_second"]["one daemon, Ray running"] = _rates(
                beside_ray, counts, calls, repeats
            )

        def head_only(node: Mapping[str, Any]) -> bool:
            return bool(node["NodeID"] == head)

        settings = {"min_workers": WORKERS, "max_workers": WORKERS, "tool_modules": TOOL_MODULES}
        for label, only in (("1 node", head_only), ("2 nodes", None)):
            began = time.perf_counter()
            with ToolpoolCluster(
                settings=settings, env={"PYTHONPATH": env()["PYTHONPATH"]}, node_filter=only
            ) as cluster:
                data.setdefault("cluster_start_seconds", {})[label] = round(
                    time.perf_counter() - began, 1
                )
                load = (counts, calls, repeats, placements)
                _on_cluster(cluster, label, head, project, tarball, data, load)
                data.setdefault("status_ms", {})[label] = summary(
                    _samples(cluster.status, placements)
                )
        data["ray_nodes_ms"] = summary(_samples(ray.nodes, placements))
        data["tarball_bytes"] = len(tarball)
        data["ray_put_ms"] = summary(_samples(lambda: ray.put(tarball), placements))
    finally:
        ray.shutdown()
        nodes.shutdown()
    return data


def _on_cluster(
    cluster: Any,
    label: str,
    head: str,
    project: Path,
    tarball: bytes,
    data: dict[str, Any],
    load: tuple[list[int], int, int, int],
) -> None:
    """The load, the placements and the daemons' memory on one ToolpoolCluster."""

    def on_path() -> Any:
        return cluster.session(project)

    def on_tarball() -> Any:
        return cluster.session(tarball)

    counts, calls, repeats, placements = load
    data["calls_per_second"][f"cluster, {label}"] = _rates(on_path, counts, calls, repeats)
    data["placement_ms"][f"cluster.session(path), {label}"] = _timed_opens(on_path, placements)
    data["placement_ms"][f"cluster.session(tarball), {label}"] = _timed_opens(
        on_tarball, placements
    )
    for node_id, node in cluster.status()["nodes"].items():
        tag = "head" if node_id == head else "worker"
        data["memory"][f"cluster {label}: {tag} node"] = _tree_memory(node["daemon_pid"])


@contextlib.contextmanager
def _client_session(make: Callable[[], Client], workspace: Path) -> Iterator[Any]:
    """A client of its own and a session on it: what a thread of an agent runner
    holds (a sync client belongs to one thread)."""
    with make() as client, client.session(workspace) as session:
        yield session


def _rates(open_session: Opener, counts: list[int], calls: int, repeats: int) -> dict[str, Any]:
    """Calls per second of ``n`` concurrent sessions, for each ``n`` of ``counts``:
    the median of ``repeats`` runs, and every run."""
    out: dict[str, Any] = {}
    for n in counts:
        runs = [_load(open_session, n, calls) for _ in range(repeats)]
        out[str(n)] = {"median": statistics.median(runs), "runs": runs}
    return out


def _load(open_session: Opener, sessions: int, calls: int) -> float:
    """``sessions`` threads, each with its own session, submit ``calls`` one-call
    turns one after another, all starting together: calls per second of the whole."""
    start = threading.Barrier(sessions + 1)
    failures: list[str] = []

    def one() -> None:
        try:
            with open_session() as session:
                session.submit([ToolCall("warm", "bench_noop", {})]).results()
                start.wait()
                for i in range(calls):
                    turn = session.submit([ToolCall(f"c{i}", "bench_noop", {})], events="results")
                    (result,) = turn.results()
                    if result.is_error:
                        failures.append(result.text)
        except BaseException as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            start.abort()

    threads = [threading.Thread(target=one, name=f"session-{i}") for i in range(sessions)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    if failures:
        raise RuntimeError(f"{len(failures)} calls or sessions failed: {failures[0]}")
    return sessions * calls / wall


def _timed_opens(open_session: Opener, n: int) -> dict[str, float]:
    """ms to open a session (and, apart, to close it), ``n`` times one after another."""
    opens, closes = [], []
    for _ in range(n):
        began = time.perf_counter()
        opened = open_session()
        session = opened.__enter__()
        opens.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        opened.__exit__(None, None, None)
        closes.append((time.perf_counter() - began) * 1000)
        del session
    return {**summary(opens), "close_p50": statistics.median(closes)}


def _samples(step: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        step()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def _session_memory(single: Any, workspace: Path, sessions: int) -> dict[str, float]:
    """The daemon's own memory with ``sessions`` open (and one read each: a file-read
    register that holds something), against before: bytes per session."""
    per_client = 64  # max_sessions_per_client's default
    me = psutil.Process(single.pid)
    before = me.memory_full_info()
    with contextlib.ExitStack() as stack:
        client = None
        for i in range(sessions):
            if i % per_client == 0:
                client = stack.enter_context(Client(runtime_dir=single.runtime))
            assert client is not None
            session = stack.enter_context(client.session(workspace))
            read = ToolCall("r", "read", {"path": "src/module0.py", "limit": 5})
            session.submit([read]).results()
        during = me.memory_full_info()
    return {
        "sessions": sessions,
        "uss_per_session": (during.uss - before.uss) / sessions,
        "rss_per_session": (during.rss - before.rss) / sessions,
    }


def _tree_memory(pid: int) -> dict[str, float]:
    """Unique (USS) and resident (RSS) bytes of a daemon, its zygote and workers."""
    uss = rss = 0.0
    processes = 0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            info = process.memory_full_info()
            uss += info.uss
            rss += info.rss
            processes += 1
    return {"uss": uss, "rss": rss, "processes": processes}


def report(sc: dict[str, Any]) -> list[str]:
    """The report's section."""
    rates = sc["calls_per_second"]
    counts = list(rates["one daemon"])
    base = rates["one daemon"]
    lines = [
        "",
        f"## Scale: toolpool.ray on a two-node Ray cluster of this machine ({WORKERS} "
        "workers per daemon)",
        "",
        f"Concurrent sessions, each {sc['calls_per_session']} one-call `bench_noop` turns "
        f"(median of {sc['repeats']}); both nodes share this machine's cores.",
        "",
        "| daemons | " + " | ".join(f"{n} sessions calls/s" for n in counts) + " |",
        "|---|" + "---:|" * len(counts),
    ]
    for name, by_count in rates.items():
        cells = [
            f"{num(by_count[n]['median'])} ({times(by_count[n]['median'], base[n]['median'])})"
            for n in counts
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    one = sc["placement_ms"]["client.session (one client)"]["p50"]
    lines += [
        "",
        "In parentheses: as a multiple of one daemon's rate.",
        "",
        "| opening a session | p50 ms | p99 ms | × client.session | close p50 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in sc["placement_ms"].items():
        lines.append(
            f"| {name} | {num(v['p50'], 2)} | {num(v['p99'], 2)} | {times(v['p50'], one)} "
            f"| {num(v['close_p50'], 2)} |"
        )
    lines += [
        "",
        "| daemon | processes | unique MB | resident MB |",
        "|---|---:|---:|---:|",
    ]
    for name, m in sc["memory"].items():
        lines.append(
            f"| {name} | {m['processes']} | {num(m['uss'] / MiB, 1)} | {num(m['rss'] / MiB, 1)} |"
        )
    per = sc["session_memory"]
    lines += [
        "",
        f"One daemon with {per['sessions']} sessions open (one read each): "
        f"{num(per['uss_per_session'] / 1024, 1)} kB unique, "
        f"{num(per['rss_per_session'] / 1024, 1)} kB resident per session.",
    ]
    status = ", ".join(f"{k} {num(v['p50'], 2)} ms" for k, v in sc["status_ms"].items())
    lines += [
        "",
        f"`cluster.status()` p50: {status}; `ray.nodes()` p50 "
        f"{num(sc['ray_nodes_ms']['p50'], 2)} ms; `ray.put` of a "
        f"{num(sc['tarball_bytes'] / 1024, 0)} kB tarball p50 {num(sc['ray_put_ms']['p50'], 2)} "
        f"ms. Ray's two nodes started in {sc['ray_start_seconds']} s; the clusters' daemons in "
        + ", ".join(f"{k}: {v} s" for k, v in sc["cluster_start_seconds"].items())
        + ".",
    ]
    return lines
