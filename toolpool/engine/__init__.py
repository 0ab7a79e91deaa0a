"""The engine: sessions, the ordered pipeline, the turn scheduler, turns (SPEC D1).

No sockets and no processes: calls are carried out through the ``Executor``
interface (``executor.py``) — in-process (``inprocess.py``) for tests and embedding,
on the worker pool (``toolpool.pool.PoolExecutor``) in the daemon. ``Coordinator``
(``coordinator.py``) holds the pieces together.
"""

from toolpool.engine.breaker import Breaker, BreakerEffect, breaker_effect
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.executor import ExecutionRequest, Executor
from toolpool.engine.gate import Gate, GateDecision, GateRequest
from toolpool.engine.hold import Hold
from toolpool.engine.inprocess import InProcessExecutor
from toolpool.engine.middleware import Middleware, Next
from toolpool.engine.pipeline import Pipeline
from toolpool.engine.scheduler import TurnScheduler
from toolpool.engine.session import Session
from toolpool.engine.turn import Turn

__all__ = [
    "Breaker",
    "BreakerEffect",
    "Coordinator",
    "ExecutionRequest",
    "Executor",
    "Gate",
    "GateDecision",
    "GateRequest",
    "Hold",
    "InProcessExecutor",
    "Middleware",
    "Next",
    "Pipeline",
    "Session",
    "Turn",
    "TurnScheduler",
    "breaker_effect",
]
