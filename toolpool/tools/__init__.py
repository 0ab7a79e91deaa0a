"""The built-in tools (SPEC F1): read, glob, grep, ls, edit, multi_edit, apply_patch,
write — and bash; the profiles' adapters over them (F12); and the providers' own tools
over them (OpenAI's apply_patch, shell and local_shell, Anthropic's bash and text
editor: F15–F18, ``toolpool.declared``).

Every one resolves paths against the session's workspace and refuses paths outside
it and its extra roots (``support/paths.py``). read, edit and write share the session's
file-read register: edit and write change only files read whole and unchanged since
(F2, F3), and renew the stamp after writing (F5). ``docs/tools.md`` describes them.

Each module here is a tool (or a tool family: ``shells`` has bash_output and
kill_shell); what they share, and none of them is, is in ``toolpool.tools.support``.
"""

import importlib
from typing import Any

from toolpool.tools.apply_patch import ApplyPatchTool, apply_patch_tool
from toolpool.tools.bash import Bash, bash
from toolpool.tools.edit import EditTool
from toolpool.tools.glob import GlobTool
from toolpool.tools.grep import GrepTool
from toolpool.tools.ls import LsTool
from toolpool.tools.multi_edit import MultiEditTool, multi_edit_tool
from toolpool.tools.notebook_edit import NotebookEditTool, notebook_edit_tool
from toolpool.tools.read import ReadTool
from toolpool.tools.shells import BashOutput, KillShell, bash_output, kill_shell
from toolpool.tools.write import WriteTool

read_tool = ReadTool()
glob_tool = GlobTool()
grep_tool = GrepTool()
ls_tool = LsTool()
edit_tool = EditTool()
write_tool = WriteTool()

FILE_TOOLS = [
    read_tool,
    glob_tool,
    grep_tool,
    ls_tool,
    edit_tool,
    multi_edit_tool,
    apply_patch_tool,
    write_tool,
    notebook_edit_tool,
]
BUILTIN_TOOLS = [*FILE_TOOLS, bash, bash_output, kill_shell]
# The lists with the profiles' adapters and the providers' tools are assembled above
# this package (it imports no profile: pyproject.toml's contracts); they are named
# here too, read from there when first asked for, so that ``--tool-modules
# toolpool.tools`` and ``toolpool.tools.TOOLS`` mean the whole set.
_ASSEMBLED = ("TOOLS", "PROFILE_TOOLS", "PROVIDER_TOOLS")


def __getattr__(name: str) -> Any:
    if name in _ASSEMBLED:
        return getattr(importlib.import_module("toolpool.toolset"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILTIN_TOOLS",
    "FILE_TOOLS",
    "PROFILE_TOOLS",
    "PROVIDER_TOOLS",
    "TOOLS",
    "ApplyPatchTool",
    "Bash",
    "BashOutput",
    "EditTool",
    "GlobTool",
    "GrepTool",
    "KillShell",
    "LsTool",
    "MultiEditTool",
    "NotebookEditTool",
    "ReadTool",
    "WriteTool",
    "apply_patch_tool",
    "bash",
    "bash_output",
    "edit_tool",
    "glob_tool",
    "grep_tool",
    "kill_shell",
    "ls_tool",
    "multi_edit_tool",
    "notebook_edit_tool",
    "read_tool",
    "write_tool",
]
