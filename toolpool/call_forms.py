"""Names and calls as messages write them for the model: a path (SPEC E4) and a call
toolpool names — the fix of a refusal, the way on from a cut read — in the spelling
of the session's tool profile (F12, F14).

A name is written as it is, or quoted with escapes when it could be read as
something else (``quote``: every tool's messages, ``tools/support/paths.py``'s ``display``).
A call's path argument is a JSON string literal (``literal``): it reads back, with
any JSON parser, as the very name, and holds no raw newline, control or bidi
character a message could be broken with.

The one call toolpool names is a read of a file's lines. Each profile spells it with
its own read tool: ``read(path="src/app.py", offset=2001, limit=1400)`` in
toolpool's, ``Read(file_path="src/app.py", offset=2001, limit=1400)`` in Claude
Code's, the text editor's ``view`` with a ``view_range`` (first and last line) in
Anthropic's: ``str_replace_based_edit_tool(command="view", path="src/app.py",
view_range=[2001, 3400])``. Codex's and OpenAI's tool sets have no read tool (their
models read through a shell, which the register does not see), so nothing is named
there: ``read_call`` gives None.

The read tool's spellings are owned here, low in the import graph, because the
register's refusals (``file_reads.py``) and the turn's budget (``engine/budget.py``) word them;
the profiles build their read tools from them (``profiles/claude_code.py``), and a
test checks that every spelling is a tool its profile offers, with these arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ReadForm:
    """A profile's read tool: its name and the argument that names the file (its
    ``offset`` and ``limit`` are toolpool's: 1-based first line, number of lines);
    for a tool of several commands, the command that reads, whose lines are a
    ``view_range`` (first and last, -1 for the end)."""

    tool: str
    path: str
    command: str | None = None


READ_FORMS: Mapping[str, ReadForm] = {
    "toolpool": ReadForm("read", "path"),
    "claude-code": ReadForm("Read", "file_path"),
    "anthropic": ReadForm("str_replace_based_edit_tool", "path", command="view"),
}


def has_read_tool(profile: str) -> bool:
    """Whether ``profile``'s tool set reads files with a tool of its own (the register
    then sees its reads); Codex's and OpenAI's read through a shell."""
    return profile in READ_FORMS


def read_call(
    profile: str, path: str, offset: int | None = None, limit: int | None = None
) -> str | None:
    """The read of ``path`` (as a tool message names it, SPEC E4) from line ``offset``
    (1, or None: from the top) for ``limit`` lines (None: the tool's default), in
    ``profile``'s spelling; None when the profile has no read tool."""
    form = READ_FORMS.get(profile)
    if form is None:
        return None
    words = [f"{form.path}={literal(path)}"]
    if form.command is not None:
        words.insert(0, f'command="{form.command}"')
        first = offset if offset is not None and offset > 1 else 1
        if limit is not None or first > 1:
            last = -1 if limit is None else first + limit - 1
            words.append(f"view_range=[{first}, {last}]")
        return f"{form.tool}({', '.join(words)})"
    if offset is not None and offset > 1:
        words.append(f"offset={offset}")
    if limit is not None:
        words.append(f"limit={limit}")
    return f"{form.tool}({', '.join(words)})"


def read_arguments(fix: Mapping[str, Any]) -> tuple[str, int | None, int | None]:
    """The path, offset and limit of a refusal's ``read_first`` detail."""
    offset, limit = fix.get("offset"), fix.get("limit")
    return (
        str(fix["path"]),
        offset if isinstance(offset, int) else None,
        limit if isinstance(limit, int) else None,
    )


def literal(path: str) -> str:
    """``path`` (as a call's argument names it: unquoted) as a JSON string literal:
    printable characters as they are, a quote and a backslash escaped, every other
    character (a newline, a control or bidi character, a byte that is not UTF-8) as
    a JSON escape (two UTF-16 halves above U+FFFF)."""
    if path.isprintable() and '"' not in path and "\\" not in path:  # most paths
        return f'"{path}"'
    return '"' + "".join(_json_escaped(c) for c in path) + '"'


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def quote(name: str) -> str:
    """``name`` as it is, or — when it could be read as something else: a character
    that is not printable (a newline, a control or bidi character, a byte that is not
    UTF-8), space at either end, a leading double quote — as a double-quoted string
    with backslash escapes (``"we\\nird.txt"``). A quoted form never equals a name
    shown as it is, which never starts with a double quote."""
    if name.isprintable() and name == name.strip() and not name.startswith('"'):
        return name
    return '"' + "".join(_escaped(c) for c in name) + '"'


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _json_escaped(char: str) -> str:
    """As ``_escaped``, but JSON has no ``\\U``: two UTF-16 halves instead."""
    escaped = _escaped(char)
    if not escaped.startswith("\\U"):
        return escaped
    code = ord(char) - 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
