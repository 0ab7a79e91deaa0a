"""Capabilities (SPEC T2) that whole kinds of built-in tools share."""

from __future__ import annotations

from pathlib import Path

from toolpool.tool import Arguments, ToolContext
from toolpool.tools.paths import Access, resolve


class ReadingTool:
    """A tool that only reads: read-only, and so safe to run beside others (S1); it
    asks for the "read" permission."""

    def permissions(self) -> list[str]:
        return ["read"]

    def read_only(self, args: Arguments) -> bool:
        return True

    def concurrency_safe(self, args: Arguments) -> bool:
        return True

    def fixed_answers(self) -> dict[str, bool]:
        return {"read_only": True, "concurrency_safe": True}


class FileWritingTool:
    """A tool that writes the one file its ``path`` argument names (F3 applies to it);
    it asks for the "write" permission."""

    def permissions(self) -> list[str]:
        return ["write"]

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        return [resolve(args["path"], ctx, Access.WRITE)]
