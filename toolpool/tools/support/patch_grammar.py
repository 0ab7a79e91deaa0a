"""Codex CLI's patch format, as its ``apply_patch`` tool takes it: text to typed file
operations. Nothing here looks at a file; ``apply_patch.py`` applies what this parses.

The grammar (one operation after another between the two markers)::

    *** Begin Patch
    *** Add File: PATH          then the new file's lines, each written "+line"
    *** Delete File: PATH
    *** Update File: PATH
    *** Move to: NEWPATH        optional, right after Update File
    @@ CONTEXT                  a hunk; "@@" alone, or "@@ " and one line of the file
     context line               (the first hunk of a file may leave out its "@@")
    -removed line
    +added line
    *** End of File             optional, ends a hunk that must match the file's end
    *** End Patch

As Codex parses it, and no stricter: markers may carry spaces around them, an empty
line inside a hunk is an empty context line, blank lines between hunks are skipped,
a patch wrapped in a heredoc (``<<'EOF'`` … ``EOF``) is unwrapped, and line endings
may be CRLF. Beyond Codex: a unified-diff hunk header (``@@ -3,4 +3,5 @@ def f():``)
is read as ``@@ def f():`` — models write one often, and its numbers are never a line
of the file.

Every error names the line of the patch (1-based) where the problem is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
END_OF_FILE = "*** End of File"
_HEREDOC_STARTS = ("<<EOF", "<<'EOF'", '<<"EOF"')
# "@@ -3,4 +3,5 @@" and what follows it, the way unified diffs write a hunk header.
_RANGES = re.compile(r"-\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?")
_HEADERS = "'*** Add File: PATH', '*** Delete File: PATH' or '*** Update File: PATH'"
# A hunk's line by its first character; an empty line is an empty context line.
_KINDS: dict[str, Literal[" ", "-", "+"]] = {"": " ", " ": " ", "-": "-", "+": "+"}


class PatchSyntaxError(ValueError):
    """The patch text does not follow the grammar; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class ChangeLine:
    """One line of a hunk: context (" "), removed ("-") or added ("+")."""

    kind: Literal[" ", "-", "+"]
    text: str


@dataclass(frozen=True, slots=True)
class Hunk:
    """A run of changes in one file. ``header`` is the text after "@@ " (a line of the
    file the hunk lies below), ``at_end`` is set by "*** End of File", ``line`` is
    where the hunk starts in the patch."""

    header: str | None
    lines: tuple[ChangeLine, ...]
    at_end: bool
    line: int

    @property
    def old(self) -> list[str]:
        """The lines the file must hold: context and removed, in order."""
        return [c.text for c in self.lines if c.kind != "+"]

    @property
    def new(self) -> list[str]:
        """The lines that take their place: context and added, in order."""
        return [c.text for c in self.lines if c.kind != "-"]


@dataclass(frozen=True, slots=True)
class AddFile:
    path: str
    lines: tuple[str, ...]
    line: int

    @property
    def content(self) -> str:
        """The new file's text: each line ends with a newline."""
        return "".join(f"{line}\n" for line in self.lines)


@dataclass(frozen=True, slots=True)
class DeleteFile:
    path: str
    line: int


@dataclass(frozen=True, slots=True)
class UpdateFile:
    path: str
    move_to: str | None
    hunks: tuple[Hunk, ...]
    line: int


Operation = AddFile | DeleteFile | UpdateFile


def operation_name(op: Operation) -> str:
    """How the patch names ``op``: "Add File", "Delete File" or "Update File"."""
    match op:
        case AddFile():
            return "Add File"
        case DeleteFile():
            return "Delete File"
        case UpdateFile():
            return "Update File"


