"""The circuit breaker: consecutive failures per tool name, per session (SPEC P2, P11).

Which outcomes count is one table, ``BREAKER_EFFECT``, mirroring SPEC's accounting
table: a policy "no", a cancellation or the breaker itself are not the tool's fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from toolpool.models import ErrorCode, ToolResult


class BreakerEffect(Enum):
    NONE = "not counted"
    FAILURE = "+1"
    RESET = "reset to 0"


# Error outcomes that do not count. Every other error adds one; a success resets.
_NOT_COUNTED = frozenset(
    {
        ErrorCode.CANCELLED,  # P1 (and S5 in flight): the user's decision
        ErrorCode.INTERRUPTED,  # S4 in flight: the user's decision
        ErrorCode.SKIPPED,  # S4 never started
        ErrorCode.BREAKER_OPEN,  # P2: counting it would keep the breaker open forever
        ErrorCode.DENIED,  # P8: a policy "no" is not the tool's fault
    }
)


def breaker_effect(result: ToolResult) -> BreakerEffect:
    if not result.is_error:
        return BreakerEffect.RESET
    if result.error_code in _NOT_COUNTED:
        return BreakerEffect.NONE
    return BreakerEffect.FAILURE


@dataclass(frozen=True, slots=True)
class BreakerStatistics:
    max_tool_errors: int
    failures: dict[str, int]
    open: tuple[str, ...]


class Breaker:
    """Consecutive-failure counts by tool name; open at ``max_tool_errors`` (0 = never)."""

    def __init__(self, max_tool_errors: int = 3) -> None:
        if max_tool_errors < 0:
            raise ValueError("max_tool_errors must be >= 0 (0 disables the breaker)")
        self.max_tool_errors = max_tool_errors
        self._failures: dict[str, int] = {}
        self._last_failure: dict[str, str] = {}  # tool name: the id of its last failed call

    def failures(self, tool_name: str) -> int:
        return self._failures.get(tool_name, 0)

    def last_failure(self, tool_name: str) -> str | None:
        """The id of the call whose failure was the last one counted for the tool."""
        return self._last_failure.get(tool_name)

    def is_open(self, tool_name: str) -> bool:
        limit = self.max_tool_errors
        return limit > 0 and self._failures.get(tool_name, 0) >= limit

    def record(self, result: ToolResult) -> BreakerEffect:
        """Account for one finished call (P11) and say what it did to the count."""
        if not result.is_error and not self._failures:
            return BreakerEffect.RESET  # nothing counted to reset: the common case
        effect = breaker_effect(result)
        if effect is BreakerEffect.FAILURE:
            self._failures[result.tool_name] = self.failures(result.tool_name) + 1
            self._last_failure[result.tool_name] = result.call_id
        elif effect is BreakerEffect.RESET:
            self._failures.pop(result.tool_name, None)
            self._last_failure.pop(result.tool_name, None)
        return effect

    def statistics(self) -> BreakerStatistics:
        return BreakerStatistics(
            self.max_tool_errors,
            dict(self._failures),
            tuple(n for n in self._failures if self.is_open(n)),
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"<Breaker max={stats.max_tool_errors} failures={stats.failures} "
            f"open={list(stats.open)}>"
        )
