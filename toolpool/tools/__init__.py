"""The built-in tools (SPEC F1): read, glob, grep, ls, edit, multi_edit, apply_patch,
write — and bash; the profiles' adapters over them (F12); and the providers' own tools
over them (OpenAI's apply_patch, shell and local_shell, Anthropic's bash and text
editor: F15–F18, ``toolpool.profiles.declared``).

Every one resolves paths against the session's workspace and refuses paths outside
it and its extra roots (``paths.py``). read, edit and write share the session's
file-read register: edit and write change only files read whole and unchanged since
(F2, F3), and renew the stamp after writing (F5). ``docs/tools.md`` describes them.
"""

from toolpool.profiles import profile_tools
from toolpool.profiles.codex import Shell as CodexShell
from toolpool.tools.anthropic_bash import AnthropicBash
from toolpool.tools.anthropic_editor import AnthropicTextEditor
from toolpool.tools.apply_patch import ApplyPatchTool, apply_patch_tool
from toolpool.tools.bash import Bash, bash
from toolpool.tools.edit import EditTool
from toolpool.tools.glob import GlobTool
from toolpool.tools.grep import GrepTool
from toolpool.tools.ls import LsTool
from toolpool.tools.multi_edit import MultiEditTool, multi_edit_tool
from toolpool.tools.notebook_edit import NotebookEditTool, notebook_edit_tool
from toolpool.tools.openai_patch import OpenAIApplyPatch
from toolpool.tools.openai_shell import OpenAILocalShell, OpenAIShell
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
# Claude Code's and Codex's tool sets over these (toolpool.profiles, SPEC F12).
PROFILE_TOOLS = profile_tools(BUILTIN_TOOLS)
# The tools OpenAI and Anthropic define, carried out by these (F15–F18).
PROVIDER_TOOLS = [
    OpenAIApplyPatch(apply_patch_tool),
    OpenAIShell(),
    OpenAILocalShell(CodexShell(bash, apply_patch_tool)),
    AnthropicBash(),
    AnthropicTextEditor(),
]
# What tools_in_module("toolpool.tools") loads.
TOOLS = [*BUILTIN_TOOLS, *PROFILE_TOOLS, *PROVIDER_TOOLS]

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
