"""The ``apply_patch`` tool: Codex CLI's patch format (``patch_grammar.py``), several
files in one call, all of them or none.

What guards what. Models trained on Codex read files through the shell, not through
``read``, so an Update File needs no prior read: its context and removed lines must
match the file as it is now, and that match is its staleness guard. The two
operations whose patch does not show what they destroy are guarded by the file-read
register, as ``write`` over an existing file is (SPEC F3):

- Add File of a path that exists, and Move to a path that exists, replace a file the
  patch does not show: refused unless that file was read whole in this session and
  is unchanged since (code 2 or 3, as write's refusal);
- Delete File likewise: refused unless the file was read whole and is unchanged, so
  that what goes is what the model saw (a file the user changed meanwhile is never
  deleted unseen).

A refusal of that guard names the read that lifts it (SPEC F14). In a session of the
``codex`` or ``openai`` tool profile there is no guard: those tool sets have no read
tool (their models read through a shell, which the register never sees), so the
patch applies as Codex applies it (F11, F15) — and its preview shows what it loses (a
deleted file's every line, the old content of a file added over or moved onto), for
a gate to judge.

All or none, across files. Every file is planned in memory first, against the file
as it is now: the operations in patch order, each seeing what the ones before it
left (an Add then an Update of one path works). Nothing is written unless all of it
plans. Then every file that existed and changes gets a hard link beside it (its
backup, the same inode: content, mode and mtime), new and changed files are written
(atomically, as write does), and deleted and moved-away files are unlinked last. If
a step fails, what was done is undone in reverse: backups renamed back over their
names, created files and directories removed; then the error says so.

Matching is Codex's: a hunk's "@@ line" is found first (from where the hunk before
it ended), then its old lines from there — exactly, then ignoring trailing
whitespace, then ignoring leading and trailing whitespace, then also ignoring
typographic dashes, quotes and spaces (Codex's punctuation normalisation). A hunk
marked "*** End of File" must match at the file's end. Context lines keep the
file's own text (a loose match does not rewrite them); an updated file ends with a
newline, CRLF endings and a UTF-8 BOM are kept. Beyond Codex: a hunk of only added
lines goes right below its "@@ line" (Codex appends it to the file's end), at the
end when it has none.

The register after: a file the patch wrote whole (Add File), or one read whole and
unchanged before the patch (and so known whole now), gets a stamp of its new content
(F5); a deleted or moved-away file's stamp is dropped; others stay unstamped (the
model saw only hunks of them).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from toolpool.call_forms import has_read_tool
from toolpool.errors import ToolError
from toolpool.file_reads import (
    CODE_NOT_READ,
    CODE_STALE,
    Freshness,
    content_hash,
    read_first,
    unread_details,
    unread_part,
)
from toolpool.preflight import cut_note
from toolpool.tool import Arguments, Preview, ToolContext, ValidationResult
from toolpool.tools.atomic import write_atomic_at
from toolpool.tools.diff import MAX_DIFF_CHARS, unified_diff
from toolpool.tools.near_miss import whitespace_match
from toolpool.tools.patch_grammar import (
    AddFile,
    DeleteFile,
    Hunk,
    Operation,
    PatchSyntaxError,
    UpdateFile,
    operation_name,
    parse_patch,
)
from toolpool.tools.paths import Access, Resolved, argument_path, display, open_path
from toolpool.tools.read import read_snapshot
from toolpool.tools.stamps import Snapshot, ensure_unchanged_since_read, record
from toolpool.tools.suggest import missing_file_message
from toolpool.tools.text import TextDocument, cut_line

DESCRIPTION = """\
Apply a patch that adds, updates, moves and deletes files, several in one call: \
all of them or none. input is the patch:

*** Begin Patch
*** Add File: path/new.py
+every line of the new file, after a +
*** Update File: path/old.py
*** Move to: path/renamed.py   (optional: rename the file too)
@@ def f():                    (a line above the change, to find it; or @@ alone)
 a context line (one space, then the line as it is)
