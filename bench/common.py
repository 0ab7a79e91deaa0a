"""What every scenario needs: a daemon to measure, statistics, the machine's identity."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from toolpool.runtime import read_endpoint

REPO = Path(__file__).resolve().parent.parent
TOOL_MODULES = ("toolpool.tools", "bench.tools")


def env(settings: dict[str, str] | None = None) -> dict[str, str]:
    """The daemon's environment: no user settings but ``settings`` (``TOOLPOOL_*``
    variables); the bench's tools importable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPOOL_")}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), clean.get("PYTHONPATH")]))
    return clean | (settings or {})


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    runtime: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def memory(self) -> dict[str, Any]:
        """Resident (RSS) and unique (USS) memory of the daemon and of each worker."""
        me = psutil.Process(self.pid)
        daemon = me.memory_full_info()
        workers = []
        for child in me.children(recursive=True):
            cmd = " ".join(child.cmdline())
            if "toolpool.worker.zygote" in cmd and child.ppid() == self.pid:
                continue  # the zygote, not a worker
            if child.ppid() != self.pid:  # workers are the zygote's children
                info = child.memory_full_info()
                workers.append({"rss": info.rss, "uss": info.uss})
        zygote = next(
            (c for c in me.children() if "toolpool.worker.zygote" in " ".join(c.cmdline())), None
        )
        return {
            "daemon": {"rss": daemon.rss, "uss": daemon.uss},
            "zygote": None if zygote is None else {"rss": zygote.memory_full_info().rss},
            "workers": workers,
        }


@contextmanager
def daemon(workers: int, *flags: str, settings: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon with ``workers`` pre-started workers (min = max), stopped after;
    ``settings`` are ``TOOLPOOL_*`` environment variables for it."""
    # A short name: the daemon's Unix sockets are made below it.
    with tempfile.TemporaryDirectory(prefix="tpb-") as tmp:
        runtime = Path(tmp) / "rt"
        argv = [sys.executable, "-m", "toolpool", "daemon", "run", "--runtime-dir", str(runtime)]
        argv += ["--min-workers", str(workers), "--max-workers", str(workers)]
        argv += ["--log-level", "warning", "--log-file", str(Path(tmp) / "daemon.log")]
        for module in TOOL_MODULES:
            argv += ["--tool-modules", module]
        process = subprocess.Popen([*argv, *flags], cwd=REPO, env=env(settings))
        try:
            _wait_ready(process, runtime)
            yield Daemon(process, runtime)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen[bytes], runtime: Path) -> None:
    from toolpool.client import Client, ClientError

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the daemon exited with {process.returncode}")
        info = read_endpoint(runtime)
        if info is not None and info.get("pid") == process.pid:
            try:
                with Client(runtime_dir=runtime, connect_timeout=2) as client:
                    status = client.status()
                if status.get("workers", {}).get("idle") == status.get("workers_started"):
                    return
            except ClientError:
                pass
        time.sleep(0.05)
    raise RuntimeError("the daemon did not come up")


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) points, per minute; nan for fewer
    than two distinct times."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return float("nan")
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 60


class ProcessSampler:
    """Samples a process's RSS, open fds and threads every ``interval`` seconds in a
    thread, from ``start()`` to ``stop()``; remembers every descendant it saw (pid →
    create time, command line), so that what is left of them can be found later."""

    def __init__(self, pid: int, interval: float, origin: float | None = None) -> None:
        """``origin``: the ``time.perf_counter()`` the samples' times count from
        (default: the start)."""
        self.pid = pid
        self.interval = interval
        self._origin = origin
        self.samples: list[dict[str, float]] = []  # t (s since start), rss, fds, threads
        self.descendants: dict[int, tuple[float, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._began = 0.0

    def __enter__(self) -> ProcessSampler:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self._began = time.perf_counter() if self._origin is None else self._origin
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def sample(self) -> dict[str, float] | None:
        """One sample now (also kept); None when the process is gone."""
        try:
            process = psutil.Process(self.pid)
            with process.oneshot():
                sample = {
                    "t": round(time.perf_counter() - self._began, 3),
                    "rss": float(process.memory_info().rss),
                    "fds": float(process.num_fds()),
                    "threads": float(process.num_threads()),
                }
            children = process.children(recursive=True)
        except psutil.Error:
            return None
        for child in children:
            try:
                if child.pid not in self.descendants:
                    self.descendants[child.pid] = (child.create_time(), " ".join(child.cmdline()))
            except psutil.Error:
                pass  # it ended between the listing and the look
        self.samples.append(sample)
        return sample

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def series(self, key: str, since: float = 0.0) -> list[tuple[float, float]]:
        return [(s["t"], s[key]) for s in self.samples if s["t"] >= since]

    def left_behind(self, grace: float = 3.0) -> list[dict[str, Any]]:
        """The descendants seen that still run (the same process: its create time
        matches), after waiting up to ``grace`` seconds for them to go."""
        deadline = time.monotonic() + grace
        while True:
            alive = []
            for pid, (created, cmdline) in self.descendants.items():
                try:
                    process = psutil.Process(pid)
                    if (
                        process.create_time() == created
                        and process.status() != psutil.STATUS_ZOMBIE
                    ):
                        alive.append({"pid": pid, "cmdline": cmdline})
                except psutil.Error:
                    pass
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no samples."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50": statistics.median(samples) if samples else float("nan"),
        "p90": percentile(samples, 90),
        "p99": percentile(samples, 99),
        "min": min(samples) if samples else float("nan"),
        "max": max(samples) if samples else float("nan"),
    }


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages: dict[str, str | None] = {}
    for name in ("toolpool", "pyzmq", "msgpack", "jsonschema", "psutil", "pydantic", "multiprocess",
                 "matplotlib", "rich", "ray"):  # fmt: skip
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    import zmq

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "libzmq": zmq.zmq_version(),
        "packages": packages,
        "load_average": os.getloadavg(),
    }


def dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))
