"""Claude Code's tool set over toolpool's built-ins: Read, Write, Edit, MultiEdit,
Glob, Grep, Bash, BashOutput, KillShell, NotebookEdit.

Each adapter takes Claude Code's argument names and units (``file_path``, Bash's
``timeout`` in milliseconds, Grep's ``head_limit`` 0 for no limit…), shows Claude
Code's description (``claude_code_descriptions.py``) and schema, and says the
refusals a Claude Code model knows by heart in Claude Code's sentences
(``claude_code_refusals.py``). The reading, searching, guarding, writing and running
are the built-ins' (docs/tools.md, "Tool profiles").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolpool.adapter import Adapter, tool_named
from toolpool.call_forms import READ_FORMS
from toolpool.profiles.claude_code_descriptions import (
    BASH_BACKGROUND,
    BASH_DESCRIPTION,
    BASH_OUTPUT_DESCRIPTION,
    EDIT_DESCRIPTION,
    GLOB_DESCRIPTION,
    GREP_DESCRIPTION,
    KILL_SHELL_DESCRIPTION,
    MULTI_EDIT_DESCRIPTION,
    NOTEBOOK_EDIT_DESCRIPTION,
    READ_DESCRIPTION,
    WRITE_DESCRIPTION,
)
from toolpool.profiles.claude_code_refusals import PROFILE as PROFILE
from toolpool.profiles.claude_code_refusals import ClaudeCodeTool
from toolpool.tool import Arguments

# Claude Code's read tool, as toolpool names it in refusals (call_forms.py).
_READ = READ_FORMS[PROFILE]


class _Renamed(ClaudeCodeTool):
    """Arguments renamed (Claude Code's name → the built-in's), values converted by
    ``convert`` (Claude Code's name → a function of the value, None to leave it out)."""

    def __init__(
        self,
        target: Any,
        *,
        renames: dict[str, str],
        convert: dict[str, Callable[[Any], Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(target, **kwargs)
        self.renames = renames
        self.convert = convert or {}

    def arguments(self, args: Arguments) -> Arguments:
        out: Arguments = {}
        for key, value in args.items():
            if key in self.convert:
                value = self.convert[key](value)
                if value is None:
                    continue
            out[self.renames.get(key, key)] = value
        return out


def _positive(value: Any) -> Any:
    """Claude Code's 0 that means "not given" (Read's offset, Grep's head_limit)."""
    return None if value == 0 else value


def _directory(value: Any) -> Any:
    """Glob and Grep's path; Claude Code's models sometimes send "undefined" or "null"
    for "the working directory", as its description warns."""
    return None if value in ("", "undefined", "null") else value


def _milliseconds(value: Any) -> Any:
    return value / 1000


def adapters(builtins: Sequence[Any]) -> list[Adapter]:
    """Claude Code's tools over those of ``builtins`` present (BashOutput, KillShell,
    NotebookEdit and Bash's run_in_background only where their built-ins exist)."""
    made: list[Adapter] = []
    for builtin, (name, make) in _TOOLS.items():
        target = tool_named(builtins, builtin)
        if target is not None:
            made.append(make(target, name))
    return made


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _has(target: Any, argument: str) -> bool:
    return argument in target.schema.get("properties", {})


def _read(target: Any, name: str) -> Adapter:
    properties: dict[str, Any] = {
        _READ.path: {"type": "string", "description": "The absolute path to the file to read"},
        "offset": {
            "type": "integer",
            "minimum": 0,
            "description": "The line number to start reading from. Only provide if the "
            "file is too large to read at once",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "description": "The number of lines to read. Only provide if the file is too "
            "large to read at once.",
        },
    }
    if _has(target, "pages"):
        properties["pages"] = {
            "type": "string",
            "description": 'Page range for PDF files (e.g. "1-5", "3"). Only for PDF '
            "files; at most 20 pages per request.",
        }
    return _Renamed(
        target,
        name=name,
        description=READ_DESCRIPTION,
        schema=_object(properties, [_READ.path]),
        renames={_READ.path: "path"},
        convert={"offset": _positive},
    )


def _write(target: Any, name: str) -> Adapter:
    properties = {
        "file_path": {
            "type": "string",
            "description": "The absolute path to the file to write (must be absolute, not "
            "relative; a path relative to the workspace works too)",
        },
        "content": {"type": "string", "description": "The content to write to the file"},
    }
    return _Renamed(
        target,
        name=name,
        description=WRITE_DESCRIPTION,
        schema=_object(properties, ["file_path", "content"]),
        renames={"file_path": "path"},
    )


_EDIT_PROPERTIES: dict[str, Any] = {
    "old_string": {"type": "string", "description": "The text to replace"},
    "new_string": {
        "type": "string",
        "description": "The text to replace it with (must be different from old_string)",
    },
    "replace_all": {
        "type": "boolean",
        "default": False,
        "description": "Replace all occurences of old_string (default false)",
    },
}


def _edit(target: Any, name: str) -> Adapter:
    properties = {
        "file_path": {"type": "string", "description": "The absolute path to the file to modify"},
        **_EDIT_PROPERTIES,
    }
    return _Renamed(
        target,
        name=name,
        description=EDIT_DESCRIPTION,
        schema=_object(properties, ["file_path", "old_string", "new_string"]),
        renames={"file_path": "path"},
    )


def _multi_edit(target: Any, name: str) -> Adapter:
    properties = {
        "file_path": {"type": "string", "description": "The absolute path to the file to modify"},
        "edits": {
            "type": "array",
            "minItems": 1,
            "description": "Array of edit operations to perform sequentially on the file",
            "items": _object(dict(_EDIT_PROPERTIES), ["old_string", "new_string"]),
        },
    }
    return _Renamed(
        target,
        name=name,
        description=MULTI_EDIT_DESCRIPTION,
        schema=_object(properties, ["file_path", "edits"]),
        renames={"file_path": "path"},
    )


def _glob(target: Any, name: str) -> Adapter:
    properties = {
        "pattern": {"type": "string", "description": "The glob pattern to match files against"},
        "path": {
            "type": "string",
            "description": "The directory to search in. If not specified, the current "
            "working directory will be used. IMPORTANT: Omit this field to use the default "
            'directory. DO NOT enter "undefined" or "null" - simply omit it for the default '
            "behavior. Must be a valid directory path if provided.",
        },
    }
    return _Renamed(
        target,
        name=name,
        description=GLOB_DESCRIPTION,
        schema=_object(properties, ["pattern"]),
        renames={},
        convert={"path": _directory},
    )


def _context(flag: str, what: str) -> dict[str, Any]:
    return {
        "type": "integer",
        "minimum": 0,
        "description": f"Number of lines to show {what} each match (rg {flag}). Requires "
        'output_mode: "content", ignored otherwise.',
    }


def _grep(target: Any, name: str) -> Adapter:
    properties = {
        "pattern": {
            "type": "string",
            "description": "The regular expression pattern to search for in file contents",
        },
        "path": {
            "type": "string",
            "description": "File or directory to search in (rg PATH). Defaults to the "
            "current working directory.",
        },
        "glob": {
            "type": "string",
            "description": 'Glob pattern to filter files (e.g. "*.js", "*.{ts,tsx}") - '
            "maps to rg --glob",
        },
        "output_mode": {
            "type": "string",
            "enum": ["content", "files_with_matches", "count"],
            "description": 'Output mode: "content" shows matching lines (supports -A/-B/-C '
            'context, -n line numbers, head_limit), "files_with_matches" shows file paths '
            '(supports head_limit), "count" shows match counts (supports head_limit). '
            'Defaults to "files_with_matches".',
        },
        "-B": _context("-B", "before"),
        "-A": _context("-A", "after"),
        "-C": _context("-C", "before and after"),
        "-n": {
            "type": "boolean",
            "description": "Show line numbers in output (rg -n). Requires output_mode: "
            '"content", ignored otherwise. Defaults to true.',
        },
        "-i": {"type": "boolean", "description": "Case insensitive search (rg -i)"},
        "type": {
            "type": "string",
            "description": "File type to search (rg --type). Common types: js, py, rust, "
            "go, java, etc. More efficient than glob for standard file types.",
        },
        "head_limit": {
            "type": "integer",
            "minimum": 0,
            "description": "Limit output to the first N lines or entries, equivalent to "
            '"| head -N". Works across all output modes. 0 (or omitted): no limit but '
            "toolpool's output cap.",
        },
        "multiline": {
            "type": "boolean",
            "description": "Enable multiline mode where . matches newlines and patterns can "
            "span lines (rg -U --multiline-dotall). Default: false.",
        },
    }
    return _Renamed(
        target,
        name=name,
        description=GREP_DESCRIPTION,
        schema=_object(properties, ["pattern"]),
        renames={},
        convert={"path": _directory, "head_limit": _positive},
    )


def _bash(target: Any, name: str) -> Adapter:
    properties: dict[str, Any] = {
        "command": {"type": "string", "description": "The command to execute"},
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 600000,
            "description": "Optional timeout in milliseconds (max 600000)",
        },
        "description": {
            "type": "string",
            "description": "Clear, concise description of what this command does in 5-10 "
            "words, in active voice.",
        },
    }
    background = _has(target, "run_in_background")
    if background:
        properties["run_in_background"] = {
            "type": "boolean",
            "description": "Set to true to run this command in the background. Use "
            "BashOutput to read the output later.",
        }
    return _Renamed(
        target,
        name=name,
        description=BASH_DESCRIPTION.format(background=BASH_BACKGROUND if background else ""),
        schema=_object(properties, ["command"]),
        renames={},
        convert={"timeout": _milliseconds},
    )


def _bash_output(target: Any, name: str) -> Adapter:
    properties = {
        "bash_id": {
            "type": "string",
            "description": "The ID of the background shell to retrieve output from",
        },
        "filter": {
            "type": "string",
            "description": "Optional regular expression to filter the output lines. Only "
            "lines matching this regex will be included in the result.",
        },
    }
    return _Renamed(
        target,
        name=name,
        description=BASH_OUTPUT_DESCRIPTION,
        schema=_object(properties, ["bash_id"]),
        renames={"bash_id": "shell_id"},
    )


def _kill_shell(target: Any, name: str) -> Adapter:
    properties = {
        "shell_id": {"type": "string", "description": "The ID of the background shell to kill"}
    }
    return _Renamed(
        target,
        name=name,
        description=KILL_SHELL_DESCRIPTION,
        schema=_object(properties, ["shell_id"]),
        renames={},
    )


def _notebook_edit(target: Any, name: str) -> Adapter:
    properties = {
        "notebook_path": {
            "type": "string",
            "description": "The absolute path to the Jupyter notebook file to edit",
        },
        "cell_id": {
            "type": "string",
            "description": "The ID of the cell to edit. When inserting a new cell, the new "
            "cell is inserted after the cell with this ID, or at the beginning if not "
            "specified.",
        },
        "new_source": {"type": "string", "description": "The new source for the cell"},
        "cell_type": {
            "type": "string",
            "enum": ["code", "markdown"],
            "description": "The type of the cell (code or markdown). If not specified, it "
            "defaults to the current cell type. Required for edit_mode=insert.",
        },
        "edit_mode": {
            "type": "string",
            "enum": ["replace", "insert", "delete"],
            "description": "The type of edit to make (replace, insert, delete). Defaults to "
            "replace.",
        },
    }
    return _Renamed(
        target,
        name=name,
        description=NOTEBOOK_EDIT_DESCRIPTION,
        schema=_object(properties, ["notebook_path", "new_source"]),
        renames={"notebook_path": "path"},
    )


# Claude Code's tools, in Claude Code's order: the built-in each runs on → its name,
# and how it is made over that built-in.
_TOOLS: dict[str, tuple[str, Callable[[Any, str], Adapter]]] = {
    "bash": ("Bash", _bash),
    "bash_output": ("BashOutput", _bash_output),
    "kill_shell": ("KillShell", _kill_shell),
    "glob": ("Glob", _glob),
    "grep": ("Grep", _grep),
    "read": (_READ.tool, _read),
    "edit": ("Edit", _edit),
    "multi_edit": ("MultiEdit", _multi_edit),
    "write": ("Write", _write),
    "notebook_edit": ("NotebookEdit", _notebook_edit),
}

# Every name the profile may offer (whichever of their built-ins are present).
NAMES = tuple(name for name, _ in _TOOLS.values())