-a removed line
+an added line
*** End of File                (optional: the hunk is at the file's end)
*** Delete File: path/gone.py
*** End Patch

- Paths are relative to the workspace. Give 3 lines of context above and below \
each change; several hunks of one file go in the file's order.
- Context and removed lines must match the file as it is now (trailing and leading \
whitespace aside): that is the check that the file did not change, so no read is \
needed for Update File. A hunk that does not match is refused, naming the hunk, \
with the nearest place the file has.
- Add File over an existing file, Move to an existing file and Delete File replace \
or remove what the patch does not show: where the session has a read tool (every \
tool set but Codex's and OpenAI's), they are refused unless the file was read whole \
with it and is unchanged since.
- All or none: when any file fails, no file is changed."""

# Typographic characters Codex's matching treats as their ASCII forms (its last pass).
_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a", " "),
        **dict.fromkeys("\u202f\u205f\u3000", " "),
    }
)
_MAX_QUOTED_LINES = 20


def _loosest(line: str) -> str:
    return line.strip().translate(_PUNCTUATION)


def _exact(line: str) -> str:
    return line


# The passes of a search, strictest first: each runs over the whole range before the next.
_PASSES: tuple[Callable[[str], str], ...] = (_exact, str.rstrip, str.strip, _loosest)


def seek(lines: list[str], pattern: list[str], start: int, *, at_end: bool) -> int | None:
    """Where ``pattern`` starts in ``lines`` at or after ``start`` (only at the very
    end when ``at_end``), by the strictest pass that finds it; None when none does."""
    if not pattern:
        return start
    last = len(lines) - len(pattern)
    if last < 0:
        return None
    first = last if at_end else start
    for key in _PASSES:
        wanted = [key(line) for line in pattern]
        head = wanted[0]
        for i in range(first, last + 1):
            if key(lines[i]) == head and all(
                key(lines[i + k]) == wanted[k] for k in range(1, len(wanted))
            ):
                return i
    return None


# --- hunks applied to a file's text ----------------------------------------------------


def apply_hunks(text: str, hunks: tuple[Hunk, ...], shown: str) -> str:
    """``text`` (LF line endings) with ``hunks`` applied, Codex's way (module
    docstring); a ToolError naming the hunk that does not match, and where the file
    comes nearest."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    at = 0
    replacements: list[tuple[int, int, list[str]]] = []
    for index, hunk in enumerate(hunks):
        if hunk.header is not None:
            found = seek(lines, [hunk.header], at, at_end=False)
            if found is None:
                raise _mismatch(lines, hunks, index, at, shown)
            at = found + 1
        changes = hunk.lines
        old = hunk.old
        if not old:  # only added lines: below the header, or at the end
            where = len(lines) if hunk.header is None or hunk.at_end else at
            replacements.append((where, 0, hunk.new))
            continue
        found = seek(lines, old, at, at_end=hunk.at_end)
        if found is None and len(old) > 1 and old[-1] == "":
            # A last empty line often stands for the file's final newline (Codex
            # retries without it): then what is left must end the file.
            found = seek(lines, old[:-1], at, at_end=True)
            if found is not None and found >= at:
                last = max(i for i, change in enumerate(changes) if change.kind != "+")
                changes, old = changes[:last] + changes[last + 1 :], old[:-1]
            else:
                found = None
        if found is None:
            raise _mismatch(lines, hunks, index, at, shown)
        new: list[str] = []
        seen = 0
        for change in changes:
            if change.kind == " ":
                new.append(lines[found + seen])  # the file's own text, however it matched
            if change.kind != "+":
                seen += 1
            if change.kind == "+":
                new.append(change.text)
        replacements.append((found, len(old), new))
        at = found + len(old)
    for start, length, new in sorted(replacements, key=lambda r: r[0], reverse=True):
        lines[start : start + length] = new
    return "".join(f"{line}\n" for line in lines)


def _mismatch(
    lines: list[str], hunks: tuple[Hunk, ...], index: int, at: int, shown: str
) -> ToolError:
    hunk = hunks[index]
    where = f"hunk {index + 1} of {len(hunks)} (line {hunk.line} of the patch)"
    base = f"Update File {shown}: {where} does not match the file."
    again = (
        " Look at the file again (it may have changed) and make the patch from what it holds now."
    )
    if hunk.header is not None and seek(lines, [hunk.header], at, at_end=False) is None:
        above = "" if at == 0 else f" below line {at}, where the hunk before it ended"
        return ToolError(f"{base} Its '@@ {hunk.header}' line is not in the file{above}.{again}")
    old = hunk.old
    anywhere = seek(lines, old, 0, at_end=False)
    if anywhere is not None and anywhere < at:
        return ToolError(
            f"{base} Its lines are at line {anywhere + 1}, above where the hunk before it "
            "ended: give the hunks of a file in the file's order."
        )
    if anywhere is not None and hunk.at_end:
        return ToolError(
            f"{base} It is marked '*** End of File' but its lines are at line "
            f"{anywhere + 1}, not at the end. Drop the marker, or patch the file's end."
        )
    spaced = whitespace_match("\n".join(lines[at:]), "\n".join(old))
    if spaced is not None:
        line, quoted = spaced
        return ToolError(
            f"{base} Its lines are there except for whitespace inside them, at line "
            f"{line + at}; the file has:\n{quoted}\nCopy the lines exactly as the file has them."
        )
    return ToolError(base + _nearest(lines, old) + again)


