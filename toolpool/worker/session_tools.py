"""A worker bound to a session's shipped tools loads them (SPEC A5, A6).

The client pickled each tool by value (``toolpool.client.shipping``): its function
and its ``@tool`` options. Only a worker started for the session's binding unpickles
them — in its own process, once its confinement is in place (cgroup, rlimits,
network namespace, seccomp), before it connects — and makes each a tool as ``@tool``
makes it. The daemon and the zygote pass the bytes on and never load them.
"""

from __future__ import annotations

from typing import Any

from toolpool.registry import ToolRegistry


class LoadFailure(Exception):
    """The payload did not load here: the message says why, for the pool to tell."""


def load(registry: ToolRegistry, payload: bytes) -> ToolRegistry:
    """``registry`` with the shipped tools beside its own; LoadFailure saying why not."""
    try:
        import dill  # multiprocess's serializer: only a bound worker loads it

        from toolpool.function_tool import tool

        shipped: Any = dill.loads(payload)
        tools = [tool(fn, **options) for _, fn, options in shipped]
        return registry.extended(tools)
    except Exception as exc:  # the client's code, unpickled: anything may go wrong
        hint = ""
        if isinstance(exc, ImportError) and exc.name:
            hint = (
                f" (a module the tools use must be importable where the daemon's "
                f"workers run: {exc.name!r} is not)"
            )
        raise LoadFailure(f"{type(exc).__name__}: {exc}{hint}") from exc
