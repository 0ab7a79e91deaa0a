"""Exceptions raised by toolpool. One base class; families named by cause.

A tool's failure is never an exception to toolpool's caller: the pipeline turns it
into a ToolResult with ``is_error``. These exceptions are for programming errors
(a tool that breaks the contract) and for tools that want to fail cleanly.
"""

from __future__ import annotations

from typing import Any


class ToolpoolError(Exception):
    """Base class of every exception toolpool raises on purpose."""


class ToolDefinitionError(ToolpoolError):
    """A tool does not meet the contract (SPEC T1) or its schema is not valid."""


class ToolError(ToolpoolError):
    """Raise inside a tool to fail with a message for the model and no traceback.

    ``details`` are copied into the error result's details; ``code`` (an ErrorCode
    value such as "limit_exceeded" or "sandbox_failed") replaces the default
    "execution_failed". ``reason`` is a stable name for why (``not_found``,
    ``changed_before_write``…) and ``explanation`` what the message says past the
    reason's own sentence: a tool profile says the reason in its agent's words and
    keeps the explanation (``toolpool/adapter.py``), reading no English. Neither
    leaves the process: the result carries the message and details.
    """

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        code: str | None = None,
        reason: str = "",
        explanation: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        self.code = code
        self.reason = reason
        self.explanation = explanation
