"""Claude Code's tool set over toolpool's built-ins: Read, Write, Edit, MultiEdit,
Glob, Grep, Bash, BashOutput, KillShell, NotebookEdit.

Each adapter takes Claude Code's argument names and units (``file_path``, Bash's
``timeout`` in milliseconds, Grep's ``head_limit`` 0 for no limit…) and says the
refusals a Claude Code model knows by heart in Claude Code's sentences
("File has not been read yet. Read it first before writing to it.", "String to
replace not found in file."…), with toolpool's own explanation after them where it
tells more. The reading, searching, guarding, writing and running are the
built-ins' (docs/tools.md, "Tool profiles").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolpool.adapter import Adapter, Refusal, tool_named
from toolpool.call_forms import READ_FORMS
from toolpool.refusals import Reason, fix_call, not_read_message
from toolpool.tool import Arguments

PROFILE = "claude-code"

# Claude Code's own sentences (its Edit, Write and NotebookEdit refusals).
NOT_READ = "File has not been read yet. Read it first before writing to it."
MODIFIED = "File has been modified since read, either by the user or by a linter."
MODIFIED_READ_AGAIN = f"{MODIFIED} Read it again before attempting to write it."
UNEXPECTEDLY_MODIFIED = (
    "File has been unexpectedly modified. Read it again before attempting to write it."
)
NOT_FOUND = "String to replace not found in file."
NO_CHANGES = "No changes to make: old_string and new_string are exactly the same."
NO_FILE = "File does not exist."
MATCHES = (
    "Found {count} matches of the string to replace, but replace_all is false. To replace "
    "all occurrences, set replace_all to true. To replace only one occurrence, please "
    "provide more context to uniquely identify the instance."
)

# Claude Code's read tool, as toolpool names it in refusals (call_forms.py).
_READ = READ_FORMS[PROFILE]

# A refusal's reason → Claude Code's sentence in place of toolpool's first one, with
# toolpool's explanation after it (what changed).
_INSTEAD_OF_FIRST: dict[str, str] = {
    Reason.CHANGED: MODIFIED_READ_AGAIN,
    Reason.CHANGED_SHOWN: MODIFIED,  # the refusal showed the whole file: a read
    Reason.CHANGED_BEFORE_WRITE: UNEXPECTEDLY_MODIFIED,
}


def refusal(refused: Refusal, args: Arguments) -> str:
    """A read-before-write refusal (SPEC F3) or an edit's error in Claude Code's
    words, from its reason and details, toolpool's explanation after them when it
    says more; others as they are. ``args`` are the call's (Claude Code's)
    arguments: the edit's old_string is quoted back, as Claude Code does (a
    MultiEdit's failing edit's, ``edit_index``). A refusal of a file not read whole
    is worded from its details alone, naming the Read that lifts it (F14)."""
    details = refused.details
    if refused.reason in (Reason.NOT_READ, Reason.PARTLY_READ) and "read_first" in details:
        return not_read(details)
    if refused.reason in _INSTEAD_OF_FIRST:
        return f"{_INSTEAD_OF_FIRST[refused.reason]}\n\n{refused.explanation.strip()}".strip()
    index = details.get("edit_index")
    prefix = ""
    old = args.get("old_string")
    if isinstance(index, int):
        prefix = f"edits[{index}]: "
        edits = args.get("edits") or []
        old = edits[index].get("old_string") if index < len(edits) else None
    quoted = "" if old is None else f"\nString: {old}"
    body = refused.message.removeprefix(prefix)
    return prefix + _claude_sentence(refused.reason, body, quoted, details)


def not_read(details: Mapping[str, Any]) -> str:
    """F3's code-2 refusal in Claude Code's words, from its details: its sentence,
    then what was not shown and the Read that shows it."""
    if not details.get("partly_read"):
        call = fix_call(details, PROFILE)
        return f"{NOT_READ}\n\nRead it with {call}." if call else NOT_READ
    return f"{NOT_READ}\n\n{not_read_message(details, PROFILE)}"


def _claude_sentence(reason: str, body: str, quoted: str, details: Mapping[str, Any]) -> str:
    """Claude Code's sentence for an edit's refusal of this ``reason`` (toolpool's
    ``body`` after it, where it tells more); ``body`` alone for the others."""
    if reason == Reason.NOT_FOUND:
        return f"{NOT_FOUND}{quoted}\n\n{body}"
    if reason == Reason.AMBIGUOUS:
        return f"{MATCHES.format(count=details['occurrences'])}{quoted}\n\n{body}"
    if reason == Reason.NO_CHANGE:
        return NO_CHANGES
    if reason == Reason.NO_FILE:
        return f"{NO_FILE}\n\n{body}"
    return body


class ClaudeCodeTool(Adapter):
    """A Claude Code tool: its refusals in Claude Code's words."""

    profile = PROFILE

    def refused(self, refused: Refusal, args: Arguments) -> str:
        return refusal(refused, args)


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


