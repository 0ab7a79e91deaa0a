"""The worker pool: sandboxed worker processes forked by a zygote, and the executor
that runs the engine's calls on them.

- ``pool.py``: ``WorkerPool``, which runs a call on a worker and carries out the
  planner's actions;
- ``planner.py``: the pool's decisions (start, hand over, retire, replace) as pure
  functions of a snapshot, returning actions;
- ``supervisor.py``: the workers' and the zygote's life as the pool sees it (start,
  ready, exit, frames, heartbeats; a dead or hung zygote replaced);
- ``calls.py``: how a call on a worker ends (result, death, cancel, wall time);
- ``processes.py``: the zygote, the workers' socket and cgroups, their termination;
- ``workers.py``: the records (settings, a worker and its states, outcomes);
- ``zygote.py``: the handle of the zygote process (``toolpool.worker.zygote``);
- ``peers.py``: the ZeroMQ ZAP guard that tells who may connect to a socket;
- ``executor.py``: ``PoolExecutor``, the engine's executor interface over the pool.
"""

from __future__ import annotations

from toolpool.pool.executor import PoolExecutor
from toolpool.pool.pool import WorkerPool
from toolpool.pool.workers import PoolConfig, PoolError, PoolOutcome, PoolStatistics

__all__ = ["PoolConfig", "PoolError", "PoolExecutor", "PoolOutcome", "PoolStatistics", "WorkerPool"]