def _nearest(lines: list[str], old: list[str]) -> str:
    """Where the file comes nearest the hunk's old lines: the window where most of
    them are the file's lines (whitespace and punctuation aside), quoted."""
    wanted = [_loosest(line) for line in old]
    loose = [_loosest(line) for line in lines]
    best, best_at = 0, 0
    for i in range(max(len(lines) - len(old), 0) + 1):
        same = sum(a == b for a, b in zip(loose[i : i + len(old)], wanted, strict=False))
        if same > best:
            best, best_at = same, i
    if best == 0:
        return " None of its context or removed lines is in the file."
    shown = lines[best_at : best_at + min(len(old), _MAX_QUOTED_LINES)]
    quoted = "\n".join(f"{best_at + 1 + n:>6}\t{cut_line(line)}" for n, line in enumerate(shown))
    return (
        f" The nearest place is line {best_at + 1}, where {best} of its {len(old)} context "
        f"and removed lines match; the file has there:\n{quoted}\n"
    )


# --- the files a patch touches, in memory ----------------------------------------------


@dataclass(eq=False, slots=True)
class _File:
    """One path the patch names: what it was before, and what the patch made of it."""

    target: Resolved
    shown: str
    existed: bool  # before the patch
    regular: bool  # before the patch, when it existed
    original: Snapshot | None = None  # the bytes before (when planned for real)
    present: bool = False  # in the patch's view, after the operations so far
    data: bytes | None = None  # its content then (when planned for real)
    whole: bool = False  # the model knows the whole content
    moved_from: _File | None = None  # a move's destination: its source
    moved_away: bool = False  # a move's source
    guarded: bool = False  # the register checked once
    written: os.stat_result | None = None

    @property
    def changed(self) -> bool:
        if not self.existed or self.original is None:
            return self.present
        return not self.present or self.data != self.original.data


