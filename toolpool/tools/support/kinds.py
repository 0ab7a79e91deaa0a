"""Capabilities (SPEC T2) that whole kinds of built-in tools share."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from toolpool.tool import Arguments, InterruptBehavior, ToolContext
from toolpool.tools.support.paths import Access, resolve


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


class CommandTool:
    """A tool that runs commands (bash, and the providers' shells as bash runs them): a
    command can do anything (the kernel cannot tell ls from rm), so it is neither
    read-only nor safe beside others (S1), an interrupt cancels it, and it asks for
    every permission a command may use. The same for every call (T2's fixed answers);
    ``label_text`` is the tool's label."""

    label_text: ClassVar[str]

    def label(self) -> str:
        return self.label_text

    def permissions(self) -> list[str]:
        return ["exec", "read", "write", "network"]

    def fixed_answers(self) -> dict[str, Any]:
        return {
            "label": self.label_text,
            "read_only": False,
            "concurrency_safe": False,
            "interrupt_behavior": InterruptBehavior.CANCEL,
        }
