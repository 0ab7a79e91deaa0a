"""The ``grep`` tool: ripgrep's search, by running ``rg`` itself (SPEC F1)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext
from toolpool.tools.support.kinds import ReadingTool
from toolpool.tools.support.paths import (
    Access,
    display,
    display_in,
    open_path,
    real_workspace,
    stat_beneath,
)
from toolpool.tools.support.ripgrep import RipgrepExit, run_ripgrep
from toolpool.tools.support.suggest import missing_file
from toolpool.tools.support.text import cut_line

# About 8,000 tokens: enough for a useful answer, small enough to leave room to think.
DEFAULT_MAX_OUTPUT_CHARS = 30_000
MODES = ("files_with_matches", "content", "count")
_CONTEXT_FLAGS = (("-C", "--context"), ("-B", "--before-context"), ("-A", "--after-context"))

DESCRIPTION = Template(
    """\
Search file contents with a regular expression, using ripgrep (rg). Use it instead \
of grep or rg in bash.

- pattern: Rust regex syntax, like PCRE without look-around or backreferences. \
Escape literal braces, dots and parentheses: "interface\\{\\}", "\\.get\\(".
- output_mode: "files_with_matches" (default) lists the matching files, newest first; \
"content" shows matching lines as path:line:text (line numbers with -n, on by \
default; context lines with -A/-B/-C, shown as path-line-text); "count" gives the \
number of matching lines per file.
- Narrow the search with path (a file or directory; default: the workspace), glob \
(e.g. "*.py", "src/**/*.{ts,tsx}") or type (an rg file type: py, js, ts, rust, go, \
java…; faster than glob for standard types).
- -i ignores case; multiline lets a pattern span lines, with "." matching newlines.
- head_limit keeps only the first N lines (content) or entries (other modes).