class _Plan:
    """The patch applied in memory to the files it names (module docstring). With
    ``contents`` false (validate) files are only stat'ed, not read, and hunks are not
    matched: what can be judged without reading is."""

    def __init__(self, ctx: ToolContext, stack: ExitStack, *, contents: bool) -> None:
        self.ctx = ctx
        self.stack = stack
        self.contents = contents
        self.files: dict[Path, _File] = {}

    def file(self, raw: str, op: str) -> _File:
        try:
            target = open_path(raw, self.ctx, Access.WRITE)
        except ToolError as exc:
            raise ToolError(f"{op} {raw}: {exc.message}") from None
        known = self.files.get(target.path)
        if known is not None:
            target.close()
            return known
        self.stack.enter_context(target)
        shown = display(target.path, self.ctx)
        try:
            mode: int | None = target.lstat().st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise ToolError(f"{op} {shown}: {exc.strerror}.") from None
        regular = mode is not None and stat.S_ISREG(mode)
        file = _File(target, shown, existed=mode is not None, regular=regular)
        file.present = file.existed
        if self.contents and regular:
            try:
                file.original = read_snapshot(target, shown)
            except OSError as exc:
                raise ToolError(f"{op} {shown} cannot be read: {exc.strerror}.") from None
            file.data = file.original.data
            stamp = self.ctx.files.get(target.path)
            file.whole = (
                stamp is not None
                and not stamp.partial
                and stamp.content_hash == content_hash(file.data)
            )
        self.files[target.path] = file
        return file

    def run(self, ops: tuple[Operation, ...]) -> None:
        for op in ops:
            name = operation_name(op)
            match op:
                case AddFile():
                    file = self.file(op.path, name)
                    self._replaceable(file, name)
                    self._produce(file, _encoded(file, name, op.content.encode))
                    file.whole = True
                case DeleteFile():
                    file = self.file(op.path, name)
                    self._existing(file, name)
                    self._guard(file, name, "deletes it")
                    file.present, file.data = False, None
                case UpdateFile():
                    self._update(op, name)

    def _update(self, op: UpdateFile, name: str) -> None:
        file = self.file(op.path, name)
        self._existing(file, name)
        data = self._patched(file, op) if self.contents else None
        if op.move_to is None:
            file.data = data
            return
        dest = self.file(op.move_to, "Move to")
        if dest is file:
            file.data = data
            return
        self._replaceable(dest, "Move to")
        self._produce(dest, data)
        dest.whole, dest.moved_from = file.whole, file
        file.present, file.data, file.moved_away = False, None, True

    def _patched(self, file: _File, op: UpdateFile) -> bytes:
        assert file.data is not None
        try:
            doc = TextDocument.decode(file.data)
        except UnicodeDecodeError:
            raise ToolError(
                f"Update File {file.shown}: it is not UTF-8 text, and apply_patch only "
                "changes UTF-8 files."
            ) from None
        text = apply_hunks(doc.text, op.hunks, file.shown)
        return _encoded(file, "Update File", lambda: doc.encode(text))

    @staticmethod
    def _produce(file: _File, data: bytes | None) -> None:
        file.present, file.data = True, data

    def _existing(self, file: _File, op: str) -> None:
        if not file.present:
            if file.existed:  # gone earlier in this patch
                raise ToolError(f"{op} {file.shown}: an earlier operation of the patch removed it.")
            raise ToolError(f"{op} {missing_file_message(file.target.path, self.ctx)}")
        if file.existed and not file.regular:
            raise ToolError(
                f"{op} {file.shown}: it is not a regular file; apply_patch changes files."
            )

    def _replaceable(self, file: _File, op: str) -> None:
        if file.existed and not file.regular:
            raise ToolError(f"{op} {file.shown}: it exists and is not a file.")
        if file.present:
            self._guard(file, op, "replaces it")

    def _guard(self, file: _File, op: str, does: str) -> None:
        """F3 for what the patch does not show: a file that existed must have been
        read whole, and be unchanged since — except in a session whose tool set has
        no read tool (Codex's, OpenAI's: their models read through a shell): there
        the patch applies as Codex applies it, its preview showing what is lost
        (F11, F15)."""
        if not file.existed or file.guarded or not has_read_tool(self.ctx.tool_profile):
            return
        why = (
            f" apply_patch {does} only when it was read whole with read in this session "
            "and is unchanged since: the patch does not show what is lost."
        )
        if self.contents:
            assert file.original is not None
            try:
                ensure_unchanged_since_read(self.ctx, file.target.path, file.original.data)
            except ToolError as exc:
                raise ToolError(
                    f"{op} {file.shown}: {exc.message}{why}", details=exc.details
                ) from None
        else:
            match self.ctx.files.freshness(file.target.path, file.target.seen_at()):
                case Freshness.NEVER_READ | Freshness.PARTIAL:
                    path = file.target.path
                    unread = unread_details(argument_path(path, self.ctx), self.ctx.files.get(path))
                    how = (
                        f"it was only partly read{unread_part(unread)}"
                        if unread["partly_read"]
                        else "it has not been read"
                    )
                    fix = read_first(unread, self.ctx.tool_profile)
                    raise ToolError(
                        f"{op} {file.shown}: {how}.{why}{fix}",
                        details={**unread, "validation_code": CODE_NOT_READ},
                    )
                case Freshness.CHANGED:
                    raise _refused(
                        f"{op} {file.shown}: it changed since it was read.{why}", CODE_STALE
                    )
                case Freshness.FRESH:
                    pass
        file.guarded = True

    def changes(self) -> list[_File]:
        return [file for file in self.files.values() if file.changed]


def _encoded(file: _File, op: str, encode: Callable[[], bytes]) -> bytes:
    try:
        return encode()
    except UnicodeEncodeError:
        raise ToolError(
            f"{op} {file.shown}: the patch is not valid Unicode text (it holds a lone surrogate)."
        ) from None


def _refused(message: str, code: int) -> ToolError:
    return ToolError(message, details={"validation_code": code})


# --- writing, all or none ----------------------------------------------------------------


