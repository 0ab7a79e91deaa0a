"""The coordinator: sessions, the ordered pipeline, the turn scheduler (SPEC D1)."""

from toolpool.coordinator.breaker import Breaker, BreakerEffect, breaker_effect
from toolpool.coordinator.executor import ExecutionRequest, Executor
from toolpool.coordinator.gate import Gate, GateDecision, GateRequest
from toolpool.coordinator.inprocess import InProcessExecutor
from toolpool.coordinator.middleware import Middleware, Next
from toolpool.coordinator.pipeline import Pipeline
from toolpool.coordinator.runtime import Coordinator
from toolpool.coordinator.scheduler import TurnScheduler
from toolpool.coordinator.session import Session
from toolpool.coordinator.turn import Turn

__all__ = [
    "Breaker",
    "BreakerEffect",
    "Coordinator",
    "ExecutionRequest",
    "Executor",
    "Gate",
    "GateDecision",
    "GateRequest",
    "InProcessExecutor",
    "Middleware",
    "Next",
    "Pipeline",
    "Session",
    "Turn",
    "TurnScheduler",
    "breaker_effect",
]
