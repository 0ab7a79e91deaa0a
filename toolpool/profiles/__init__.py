"""Tool profiles: the tool sets of the agents models are trained on, over toolpool's
own tools (SPEC F12).

A session's ``tool_profile`` says which names its calls use:

- ``"toolpool"`` (the default): the built-in tools (read, grep, edit, bash…);
- ``"claude-code"``: Claude Code's (Read, Write, Edit, MultiEdit, Glob, Grep, Bash,
  BashOutput, KillShell, NotebookEdit: ``claude_code.py``);
- ``"codex"``: Codex CLI's (shell, apply_patch: ``codex.py``);
- ``"openai"``: the tools OpenAI's Responses API defines, ``apply_patch`` and
  ``shell`` (``declared.py``; their calls are OpenAI's own item types);
- ``"anthropic"``: the tools Anthropic's Messages API defines, ``bash`` and the text
  editor ``str_replace_based_edit_tool`` (``declared.py``).

A profile's tool is an ``Adapter`` (``adapter.py``) over a built-in: the same
implementation, pipeline and sandbox, in that agent's names, units and words. Every
tool belongs to the profiles that list its name here; a tool no profile lists (a
user's tool, an MCP server's) belongs to every profile. A session is offered its
profile's tools and those; a call to another profile's tool is refused at P4 with
the profile it belongs to.

The adapters are tools like any other and run in the workers: ``toolpool.tools``
lists them in its ``TOOLS`` (``profile_tools`` over its built-ins), so a daemon that
loads the built-ins loads the profiles too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from toolpool.profiles import claude_code, codex, declared
from toolpool.profiles.adapter import Adapter

DEFAULT_PROFILE = "toolpool"

# The built-ins' names (toolpool/tools/__init__.py; a test checks the two agree).
TOOLPOOL_NAMES = (
    "read",
    "glob",
    "grep",
    "ls",
    "edit",
    "multi_edit",
    "apply_patch",
    "write",
    "notebook_edit",
    "bash",
    "bash_output",
    "kill_shell",
)

PROFILES: Mapping[str, tuple[str, ...]] = {
    DEFAULT_PROFILE: TOOLPOOL_NAMES,
    claude_code.PROFILE: claude_code.NAMES,
    codex.PROFILE: codex.NAMES,
    declared.OPENAI: declared.OPENAI_NAMES,
    declared.ANTHROPIC: declared.ANTHROPIC_NAMES,
}


def check_profile(name: str) -> str:
    """``name`` if it names a profile; a ValueError naming the profiles otherwise."""
    if name not in PROFILES:
        known = ", ".join(repr(p) for p in PROFILES)
        raise ValueError(f"tool_profile must be one of {known}, not {name!r}")
    return name


def owners(tool: str) -> tuple[str, ...]:
    """The profiles that list ``tool``; none for a tool of every profile."""
    return tuple(profile for profile, names in PROFILES.items() if tool in names)


def offers(profile: str, tool: str) -> bool:
    """Whether a session of ``profile`` may call ``tool``: its profile's tools, those of
    no profile, and OpenAI's item tools (their calls are items no other call can be)."""
    listed = owners(tool)
    return not listed or profile in listed or tool in _ITEM_TOOLS


def lists(profile: str, tool: str) -> bool:
    """Whether ``profile``'s tool listing has ``tool``: its own tools, and the tools of
    no profile but the providers' own (a provider's declared tool is listed only in
    the profiles that name it)."""
    listed = owners(tool)
    return profile in listed if listed or declared.is_declared(tool) else True


_ITEM_TOOLS = frozenset(declared.ITEM_TOOLS.values())


def call_names(profile: str) -> Mapping[str, str]:
    """The call names that mean another tool in a session of ``profile`` (its
    declared tools' names as their provider spells them): empty for most."""
    return declared.CALL_NAMES.get(profile, _NO_NAMES)


_NO_NAMES: Mapping[str, str] = {}


def not_offered(profile: str, tool: str, known: Iterable[str]) -> str:
    """P4's message for a call to ``tool`` in a session of ``profile``; ``known`` are
    the names of every tool the daemon has (the session's are listed)."""
    available = ", ".join(sorted(name for name in known if offers(profile, name))) or "none"
    listed = owners(tool)
    if not listed or profile in listed:  # of every profile, or of this one but not here
        return f'tool "{tool}" not found. Available tools: {available}.'
    elsewhere = " or ".join(f'"{p}"' for p in listed)
    return (
        f'tool "{tool}" not found in this session: it is a tool of the {elsewhere} tool '
        f'profile, and this session uses "{profile}". Open a session with '
        f'tool_profile="{listed[0]}" to call it. Available tools: {available}.'
    )


def profile_tools(builtins: Sequence[Any]) -> list[Adapter]:
    """The adapters of every profile over ``builtins`` (those whose built-in is there)."""
    return [*claude_code.adapters(builtins), *codex.adapters(builtins)]


def definition_name(definition: Mapping[str, Any]) -> str:
    """The tool name of a definition in toolpool's format or any provider's (OpenAI
    Chat nests it under ``function``; a provider's own tool is known by its
    declaration's ``type``)."""
    kind = definition.get("type")
    if isinstance(kind, str) and kind in declared.DECLARED_TYPES:
        return declared.DECLARED_TYPES[kind]
    name = definition.get("name")
    if name is None and isinstance(definition.get("function"), Mapping):
        name = definition["function"].get("name")
    return str(name)


def in_profile(definitions: Iterable[Mapping[str, Any]], profile: str) -> list[Any]:
    """The definitions of the tools ``profile`` lists (``lists``), in order."""
    check_profile(profile)
    return [d for d in definitions if lists(profile, definition_name(d))]


__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "TOOLPOOL_NAMES",
    "Adapter",
    "call_names",
    "check_profile",
    "definition_name",
    "in_profile",
    "lists",
    "not_offered",
    "offers",
    "owners",
    "profile_tools",
]