def _commit(changes: list[_File]) -> None:
    """Write ``changes`` (module docstring: backups, writes, unlinks, undone in reverse
    on a failure); a ToolError that says what failed and that nothing was changed."""
    backups: dict[_File, str] = {}
    undo: list[tuple[Callable[[], None], str | None]] = []  # a step, the backup it uses
    current: _File | None = None
    try:
        for current in changes:
            if current.existed:
                backups[current] = _backup(current)
        # New and changed files first, then deletions: a move's source is still there
        # to give its destination the source's mode.
        for current in sorted(changes, key=lambda f: not f.present):
            if current.present:
                _write(current, undo)
            else:
                os.unlink(current.target.name, dir_fd=current.target.dir_fd)
            if current in backups:
                undo.append((_restore(current, backups[current]), backups[current]))
    except BaseException as exc:
        kept: list[str] = []
        for step, backup in reversed(undo):
            failure = _attempt(step)
            if failure is not None:
                kept.append(failure if backup is None else f"{failure} (kept as {backup})")
        for file, backup in backups.items():
            if not any(backup in k for k in kept):
                _remove(file.target.dir_fd, backup)
        if not isinstance(exc, OSError | ToolError):
            raise
        if isinstance(exc, ToolError):
            what = exc.message
        else:
            shown = "A file of the patch" if current is None else current.shown
            what = f"{shown} cannot be written: {exc.strerror or exc}."
        if kept:
            raise ToolError(
                f"{what} The files already written could not all be put back: {'; '.join(kept)}."
            ) from None
        undone = ": the files already written were put back" if undo else ""
        raise ToolError(f"{what} Nothing was changed{undone}.") from None
    for file, backup in backups.items():
        _remove(file.target.dir_fd, backup)


def _backup(file: _File) -> str:
    """A hard link to ``file`` beside it: the file as it was, to rename back."""
    while True:
        name = f".{file.target.name}.{secrets.token_hex(4)}.orig"
        try:
            os.link(
                file.target.name,
                name,
                src_dir_fd=file.target.dir_fd,
                dst_dir_fd=file.target.dir_fd,
                follow_symlinks=False,
            )
        except FileExistsError:
            continue
        except OSError as exc:
            raise ToolError(
                f"{file.shown}: no backup can be kept to undo the patch if a later write "
                f"failed ({exc.strerror}), so nothing was written."
            ) from None
        return name


def _write(file: _File, undo: list[tuple[Callable[[], None], str | None]]) -> None:
    target = file.target
    assert file.data is not None
    if target.missing:
        base = os.dup(target.dir_fd)
        missing = target.missing
        undo.append((lambda: _remove_directories(base, missing), None))
        target.make_parents()
    if not file.existed:
        undo.append((lambda: _remove(target.dir_fd, target.name, strict=True), None))
        source = file.moved_from
        if source is not None and source.existed:
            # A moved file keeps its mode: the destination starts as a link to the
            # source, whose mode write_atomic_at then keeps. Another file system, or
            # one without hard links: the usual mode.
            with contextlib.suppress(OSError):
                os.link(
                    source.target.name,
                    target.name,
                    src_dir_fd=source.target.dir_fd,
                    dst_dir_fd=target.dir_fd,
                    follow_symlinks=False,
                )
    file.written = write_atomic_at(target.dir_fd, target.name, file.data)


def _restore(file: _File, backup: str) -> Callable[[], None]:
    fd, name = file.target.dir_fd, file.target.name
    return lambda: os.rename(backup, name, src_dir_fd=fd, dst_dir_fd=fd)


def _remove(dir_fd: int, name: str, *, strict: bool = False) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        if strict:
            raise


def _remove_directories(base: int, missing: tuple[str, ...]) -> None:
    """Remove the directories a write created below ``base`` (deepest first; only
    empty ones go), then close ``base``."""
    try:
        for depth in range(len(missing), 0, -1):
            with contextlib.suppress(OSError):
                os.rmdir("/".join(missing[:depth]), dir_fd=base)
    finally:
        os.close(base)


def _attempt(step: Callable[[], None]) -> str | None:
    try:
        step()
    except OSError as exc:
        return f"{exc.filename or 'a file'}: {exc.strerror}"
    return None


# --- what the model and the user see -----------------------------------------------------


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def _headers(name: str) -> tuple[str, str]:
    """The two header lines diff.py writes for the file ``name``."""
    first, second, _ = unified_diff("", "\n", name).split("\n", 2)
    return first, second


def _retitled(diff: str, minus: str | None = None, plus: str | None = None) -> str:
    if not diff:
        return diff
    first, second, rest = diff.split("\n", 2)
    return f"{minus or first}\n{plus or second}\n{rest}"


