"""The approval gate (SPEC P8): one async decision per call, before execution.

The pipeline knows nothing of policy: a gate is any async callable from a
``GateRequest`` to a ``GateDecision``. No gate means allow; a gate that raises
means deny, with the exception's text as the reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from toolpool.models import ToolCall
from toolpool.registry import ToolSpec


@dataclass(frozen=True, slots=True)
class GateRequest:
    """What a gate decides on: the tool (its capabilities and permission metadata,
    T3), the call with validated arguments, the label and the preview (a diff…), and
    whether that preview was cut at its cap (L10)."""

    spec: ToolSpec
    call: ToolCall
    label: str
    preview: Any
    session_id: str
    preview_truncated: bool = False

    @property
    def tool(self) -> Any:
        """The tool object itself, for gates that look for their own capabilities."""
        return self.spec.tool

    @property
    def tool_name(self) -> str:
        return self.spec.name

    @property
    def read_only(self) -> bool:
        return self.spec.read_only(self.call.arguments)

    @property
    def permissions(self) -> tuple[str, ...]:
        return self.spec.permissions


@dataclass(frozen=True, slots=True)
class GateDecision:
    allowed: bool
    reason: str = ""
    by: str = ""  # who decided, for the record: "client", "policy rule 2", "read-only" …

    @classmethod
    def allow(cls, by: str = "") -> GateDecision:
        return cls(True, by=by)

    @classmethod
    def deny(cls, reason: str, by: str = "") -> GateDecision:
        return cls(False, reason, by)


# A gate may also return None, which allows: no decision is no objection.
Gate = Callable[[GateRequest], Awaitable[GateDecision | None]]
