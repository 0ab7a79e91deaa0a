"""The ``apply_patch`` tool: Codex CLI's patch format (``patch_grammar.py``), several
files in one call, all of them or none.

Three parts, each in a module of its own: the plan — every file the patch names,
worked out in memory, and what guards what (``patch_plan.py``); the matching of a
hunk to a file's text (``patch_match.py``); the writing, all or none
(``patch_commit.py``). This module is the tool: its description, its answers (T2),
what the model and the user are shown.

The register after: a file the patch wrote whole (Add File), or one read whole and
unchanged before the patch (and so known whole now), gets a stamp of its new content
(F5); a deleted or moved-away file's stamp is dropped; others stay unstamped (the
model saw only hunks of them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

from toolpool.errors import ToolError
from toolpool.preflight import cut_note
from toolpool.tool import Arguments, Preview, ToolContext, ValidationResult
from toolpool.tools.support.diff import MAX_DIFF_CHARS, unified_diff
from toolpool.tools.support.patch_commit import commit
from toolpool.tools.support.patch_grammar import (
    PatchSyntaxError,
    UpdateFile,
    parse_patch,
)
from toolpool.tools.support.patch_plan import PatchedFile, PatchPlan
from toolpool.tools.support.paths import Access, open_path
from toolpool.tools.support.stamps import (
    Snapshot,
    record,
)

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


def _file_diff(file: PatchedFile) -> str:
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


def _preview(changes: list[PatchedFile]) -> Preview:
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


def _summary(changes: list[PatchedFile]) -> str:
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


def _renew_stamps(ctx: ToolContext, plan: PatchPlan) -> None:
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
            commit(changes)
            _renew_stamps(ctx, plan)
            return _summary(changes)

    @contextlib.contextmanager
    def _planned(self, args: Arguments, ctx: ToolContext, *, contents: bool) -> Iterator[PatchPlan]:
        try:
            ops = parse_patch(args["input"])
        except PatchSyntaxError as exc:
            raise ToolError(f"The patch is not valid: {exc}") from None
        with ExitStack() as stack:
            plan = PatchPlan(ctx, stack, contents=contents)
            plan.run(ops)
            yield plan


apply_patch_tool = ApplyPatchTool()