def _file_diff(file: _File) -> str:
    before = file.original.data if file.original is not None else None
    if not file.present:
        return _retitled(unified_diff(_text(before), "", file.shown), plus="+++ /dev/null")
    source = file.moved_from
    if source is None:
        return unified_diff(_text(before), _text(file.data), file.shown, created=before is None)
    old = _text(source.original.data if source.original is not None else None)
    minus = _headers(source.shown)[0]
    diff = unified_diff(old, _text(file.data), file.shown)
    moved = _retitled(diff, minus=minus) or f"{minus}\n{_headers(file.shown)[1]}\n"
    if before is None:
        return moved
    # A move onto an existing file: first what it replaces, as a deletion of it.
    replaced = _retitled(unified_diff(_text(before), "", file.shown), plus="+++ /dev/null")
    return replaced + moved


def _preview(changes: list[_File]) -> Preview:
    diffs: list[str] = []
    size = 0
    cut = False
    for count, file in enumerate(changes):
        if file.moved_away:
            continue  # shown by its destination's diff
        diff = _file_diff(file)
        if size + len(diff) > MAX_DIFF_CHARS and diffs:
            diffs.append(f"… {len(changes) - count} more files not shown\n")
            cut = True
            break
        diffs.append(diff)
        size += len(diff)
        cut = cut or diff.endswith(cut_note(MAX_DIFF_CHARS))
    return Preview("".join(diffs), cut)


def _summary(changes: list[_File]) -> str:
    added, updated, deleted = [], [], []
    for file in changes:
        if file.moved_away:
            continue
        if not file.present:
            deleted.append(f"D {file.shown}")
        elif file.moved_from is not None:
            updated.append(f"M {file.shown} (moved from {file.moved_from.shown})")
        elif file.existed:
            updated.append(f"M {file.shown}")
        else:
            added.append(f"A {file.shown}")
    if not changes:
        return "Success. The patch changed nothing: every file already held what it asks for."
    return "\n".join(["Success. Updated the following files:", *added, *updated, *deleted])


def _renew_stamps(ctx: ToolContext, plan: _Plan) -> None:
    """F5, for what the model knows whole (module docstring)."""
    for file in plan.changes():
        path = file.target.path
        if not file.present:
            ctx.files.forget(path)
        elif file.whole and file.data is not None and file.written is not None:
            record(ctx, path, Snapshot.written(file.data, file.written), partial=False)


class ApplyPatchTool:
    """Not read-only, not concurrency-safe (like edit); asks for the "write" permission."""

    name = "apply_patch"
    description = DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "input": {
                "type": "string",
                "description": "The whole patch, from '*** Begin Patch' to '*** End Patch'.",
            },
        },
        "required": ["input"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "ApplyPatch"

    def activity(self, args: Arguments) -> str:
        try:
            count = len(parse_patch(args.get("input", "")))
        except PatchSyntaxError:
            return "Applying a patch"
        return f"Applying a patch to {count} {'file' if count == 1 else 'files'}"

    def permissions(self) -> list[str]:
        return ["write"]

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        """Every path the patch names: their stamps travel with the call (FileTool)."""
        paths: list[Path] = []
        for op in parse_patch(args["input"]):
            for raw in (op.path, op.move_to if isinstance(op, UpdateFile) else None):
                if raw is not None:
                    with contextlib.suppress(ToolError), open_path(raw, ctx, Access.WRITE) as t:
                        paths.append(t.path)
        return paths

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """Cheap checks only (T4): the grammar, every path, stats and the register for
        what the patch does not show; hunks are matched by preview and execute."""
        try:
            with self._planned(args, ctx, contents=False):
                return ValidationResult.passed()
        except ToolError as exc:
            details = dict(exc.details)
            return ValidationResult.failed(exc.message, details.pop("validation_code", 1), details)

    def preview(self, args: Arguments, ctx: ToolContext) -> Preview:
        """The unified diff of every file the patch changes."""
        with self._planned(args, ctx, contents=True) as plan:
            return _preview(plan.changes())

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        with self._planned(args, ctx, contents=True) as plan:
            changes = plan.changes()
            _commit(changes)
            _renew_stamps(ctx, plan)
            return _summary(changes)

    @contextlib.contextmanager
    def _planned(self, args: Arguments, ctx: ToolContext, *, contents: bool) -> Iterator[_Plan]:
        try:
            ops = parse_patch(args["input"])
        except PatchSyntaxError as exc:
            raise ToolError(f"The patch is not valid: {exc}") from None
        with ExitStack() as stack:
            plan = _Plan(ctx, stack, contents=contents)
            plan.run(ops)
            yield plan


apply_patch_tool = ApplyPatchTool()
