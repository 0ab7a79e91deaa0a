"""The tools the providers define and leave to the application to run: OpenAI's
``apply_patch``, ``shell`` and ``local_shell`` (Responses API), Anthropic's ``bash``
and text editor (Messages API). Data only — names, declarations, how their calls
arrive — shared by the profiles (who is offered what), the providers' formats (calls
in, results out, declarations out) and the tools themselves (``toolpool.tools``).

How their calls arrive differs by provider, and so does their reach:

- OpenAI's arrive as output items of their own types (``apply_patch_call``,
  ``shell_call``, ``local_shell_call``), never as a function call, so no function
  tool's name can meet them: they are read in every session, whatever its profile.
- Anthropic's arrive as ``tool_use`` blocks named ``bash`` and
  ``str_replace_based_edit_tool``, names a function tool may have too (toolpool's
  own ``bash``): in a session of the ``anthropic`` profile those names mean these
  tools (``CALL_NAMES``), elsewhere they mean what they always meant.

Each tool has a name of its own in the registry (``openai_shell``…): what events,
results and the audit log call it. Its declaration — what a request's ``tools``
carries — exists in its provider's format only; the other formats leave it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

OPENAI = "openai"
ANTHROPIC = "anthropic"

OPENAI_APPLY_PATCH = "openai_apply_patch"
OPENAI_SHELL = "openai_shell"
OPENAI_LOCAL_SHELL = "openai_local_shell"
ANTHROPIC_BASH = "anthropic_bash"
ANTHROPIC_TEXT_EDITOR = "anthropic_text_editor"

# The profiles' tool sets (toolpool.profiles.PROFILES). local_shell, for the older
# codex-mini models, is in none: its calls are read in every session, and its
# declaration is the caller's to send.
OPENAI_NAMES = (OPENAI_APPLY_PATCH, OPENAI_SHELL)
ANTHROPIC_NAMES = (ANTHROPIC_BASH, ANTHROPIC_TEXT_EDITOR)


def _frozen(value: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(value)


# The tool → (the provider format whose requests declare it, its declaration).
DECLARATIONS: Mapping[str, tuple[str, Mapping[str, Any]]] = _frozen(
    {
        OPENAI_APPLY_PATCH: ("openai-responses", _frozen({"type": "apply_patch"})),
        OPENAI_SHELL: ("openai-responses", _frozen({"type": "shell"})),
        OPENAI_LOCAL_SHELL: ("openai-responses", _frozen({"type": "local_shell"})),
        ANTHROPIC_BASH: ("anthropic", _frozen({"type": "bash_20250124", "name": "bash"})),
        ANTHROPIC_TEXT_EDITOR: (
            "anthropic",
            _frozen({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}),
        ),
    }
)
# A declaration's ``type`` → its tool: how a listing in a provider's format is read back.
DECLARED_TYPES: Mapping[str, str] = _frozen(
    {str(declaration["type"]): tool for tool, (_, declaration) in DECLARATIONS.items()}
)

# OpenAI's call items: their type → the tool that runs them (and the type of the item
# that answers them).
ITEM_TOOLS: Mapping[str, str] = _frozen(
    {
        "apply_patch_call": OPENAI_APPLY_PATCH,
        "shell_call": OPENAI_SHELL,
        "local_shell_call": OPENAI_LOCAL_SHELL,
    }
)
ITEM_OUTPUTS: Mapping[str, str] = _frozen(
    {
        OPENAI_APPLY_PATCH: "apply_patch_call_output",
        OPENAI_SHELL: "shell_call_output",
        OPENAI_LOCAL_SHELL: "local_shell_call_output",
    }
)
# What an item tool's call carries as its one argument: the item's field of that name.
ITEM_ARGUMENTS: Mapping[str, str] = _frozen(
    {"apply_patch_call": "operation", "shell_call": "action", "local_shell_call": "action"}
)

# A profile → the call names that mean one of its declared tools in its sessions.
# ``str_replace_editor`` is the text editor's name in its older versions
# (text_editor_20250124, whose ``undo_edit`` the tool keeps).
CALL_NAMES: Mapping[str, Mapping[str, str]] = _frozen(
    {
        ANTHROPIC: _frozen(
            {
                "bash": ANTHROPIC_BASH,
                "str_replace_based_edit_tool": ANTHROPIC_TEXT_EDITOR,
                "str_replace_editor": ANTHROPIC_TEXT_EDITOR,
            }
        )
    }
)


def declaration(tool: str, format: str) -> Mapping[str, Any] | None:
    """``tool``'s declaration in ``format``; None when ``format`` has none for it (the
    tool is another provider's, or not a declared tool at all)."""
    declared = DECLARATIONS.get(tool)
    if declared is None or declared[0] != format:
        return None
    return declared[1]


def in_format(tool: str, format: str) -> bool:
    """Whether ``format``'s tool list has ``tool``: every tool but the providers' own
    tools of other providers."""
    declared = DECLARATIONS.get(tool)
    return declared is None or declared[0] == format


def is_declared(tool: str) -> bool:
    """Whether ``tool`` is one of the providers' own tools (declared, not described)."""
    return tool in DECLARATIONS
