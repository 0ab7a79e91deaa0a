"""What a provider's format reads of a tool to declare it: its name, description and
schema, and for MCP's annotations its label, permissions and two capabilities asked
without a call. A registry's ``ToolSpec`` is one; the formats need no more of the
tool contract (and so none of what stands below it: ``pyproject.toml``'s contracts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class DescribedTool(Protocol):
    """A tool as a tool list declares it (``toolpool.registry.ToolSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def schema(self) -> dict[str, Any]: ...

    @property
    def permissions(self) -> Sequence[str]: ...

    def label(self) -> str: ...

    def read_only(self, args: dict[str, Any]) -> bool: ...

    def concurrency_safe(self, args: dict[str, Any]) -> bool: ...