READ_DESCRIPTION = """\
Reads a file from the local filesystem. You can access any file in the workspace \
directly with this tool; if the user gives a path to a file, assume it is valid: \
reading a file that does not exist returns an error.

Usage:
- The file_path parameter is the absolute path of the file (a path relative to the \
workspace works too)
- By default, it reads up to 2000 lines starting from the beginning of the file
- You can optionally specify a line offset and limit (especially handy for long \
files), but it is recommended to read the whole file by not providing these parameters
- Any lines longer than 2000 characters will be truncated
- Results are returned using cat -n format, with line numbers starting at 1
- This tool can read images (PNG, JPG, GIF, WebP): their contents are presented visually
- This tool can read PDF files (.pdf) page by page; use pages ("3" or "1-5") for \
large ones, at most 20 pages per request
- This tool can read Jupyter notebooks (.ipynb files) and returns all cells with \
their outputs
- This tool reads files, not directories: to list a directory, use Glob or ls via Bash
- You can call multiple tools in a single response: read several files at once when \
they may all be useful
- Edit and Write refuse a file that was not read whole in this session"""

WRITE_DESCRIPTION = """\
Writes a file to the local filesystem.

Usage:
- This tool will overwrite the existing file if there is one at the provided path.
- If this is an existing file, you MUST use the Read tool first to read the file's \
contents. This tool will fail if you did not read the file first.
- ALWAYS prefer editing existing files in the codebase. NEVER write new files unless \
explicitly required.
- NEVER proactively create documentation files (*.md) or README files. Only create \
documentation files if explicitly requested by the user."""

EDIT_DESCRIPTION = """\
Performs exact string replacements in files.

Usage:
- You must use your Read tool at least once in the conversation before editing. This \
tool will error if you attempt an edit without reading the file.
- When editing text from Read tool output, preserve the exact indentation (tabs and \
spaces) as it appears AFTER the line number prefix. The prefix is: spaces, the line \
number, a tab. Everything after that tab is the actual file content to match. Never \
include any part of the line number prefix in old_string or new_string.
- ALWAYS prefer editing existing files in the codebase. NEVER write new files unless \
explicitly required.
- The edit will FAIL if old_string is not unique in the file. Either provide a larger \
string with more surrounding context to make it unique or use replace_all to change \
every instance of old_string.
- Use replace_all for replacing and renaming strings across the file, for instance \
to rename a variable."""

MULTI_EDIT_DESCRIPTION = """\
Makes multiple edits to a single file in one operation. Prefer it to the Edit tool \
for several edits to the same file.

Before using this tool, use the Read tool to understand the file's contents.

- file_path: the absolute path of the file to modify
- edits: the edit operations, each with old_string (the text to replace, exactly as \
in the file, whitespace included), new_string (the text to put in its place) and \
replace_all (replace every occurrence; default false)

IMPORTANT:
- All edits are applied in sequence, in the order they are provided
- Each edit operates on the result of the previous edit
- All edits must be valid for the operation to succeed: if any edit fails, none will \
be applied
- Plan the edits so that an earlier one does not change the text a later one looks for"""

GLOB_DESCRIPTION = """\
- Fast file pattern matching tool that works with any codebase size
- Supports glob patterns like "**/*.js" or "src/**/*.ts"
- Returns matching file paths sorted by modification time, newest first
- Use this tool when you need to find files by name patterns
- You can call multiple tools in a single response: run several searches at once \
when they may be useful"""

GREP_DESCRIPTION = """\
A powerful search tool built on ripgrep.

Usage:
- ALWAYS use Grep for search tasks. NEVER invoke grep or rg as a Bash command.
- Supports full regex syntax (e.g. "log.*Error", "function\\s+\\w+")
- Filter files with the glob parameter (e.g. "*.js", "**/*.tsx") or the type \
parameter (e.g. "js", "py", "rust")
- Output modes: "content" shows matching lines, "files_with_matches" shows only file \
paths (default), "count" shows match counts
- Pattern syntax: ripgrep's, not grep's: literal braces need escaping (use \
interface\\{\\} to find interface{} in Go code)
- Multiline matching: by default patterns match within single lines only; for \
patterns that span lines use multiline: true"""

BASH_DESCRIPTION = """\
Executes a given bash command with an optional timeout, in the workspace, confined.

IMPORTANT: This tool is for terminal operations like git, npm, docker, running tests. \
DO NOT use it for file operations (reading, writing, editing, searching, finding \
files): use the specialized tools for this instead.

Usage notes:
- The command argument is required.
- You can specify an optional timeout in milliseconds (up to 600000ms / 10 minutes). \
If not specified, commands time out after 120000ms (2 minutes).
- Write a clear, concise description of what the command does in 5-10 words.
- If the output exceeds 30000 characters, it is cut in the middle; the full output \
is saved to a file the result names.
- The working directory persists between commands (a command that ends outside \
the workspace sends the next one back, and says so); shell state (variables, \
functions) does not, unless the session's shell is persistent.
- stdin is empty: interactive commands cannot work.{background}"""

