"""The worker pool: sandboxed worker processes forked by a zygote, and the executor
that runs the engine's calls on them.

- ``pool.py``: ``WorkerPool``, the pool's face (``submit``, ``run``) and the keeper of
  its workers, which carries out the planner's actions;
- ``dispatch.py``: the calls — queued, given to workers several to a frame, each one's
  life until its ``done`` (result, cancel, wall time, withdrawal, its worker's death);
- ``holding.py``: which waiting calls go to which worker (SPEC H4), as pure decisions;
- ``planner.py``: the pool's decisions about workers (start, retire, replace) as pure
  functions of a snapshot, returning actions;
- ``supervisor.py``: the workers' and the zygote's life as the pool sees it (start,
  ready, exit, frames, heartbeats; a dead or hung zygote replaced), reported to the
  pool through ``WorkerEvents``;
- ``calls.py``: the outcomes a call can end with;
- ``processes.py``: the zygote, the workers' socket and cgroups, their termination;
- ``workers.py``: the records (settings, a worker, a call, and their states; outcomes;
  the kinds of worker, a session's binding of its shipped tools among them);
- ``zygote.py``: the handle of the zygote process (``toolpool.worker.zygote``);
- ``peers.py``: the ZeroMQ ZAP guard that tells who may connect to a socket;
- ``executor.py``: ``PoolExecutor``, the engine's executor interface over the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolpool.pool.workers import Binding, PoolConfig, PoolError, PoolOutcome, PoolStatistics

if TYPE_CHECKING:
    from toolpool.pool.executor import PoolExecutor
    from toolpool.pool.pool import WorkerPool


def __getattr__(name: str) -> Any:
    """``WorkerPool`` and ``PoolExecutor``, imported when first asked for (PEP 562): the
    daemon's configuration reads the pool's settings (``PoolConfig``) without loading
    the pool, and the tools and sandbox it imports, into every ``toolpool`` command."""
    if name == "WorkerPool":
        from toolpool.pool.pool import WorkerPool

        return WorkerPool
    if name == "PoolExecutor":
        from toolpool.pool.executor import PoolExecutor

        return PoolExecutor
    raise AttributeError(f"module 'toolpool.pool' has no attribute {name!r}")


__all__ = [
    "Binding",
    "PoolConfig",
    "PoolError",
    "PoolExecutor",
    "PoolOutcome",
    "PoolStatistics",
    "WorkerPool",
]
