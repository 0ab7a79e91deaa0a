"""Changes as a git-format patch (SPEC B8) that ``git apply`` accepts: unified hunks
for text, git's binary patches (zlib, base85, with full index lines) for the rest.

A file is text when it is valid UTF-8 without a NUL byte in its first 8000 bytes
(git's own test, and the patch stays a ``str``). Paths are quoted as git quotes them
(C-style escapes for control characters, quotes, backslashes and bytes past ASCII), so
a name that holds an escape sequence reaches a terminal as ``\\033``, never as one.
Modes are git's: 100644, 100755 (any execute bit of the owner) or 120000 for a
symlink, whose content is its target; directories are not in a patch.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import os
import stat
import zlib
from collections.abc import Sequence

from toolpool.changes.compare import Change, ChangeKind, EntryType
from toolpool.changes.tree import Tree

ZERO = "0" * 40
_ESCAPES = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 34: '"', 92: "\\"}
_BINARY_PROBE = 8000  # bytes git looks at for a NUL


class PatchTooLarge(ValueError):
    """The patch would pass the bound given (the reply that carries it has one)."""


def quoted(prefix: str, path: str) -> str:
    """``prefix + path`` as git writes a name: quoted, with escapes, when it holds
    anything but printable ASCII."""
    raw = os.fsencode(prefix + path)
    if all(32 <= b < 127 and b not in (34, 92) for b in raw):
        return prefix + path
    out = []
    for b in raw:
        if b in _ESCAPES:
            out.append("\\" + _ESCAPES[b])
        elif 32 <= b < 127:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def git_mode(mode: int, kind: EntryType) -> str:
    if kind is EntryType.SYMLINK:
        return "120000"
    return "100755" if mode & stat.S_IXUSR else "100644"


def blob_id(data: bytes) -> str:
    """The object id git gives these bytes as a blob."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _text(data: bytes) -> str | None:
    if b"\0" in data[:_BINARY_PROBE]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lines(text: str) -> list[str]:
    """Lines as git counts them: ended by "\\n" alone (the last may lack it)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _span(start: int, stop: int) -> str:
    """A hunk's range of lines, as diff writes it."""
    beginning, length = start + 1, stop - start
    if length == 1:
        return str(beginning)
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def _hunks(old: list[str], new: list[str]) -> list[str]:
    out = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(3):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_span(first[1], last[2])} +{_span(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in old[i1:i2]]
                continue
            out += ["-" + line for line in old[i1:i2]]
            out += ["+" + line for line in new[j1:j2]]
    return [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out
    ]


def _binary(data: bytes) -> list[str]:
    """One binary hunk: the bytes whole (``literal``), deflated, in base85 lines."""
    packed = zlib.compress(data, 9)
    out = [f"literal {len(data)}\n"]
    for at in range(0, len(packed), 52):
        chunk = packed[at : at + 52]
        size = len(chunk)
        mark = chr(ord("A") + size - 1) if size <= 26 else chr(ord("a") + size - 27)
        out.append(mark + base64.b85encode(chunk, pad=True).decode() + "\n")
    return [*out, "\n"]


def _content(tree: Tree, path: str, kind: EntryType) -> bytes:
    return tree.readlink(path) if kind is EntryType.SYMLINK else tree.read(path)


def file_patch(old: Tree, new: Tree, change: Change) -> str:
    """The part of the patch for one change ("" for a directory, or a mode change git
    does not see)."""
    if change.type is EntryType.DIRECTORY:
        return ""
    kind = change.type
    path = change.path
    head = [f"diff --git {quoted('a/', path)} {quoted('b/', path)}\n"]
    old_mode = None if change.old_mode is None else git_mode(change.old_mode, kind)
    new_mode = None if change.new_mode is None else git_mode(change.new_mode, kind)
    if change.kind is ChangeKind.MODE:
        if old_mode == new_mode:
            return ""
        return "".join([*head, f"old mode {old_mode}\n", f"new mode {new_mode}\n"])
    before = b"" if change.kind is ChangeKind.ADDED else _content(old, path, kind)
    after = b"" if change.kind is ChangeKind.DELETED else _content(new, path, kind)
    old_id = ZERO if change.kind is ChangeKind.ADDED else blob_id(before)
    new_id = ZERO if change.kind is ChangeKind.DELETED else blob_id(after)
    if change.kind is ChangeKind.ADDED:
        head += [f"new file mode {new_mode}\n", f"index {old_id}..{new_id}\n"]
    elif change.kind is ChangeKind.DELETED:
        head += [f"deleted file mode {old_mode}\n", f"index {old_id}..{new_id}\n"]
    elif old_mode != new_mode:
        head += [f"old mode {old_mode}\n", f"new mode {new_mode}\n"]
        head.append(f"index {old_id}..{new_id}\n")
    else:
        head.append(f"index {old_id}..{new_id} {new_mode}\n")
    old_text, new_text = _text(before), _text(after)
    if old_text is None or new_text is None:
        return "".join([*head, "GIT binary patch\n", *_binary(after), *_binary(before)])
    hunks = _hunks(_lines(old_text), _lines(new_text))
    if not hunks:
        return "".join(head)  # an empty file added or deleted
    a = "/dev/null" if change.kind is ChangeKind.ADDED else quoted("a/", path)
    b = "/dev/null" if change.kind is ChangeKind.DELETED else quoted("b/", path)
    return "".join([*head, f"--- {a}\n", f"+++ {b}\n", *hunks])


def git_patch(old: Tree, new: Tree, changes: Sequence[Change], max_chars: int) -> str:
    """The patch that turns ``old`` into ``new`` at ``changes``; PatchTooLarge past
    ``max_chars``."""
    parts = []
    size = 0
    for change in changes:
        part = file_patch(old, new, change)
        size += len(part)
        if size > max_chars:
            raise PatchTooLarge(
                f"the patch passes {max_chars} characters at {change.path!r}: ask for the "
                "changes, or export the workspace"
            )
        parts.append(part)
    return "".join(parts)