_BACKGROUND = """
- You can use the run_in_background parameter to run the command in the background, \
which lets you keep working while it runs. Read its output with BashOutput, stop it \
with KillShell. Do not use '&' at the end of the command when using this parameter."""

BASH_OUTPUT_DESCRIPTION = """\
- Retrieves output from a running or completed background bash shell
- Takes a bash_id parameter identifying the shell
- Always returns only new output since the last check
- Returns the output along with the shell's status
- Supports optional regex filtering to show only lines matching a pattern
- Use this tool when you need to monitor or check the output of a long-running shell"""

KILL_SHELL_DESCRIPTION = """\
- Kills a running background bash shell by its ID
- Takes a shell_id parameter identifying the shell to kill
- Returns a success or failure status
- Use this tool when you need to terminate a long-running shell"""

NOTEBOOK_EDIT_DESCRIPTION = """\
Completely replaces the contents of a specific cell in a Jupyter notebook (.ipynb \
file) with new source. The notebook_path parameter must be an absolute path (or one \
relative to the workspace). cell_id is the id of the cell to edit, as Read shows it. \
Use edit_mode=insert to add a new cell after the cell cell_id (at the top without \
one), and edit_mode=delete to delete the cell. Read the notebook first."""


def adapters(builtins: Sequence[Any]) -> list[Adapter]:
    """Claude Code's tools over those of ``builtins`` present (BashOutput, KillShell,
    NotebookEdit and Bash's run_in_background only where their built-ins exist)."""
    made: list[Adapter] = []
    for builtin, make in _MAKERS.items():
        target = tool_named(builtins, builtin)
        if target is not None:
            made.append(make(target))
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


def _read(target: Any) -> Adapter:
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
        name=_READ.tool,
        description=READ_DESCRIPTION,
        schema=_object(properties, [_READ.path]),
        renames={_READ.path: "path"},
        convert={"offset": _positive},
    )


def _write(target: Any) -> Adapter:
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
        name="Write",
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


def _edit(target: Any) -> Adapter:
    properties = {
        "file_path": {"type": "string", "description": "The absolute path to the file to modify"},
        **_EDIT_PROPERTIES,
    }
    return _Renamed(
        target,
        name="Edit",
        description=EDIT_DESCRIPTION,
        schema=_object(properties, ["file_path", "old_string", "new_string"]),
        renames={"file_path": "path"},
    )


def _multi_edit(target: Any) -> Adapter:
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
        name="MultiEdit",
        description=MULTI_EDIT_DESCRIPTION,
        schema=_object(properties, ["file_path", "edits"]),
        renames={"file_path": "path"},
    )


def _glob(target: Any) -> Adapter:
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
        name="Glob",
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


def _grep(target: Any) -> Adapter:
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
        name="Grep",
        description=GREP_DESCRIPTION,
        schema=_object(properties, ["pattern"]),
        renames={},
        convert={"path": _directory, "head_limit": _positive},
    )


def _bash(target: Any) -> Adapter:
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
        name="Bash",
        description=BASH_DESCRIPTION.format(background=_BACKGROUND if background else ""),
        schema=_object(properties, ["command"]),
        renames={},
        convert={"timeout": _milliseconds},
    )


def _bash_output(target: Any) -> Adapter:
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
        name="BashOutput",
        description=BASH_OUTPUT_DESCRIPTION,
        schema=_object(properties, ["bash_id"]),
        renames={"bash_id": "shell_id"},
    )


def _kill_shell(target: Any) -> Adapter:
    properties = {
        "shell_id": {"type": "string", "description": "The ID of the background shell to kill"}
    }
    return _Renamed(
        target,
        name="KillShell",
        description=KILL_SHELL_DESCRIPTION,
        schema=_object(properties, ["shell_id"]),
        renames={},
    )


def _notebook_edit(target: Any) -> Adapter:
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
        name="NotebookEdit",
        description=NOTEBOOK_EDIT_DESCRIPTION,
        schema=_object(properties, ["notebook_path", "new_source"]),
        renames={"notebook_path": "path"},
    )


# Claude Code's tools by the built-in each one runs on, in Claude Code's order.
_MAKERS: dict[str, Callable[[Any], Adapter]] = {
    "bash": _bash,
    "bash_output": _bash_output,
    "kill_shell": _kill_shell,
    "glob": _glob,
    "grep": _grep,
    "read": _read,
    "edit": _edit,
    "multi_edit": _multi_edit,
    "write": _write,
    "notebook_edit": _notebook_edit,
}

# Every name the profile may offer (whichever of their built-ins are present).
NAMES = (
    "Bash",
    "BashOutput",
    "KillShell",
    "Glob",
    "Grep",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
)
