"""Middleware around execution (SPEC P10): an onion, the outermost runs first.

A middleware is an async callable ``(request, call_next) -> ToolResult``. It may
look at or change the request, call ``call_next`` (the next layer, and at the
centre the executor), look at or change the result, or answer without calling
``call_next`` at all (a short-circuit: cache hits, dry runs, audits that refuse).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from toolpool.engine.executor import ExecutionRequest
from toolpool.models import ToolResult

Next = Callable[[ExecutionRequest], Awaitable[ToolResult]]
Middleware = Callable[[ExecutionRequest, Next], Awaitable[ToolResult]]


def build_chain(middlewares: Sequence[Middleware], innermost: Next) -> Next:
    """Wrap ``innermost`` so that ``middlewares[0]`` is the outermost layer."""
    handler = innermost
    for middleware in reversed(middlewares):
        handler = _layer(middleware, handler)
    return handler


def _layer(middleware: Middleware, call_next: Next) -> Next:
    async def handle(request: ExecutionRequest) -> ToolResult:
        return await middleware(request, call_next)

    return handle
