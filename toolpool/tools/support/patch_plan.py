"""The files a patch touches, planned in memory (``apply_patch.py``): each operation in
patch order against the file as it is now, and what guards what.

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
plans.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from toolpool.call_forms import has_read_tool
from toolpool.errors import ToolError
from toolpool.file_reads import Freshness, content_hash
from toolpool.refusals import Reason, read_first, unread_part, unread_reason
from toolpool.tool import ToolContext
from toolpool.tools.support.patch_grammar import (
    AddFile,
    DeleteFile,
    Operation,
    UpdateFile,
    operation_name,
)
from toolpool.tools.support.patch_match import apply_hunks
from toolpool.tools.support.paths import Access, Resolved, argument_path, display, open_path
from toolpool.tools.support.stamps import (
    CODE_NOT_READ,
    CODE_STALE,
    Snapshot,
    ensure_unchanged_since_read,
    read_snapshot,
    unread_details,
)
from toolpool.tools.support.suggest import missing_file
from toolpool.tools.support.text import TextDocument


@dataclass(eq=False, slots=True)
class PatchedFile:
    """One path the patch names: what it was before, and what the patch made of it."""

    target: Resolved
    shown: str
    existed: bool  # before the patch
    regular: bool  # before the patch, when it existed
    original: Snapshot | None = None  # the bytes before (when planned for real)
    present: bool = False  # in the patch's view, after the operations so far
    data: bytes | None = None  # its content then (when planned for real)
    whole: bool = False  # the model knows the whole content
    moved_from: PatchedFile | None = None  # a move's destination: its source
    moved_away: bool = False  # a move's source
    guarded: bool = False  # the register checked once
    written: os.stat_result | None = None

    @property
    def changed(self) -> bool:
        if not self.existed or self.original is None:
            return self.present
        return not self.present or self.data != self.original.data


class PatchPlan:
    """The patch applied in memory to the files it names (module docstring). With
    ``contents`` false (validate) files are only stat'ed, not read, and hunks are not
    matched: what can be judged without reading is."""

    def __init__(self, ctx: ToolContext, stack: ExitStack, *, contents: bool) -> None:
        self.ctx = ctx
        self.stack = stack
        self.contents = contents
        self.files: dict[Path, PatchedFile] = {}

    def file(self, raw: str, op: str) -> PatchedFile:
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
        file = PatchedFile(target, shown, existed=mode is not None, regular=regular)
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

    def _patched(self, file: PatchedFile, op: UpdateFile) -> bytes:
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
    def _produce(file: PatchedFile, data: bytes | None) -> None:
        file.present, file.data = True, data

    def _existing(self, file: PatchedFile, op: str) -> None:
        if not file.present:
            if file.existed:  # gone earlier in this patch
                raise ToolError(f"{op} {file.shown}: an earlier operation of the patch removed it.")
            missing = missing_file(file.target.path, self.ctx)
            raise ToolError(f"{op} {missing.message}", reason=missing.reason)
        if file.existed and not file.regular:
            raise ToolError(
                f"{op} {file.shown}: it is not a regular file; apply_patch changes files."
            )

    def _replaceable(self, file: PatchedFile, op: str) -> None:
        if file.existed and not file.regular:
            raise ToolError(f"{op} {file.shown}: it exists and is not a file.")
        if file.present:
            self._guard(file, op, "replaces it")

    def _guard(self, file: PatchedFile, op: str, does: str) -> None:
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
                    f"{op} {file.shown}: {exc.message}{why}", details=exc.details, reason=exc.reason
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
                        reason=unread_reason(unread),
                    )
                case Freshness.CHANGED:
                    raise ToolError(
                        f"{op} {file.shown}: it changed since it was read.{why}",
                        details={"validation_code": CODE_STALE},
                        reason=Reason.CHANGED,
                    )
                case Freshness.FRESH:
                    pass
        file.guarded = True

    def changes(self) -> list[PatchedFile]:
        return [file for file in self.files.values() if file.changed]


def _encoded(file: PatchedFile, op: str, encode: Callable[[], bytes]) -> bytes:
    try:
        return encode()
    except UnicodeEncodeError:
        raise ToolError(
            f"{op} {file.shown}: the patch is not valid Unicode text (it holds a lone surrogate)."
        ) from None