def parse_patch(text: str) -> tuple[Operation, ...]:
    """The operations of the patch ``text``, in order; a PatchSyntaxError naming the
    line when it does not follow the grammar (module docstring) or changes nothing."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    first, last = 0, len(lines) - 1
    while first <= last and not lines[first].strip():
        first += 1
    while last >= first and not lines[last].strip():
        last -= 1
    if first > last:
        raise PatchSyntaxError(1, f"the patch is empty; it must start with '{BEGIN}'.")
    heredoc = lines[first].strip() in _HEREDOC_STARTS and lines[last].strip().endswith("EOF")
    if heredoc and last - first >= 3:
        first, last = first + 1, last - 1
    if lines[first].strip() != BEGIN:
        raise PatchSyntaxError(
            first + 1, f"the patch must start with '{BEGIN}', not {lines[first].strip()!r}."
        )
    if last == first or lines[last].strip() != END:
        raise PatchSyntaxError(
            last + 1, f"the patch must end with '{END}', not {lines[last].strip()!r}."
        )
    ops = _Parser(lines, first + 1, last).operations()
    if not ops:
        raise PatchSyntaxError(
            last + 1, f"the patch holds no file operation: give at least one {_HEADERS}."
        )
    return ops


class _Parser:
    """One pass over the lines between the markers: ``lines[at:end]``."""

    def __init__(self, lines: list[str], at: int, end: int) -> None:
        self.lines = lines
        self.at = at
        self.end = end

    def _number(self) -> int:
        return self.at + 1

    def _path(self, marker: str) -> str:
        path = self.lines[self.at].strip()[len(marker.rstrip()) :].strip()
        if not path:
            raise PatchSyntaxError(self._number(), f"'{marker.strip()}' names no path.")
        return path

    def operations(self) -> tuple[Operation, ...]:
        ops: list[Operation] = []
        while self.at < self.end:
            header = self.lines[self.at].strip()
            if not header:
                self.at += 1
            elif header.startswith(ADD.rstrip()):
                ops.append(self._add())
            elif header.startswith(DELETE.rstrip()):
                ops.append(DeleteFile(self._path(DELETE), self._number()))
                self.at += 1
            elif header.startswith(UPDATE.rstrip()):
                ops.append(self._update())
            else:
                raise PatchSyntaxError(self._number(), self._not_a_header(header, ops))
        return tuple(ops)

    @staticmethod
    def _not_a_header(header: str, ops: list[Operation]) -> str:
        text = f"{header!r} is not a file operation: expected {_HEADERS}."
        if ops and isinstance(ops[-1], AddFile):
            text += " Every line of an added file starts with '+'."
        return text

    def _add(self) -> AddFile:
        op_line, path = self._number(), self._path(ADD)
        self.at += 1
        added: list[str] = []
        while self.at < self.end and self.lines[self.at].startswith("+"):
            added.append(self.lines[self.at][1:])
            self.at += 1
        return AddFile(path, tuple(added), op_line)

    def _update(self) -> UpdateFile:
        op_line, path = self._number(), self._path(UPDATE)
        self.at += 1
        move_to = None
        if self.at < self.end and self.lines[self.at].strip().startswith(MOVE.rstrip()):
            move_to = self._path(MOVE)
            self.at += 1
        hunks: list[Hunk] = []
        while self.at < self.end:
            line = self.lines[self.at]
            if not line.strip():  # blank lines between hunks
                self.at += 1
            elif line.startswith("*"):  # the next operation
                break
            else:
                hunks.append(self._hunk(first=not hunks))
        if not hunks:
            raise PatchSyntaxError(
                op_line, f"'{UPDATE}{path}' has no hunk: give '@@' and the lines to change."
            )
        return UpdateFile(path, move_to, tuple(hunks), op_line)

    def _hunk(self, *, first: bool) -> Hunk:
        start = self._number()
        header = _hunk_header(self.lines[self.at])
        if header is not None:
            self.at += 1
        elif not first:
            raise PatchSyntaxError(start, _not_a_change(self.lines[self.at]))
        changes: list[ChangeLine] = []
        at_end = False
        while self.at < self.end:
            line = self.lines[self.at]
            if line.strip() == END_OF_FILE:
                if not changes:
                    break  # reported below, as a hunk without lines
                at_end = True
                self.at += 1
                break
            kind = _KINDS.get(line[:1])
            if kind is not None:
                changes.append(ChangeLine(kind, line[1:]))
            elif changes:
                break  # the next hunk's "@@", or the next operation
            else:
                raise PatchSyntaxError(self._number(), _not_a_change(line))
            self.at += 1
        if not changes:
            raise PatchSyntaxError(
                start,
                "the hunk has no lines: give context (' '), removed ('-') or added ('+') "
                "lines after '@@'.",
            )
        return Hunk(_header_text(header), tuple(changes), at_end, start)


def _hunk_header(line: str) -> str | None:
    """The text after "@@" when ``line`` starts a hunk ("" for a bare "@@"), else None."""
    stripped = line.strip()
    if stripped == "@@":
        return ""
    if line.startswith("@@ "):
        rest = line[3:]
        ranges = _RANGES.match(rest)
        return rest[ranges.end() :] if ranges else rest
    return None


def _header_text(header: str | None) -> str | None:
    """A header to look for in the file; None when there is none to look for."""
    return header if header and header.strip() else None


def _not_a_change(line: str) -> str:
    return (
        f"{line!r} is not a line of a hunk: each starts with ' ' (context), '-' "
        "(removed) or '+' (added), and a hunk after the first starts with '@@'."
    )
