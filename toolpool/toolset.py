"""The tool set toolpool ships, assembled above the tools and the profiles (neither
imports the other's way: ``pyproject.toml``'s contracts): the built-in tools (SPEC
F1), the profiles' adapters over them (F12) and the providers' own tools over them
(OpenAI's apply_patch, shell and local_shell, Anthropic's bash and text editor:
F15–F18).

``toolpool.tools`` names these lists too (``TOOLS``, ``PROFILE_TOOLS``,
``PROVIDER_TOOLS``), read from here when first asked for: ``--tool-modules
toolpool.tools`` and ``Coordinator(toolpool.tools.TOOLS)`` load the whole set.
"""

from toolpool.adapter import Adapter
from toolpool.profiles import profile_tools
from toolpool.profiles.codex import Shell as CodexShell
from toolpool.tools import BUILTIN_TOOLS, apply_patch_tool, bash
from toolpool.tools.anthropic_bash import AnthropicBash
from toolpool.tools.anthropic_editor import AnthropicTextEditor
from toolpool.tools.openai_patch import OpenAIApplyPatch
from toolpool.tools.openai_shell import OpenAILocalShell, OpenAIShell

# Claude Code's and Codex's tool sets over the built-ins (toolpool.profiles, SPEC F12).
PROFILE_TOOLS: list[Adapter] = profile_tools(BUILTIN_TOOLS)
# The tools OpenAI and Anthropic define, carried out by the built-ins (F15–F18).
PROVIDER_TOOLS = [
    OpenAIApplyPatch(apply_patch_tool),
    OpenAIShell(),
    OpenAILocalShell(CodexShell(bash, apply_patch_tool)),
    AnthropicBash(),
    AnthropicTextEditor(),
]
# What tools_in_module("toolpool.tools") loads.
TOOLS = [*BUILTIN_TOOLS, *PROFILE_TOOLS, *PROVIDER_TOOLS]