Files ignored by .gitignore are skipped; hidden files are searched, .git is not. \
Output is capped at about $cap characters and says when it was cut: then narrow \
the search rather than paging through it. Paths are relative to the workspace."""
)


class GrepTool(ReadingTool):
    """Read-only and concurrency-safe (SPEC F1). For the same flags, the matches are
    rg's; the output is cut at ``max_output_chars``."""

    name = "grep"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression to search for."},
            "path": {
                "type": "string",
                "description": "File or directory to search. Default: the workspace.",
            },
            "glob": {
                "type": "string",
                "description": 'Only search files matching this glob (rg --glob), e.g. "*.py".',
            },
            "type": {
                "type": "string",
                "description": "Only search files of this rg type (rg --type), e.g. py.",
            },
            "output_mode": {
                "type": "string",
                "enum": list(MODES),
                "description": 'What to show. Default "files_with_matches".',
            },
            "-i": {"type": "boolean", "description": "Case-insensitive search (rg -i)."},
            "-n": {
                "type": "boolean",
                "description": 'Show line numbers (rg -n), "content" mode only. Default true.',
            },
            "-A": {
                "type": "integer",
                "minimum": 0,
                "description": 'Lines to show after each match (rg -A), "content" mode only.',
            },
            "-B": {
                "type": "integer",
                "minimum": 0,
                "description": 'Lines to show before each match (rg -B), "content" mode only.',
            },
            "-C": {
                "type": "integer",
                "minimum": 0,
                "description": 'Lines to show around each match (rg -C), "content" mode only.',
            },
            "multiline": {
                "type": "boolean",
                "description": "Let the pattern span lines; . matches newlines (rg -U).",
            },
            "head_limit": {
                "type": "integer",
                "minimum": 1,
                "description": "Only the first N output lines or entries.",
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def __init__(self, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> None:
        self.max_output_chars = max_output_chars
        self.description = DESCRIPTION.substitute(cap=f"{max_output_chars:,}")

    def label(self) -> str:
        return "Grep"

    def activity(self, args: Arguments) -> str:
        return f"Searching for {args.get('pattern', '')}"

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        with open_path(args.get("path") or ".", ctx, Access.READ) as target:
            try:
                searches_directory = stat.S_ISDIR(target.lstat().st_mode)
            except FileNotFoundError:
                raise missing_file(target.path, ctx) from None
            except OSError as exc:
                shown = display(target.path, ctx)
                raise ToolError(f"{shown} cannot be accessed: {exc.strerror}.") from None
            # rg runs in the directory searched (through its fd), with no path (or the
            # file's name), so that globs are anchored there and its output paths are
            # relative to it.
            if searches_directory:
                cwd, cwd_fd = target.path, target.open(os.O_PATH | os.O_DIRECTORY)
            else:
                cwd, cwd_fd = target.path.parent, os.dup(target.dir_fd)
            try:
                return self._search(args, target.path, cwd, cwd_fd, searches_directory, ctx)
            finally:
                os.close(cwd_fd)

    def _search(
        self,
        args: Arguments,
        target: Path,
        cwd: Path,
        cwd_fd: int,
        searches_directory: bool,
        ctx: ToolContext,
    ) -> str:
        mode = args.get("output_mode", "files_with_matches")
        argv = [*_rg_flags(args, mode), "--", args["pattern"]]
        if not searches_directory:
            argv.append(target.name)
        workspace = real_workspace(ctx)

        def name(rel: str) -> str:
            return display_in(cwd / rel, workspace)

        output = _Output(self.max_output_chars, args.get("head_limit"))
        if mode == "files_with_matches":
            paths: list[str] = []

            def collect(path: str) -> bool:
                paths.append(path)
                return True

            outcome = run_ripgrep(argv, cwd, ctx, collect, cwd_fd=cwd_fd, separator=b"\0")
            header = _files(paths, cwd_fd, name, output)
        else:
            where = display_in(cwd, workspace)
            lines = _PathLines(name, "" if where == "." else f"{where}/")
            if mode == "content":
                numbered = bool(args.get("-n", True))

                def take(line: str) -> bool:
                    return all(output.add(shown) for shown in lines.content(line, numbered))

                outcome = run_ripgrep(argv, cwd, ctx, take, cwd_fd=cwd_fd)
                if outcome.code is not None:  # rg ended by itself: what is left is whole
                    for shown in lines.leftover():
                        output.add(shown)
                header = ""
            else:
                counts: list[tuple[str, int]] = []

                def count(line: str) -> bool:
                    counts.extend(lines.counts(line))
                    return True

                outcome = run_ripgrep(argv, cwd, ctx, count, cwd_fd=cwd_fd)
                header = _counts(counts, output)
        return _finish(outcome, header, output, args["pattern"], display_in(target, workspace))


def _rg_flags(args: Arguments, mode: str) -> list[str]:
    """The rg flags that the tool's arguments stand for (before ``--`` and the pattern)."""
    flags: list[str] = []
    if args.get("-i"):
        flags.append("--ignore-case")
    if args.get("multiline"):
        flags += ["--multiline", "--multiline-dotall"]
    if args.get("glob"):
        flags.append(f"--glob={args['glob']}")
    if args.get("type"):
        flags.append(f"--type={args['type']}")
    # --null: every path rg prints ends in a NUL, so that a name holding a newline
    # is still one name (_PathLines).
    if mode == "files_with_matches":
        flags += ["--files-with-matches", "--null"]
    elif mode == "count":
        flags += ["--count", "--with-filename", "--null"]
    else:
        # Sorted, so that the same search gives the same (and the same cut) output.
        # Line numbers always: they tell a match (N:) from context (N-), which --null
        # would hide; -n false drops them again. The context separator starts with a
        # NUL, which no path can.
        flags += ["--no-heading", "--with-filename", "--sort=path", "--line-number"]
        flags += ["--null", f"--context-separator={_RG_SEPARATOR}"]
        flags += [f"{flag}={args[key]}" for key, flag in _CONTEXT_FLAGS if key in args]
    return flags


_RG_SEPARATOR = "\\x00--"  # rg reads the escape: a NUL, then rg's usual "--"
_NUMBERED = re.compile(r"(\d+)([:-])")


class _PathLines:
    """rg's ``--null`` output lines as the tool writes them: each path rg printed
    (``path NUL rest``) named by ``name`` (paths.display_in, quoted when needed). A
    path may hold newlines, so a line without a NUL is the start of a path whose line
    goes on in the next one; what rg says of its own (a "binary file matches" note)
    is kept as it came, under ``prefix`` (the searched directory)."""

    def __init__(self, name: Callable[[str], str], prefix: str) -> None:
        self.name = name
        self.prefix = prefix
        self.pending: list[str] = []

    def _records(self, line: str) -> list[tuple[str | None, str]]:
        """(path, rest) for a path's line, (None, text) for one of rg's own."""
        if line == "\0--":
            return [*self._strays(), (None, "--")]
        path, nul, rest = line.partition("\0")
        if not nul:
            self.pending.append(line)
            return []
        path = "\n".join([*self.pending, path])
        self.pending = []
        return [(path, rest)]

    def _strays(self) -> list[tuple[str | None, str]]:
        strays: list[tuple[str | None, str]] = [(None, self.prefix + line) for line in self.pending]
        self.pending = []
        return strays

    def content(self, line: str, numbered: bool) -> list[str]:
        """Content mode: ``path:N:text`` for a match, ``path-N-text`` for context
        (without ``N`` when not ``numbered``), ``--`` between groups."""
        shown = []
        for path, rest in self._records(line):
            if path is None:
                shown.append(cut_line(rest))
                continue
            number = _NUMBERED.match(rest)
            if number is None:  # not a line of matches: kept as rg wrote it
                shown.append(cut_line(f"{self.name(path)}:{rest}"))
                continue
            text = rest if numbered else rest[number.end() :]
            shown.append(cut_line(f"{self.name(path)}{number.group(2)}{text}"))
        return shown

    def counts(self, line: str) -> list[tuple[str, int]]:
        """Count mode: (the path as shown, its count)."""
        return [
            (self.name(path), int(rest))
            for path, rest in self._records(line)
            if path is not None and rest.isdigit()
        ]

    def leftover(self) -> list[str]:
        """What is left when rg is done: lines of its own that no NUL followed."""
        return [cut_line(text) for _, text in self._strays()]


class _Output:
    """Output lines up to a line limit and a character budget; remembers why it cut."""

    def __init__(self, max_chars: int, max_lines: int | None) -> None:
        self.lines: list[str] = []
        self.max_chars = max_chars
        self.max_lines = max_lines
        self.chars = 0
        self.cut: str | None = None

    def add(self, line: str) -> bool:
        """Keep ``line`` if it fits; False (and the reason kept) when it does not."""
        if self.max_lines is not None and len(self.lines) >= self.max_lines:
            self.cut = f"head_limit={self.max_lines}"
        elif self.chars + len(line) + 1 > self.max_chars:
            self.cut = f"the {self.max_chars:,}-character output limit"
        else:
            self.lines.append(line)
            self.chars += len(line) + 1
            return True
        return False


def _files(paths: list[str], cwd_fd: int, name: Callable[[str], str], output: _Output) -> str:
    """Fill ``output`` with the matching files, newest first; return the header."""

    def newest_first(rel: str) -> tuple[int, str]:
        try:
            return -stat_beneath(cwd_fd, rel).st_mtime_ns, rel
        except OSError:  # deleted since rg saw it, or swapped for a link
            return 0, rel

    for rel in sorted(paths, key=newest_first):
        if not output.add(name(rel)):
            break
    return f"Found {len(paths)} {'file' if len(paths) == 1 else 'files'}" if paths else ""


def _counts(counts: list[tuple[str, int]], output: _Output) -> str:
    """Fill ``output`` with path:count lines by path; return the header with the total."""
    counts = sorted(counts)
    for shown, n in counts:
        if not output.add(f"{shown}:{n}"):
            break
    if not counts:
        return ""
    total = sum(n for _, n in counts)
    return (
        f"Found {total} matching {'line' if total == 1 else 'lines'} in {len(counts)} "
        f"{'file' if len(counts) == 1 else 'files'}"
    )


def _finish(outcome: RipgrepExit, header: str, output: _Output, pattern: str, where: str) -> str:
    """The tool's text from rg's exit: 1 is no match, 2 an error (fatal only when rg
    found nothing at all: an unreadable file must not hide the matches elsewhere)."""
    if outcome.code == 2 and not output.lines:
        raise ToolError(f"ripgrep failed: {outcome.stderr or 'exit code 2'}")
    if not output.lines:
        return f"No matches for {pattern} in {'the workspace' if where == '.' else where}."
    text = "\n".join([header, *output.lines] if header else output.lines)
    if output.cut is not None:
        text += (
            f"\n[Output cut at {output.cut}: there is more. Narrow the search with path, "
            "glob, type or a more specific pattern.]"
        )
    if outcome.code == 2:
        text += f"\n[rg reported errors: {outcome.stderr[:500]}]"
    return text
