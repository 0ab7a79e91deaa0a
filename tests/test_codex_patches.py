"""Codex's patches as Codex applies them (SPEC F11, F12).

Codex's model reads through ``shell``, never through a read tool, so in a session of
the ``codex`` profile ``apply_patch`` deletes, adds over and moves onto existing
files without a prior read — the shapes of Codex's own scenarios
(``codex-rs/apply-patch/tests/fixtures/scenarios``: 002, 010, 011, 020) — whether the
patch comes to ``apply_patch`` or through ``shell`` as Codex intercepts it, and
through real workers (the session's profile crosses the wire). Its preview shows
what is lost, so a gate can still say no; a patch that fails still changes nothing;
other profiles keep F11's guard.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from toolpool import ErrorCode, ToolCall, UpdateKind, tools_in_module
from toolpool.engine import Coordinator, GateDecision
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.tools import TOOLS
from toolpool.tools.support.stamps import CODE_NOT_READ

from .support import EventLog, RecordingGate

pytestmark = pytest.mark.spec("F11", "F12")

Tree = Mapping[str, str]


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


# Codex's scenarios that destroy what the patch does not show: the tree before, the
# patch, the tree after.
SCENARIOS: dict[str, tuple[Tree, str, Tree]] = {
    "020-delete": (
        {"obsolete.txt": "obsolete\n", "keep.txt": "keep\n"},
        patch("*** Delete File: obsolete.txt"),
        {"keep.txt": "keep\n"},
    ),
    "011-add-over-a-file": (
        {"duplicate.txt": "old content\n"},
        patch("*** Add File: duplicate.txt", "+new content"),
        {"duplicate.txt": "new content\n"},
    ),
    "010-move-onto-a-file": (
        {
            "old/name.txt": "from\n",
            "old/other.txt": "unrelated\n",
            "renamed/dir/name.txt": "existing\n",
        },
        patch(
            "*** Update File: old/name.txt",
            "*** Move to: renamed/dir/name.txt",
            "@@",
            "-from",
            "+new",
        ),
        {"old/other.txt": "unrelated\n", "renamed/dir/name.txt": "new\n"},
    ),
    "002-combined": (
        {"modify.txt": "line1\nline2\n", "delete.txt": "obsolete\n"},
        patch(
            "*** Add File: nested/new.txt",
            "+created",
            "*** Delete File: delete.txt",
            "*** Update File: modify.txt",
            "@@",
            "-line2",
            "+changed",
        ),
        {"modify.txt": "line1\nchanged\n", "nested/new.txt": "created\n"},
    ),
}

# The ways a Codex model sends one patch: the tool, and its shell as Codex intercepts.
SHAPES = {
    "apply_patch": lambda text: ("apply_patch", {"input": text}),
    "shell-argv": lambda text: ("shell", {"command": ["apply_patch", text]}),
    "shell-heredoc": lambda text: (
        "shell",
        {"command": ["bash", "-lc", f"apply_patch <<'EOF'\n{text}\nEOF\n"]},
    ),
}


def plant(root: Path, tree: Tree) -> None:
    for name, content in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def tree_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def patch_call(shape: str, text: str, call_id: str = "p") -> ToolCall:
    name, arguments = SHAPES[shape](text)
    return ToolCall(call_id, name, arguments)


@pytest.fixture
async def pooled() -> AsyncIterator[Coordinator]:
    config = PoolConfig(min_workers=1, max_workers=1, tool_modules=("toolpool.tools",))
    async with WorkerPool(config) as pool:
        coordinator = Coordinator(tools_in_module("toolpool.tools"), executor=PoolExecutor(pool))
        yield coordinator
        coordinator.close()


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_F11_a_codex_session_applies_codex_scenarios_without_a_read(
    pooled: Coordinator, workspace: Path, scenario: str, shape: str
) -> None:
    # Given Codex's scenario tree, never read in this session, in workers
    before, text, after = SCENARIOS[scenario]
    plant(workspace, before)
    session = pooled.open_session(workspace, tool_profile="codex")
    # When the patch comes as a Codex model sends it
    (result,) = await pooled.run_turn(session, [patch_call(shape, text)])
    # Then it applies as Codex applies it
    assert not result.is_error, result.text
    summary = result.text if shape == "apply_patch" else json.loads(result.text)["output"]
    assert summary.startswith("Success. Updated the following files:")
    assert tree_of(workspace) == after


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_F11_other_profiles_keep_the_guard(
    pooled: Coordinator, workspace: Path, scenario: str
) -> None:
    # Given the same tree and patch in a toolpool session (apply_patch is its tool too)
    before, text, _ = SCENARIOS[scenario]
    plant(workspace, before)
    session = pooled.open_session(workspace)
    (refused,) = await pooled.run_turn(session, [patch_call("apply_patch", text)])
    # Then F11's guard refuses (code 2), naming the read that lifts it, and nothing changed
    assert refused.error_code is ErrorCode.VALIDATION_FAILED
    assert refused.details["validation_code"] == CODE_NOT_READ
    path = refused.details["read_first"]["path"]
    assert f'Read it first: read(path="{path}").' in refused.text
    assert tree_of(workspace) == dict(before)
    # And Codex's shell is not this session's: no way round the guard through it
    (other,) = await pooled.run_turn(session, [patch_call("shell-argv", text)])
    assert other.error_code is ErrorCode.TOOL_NOT_FOUND
    assert tree_of(workspace) == dict(before)


def lost_lines(preview: str) -> set[str]:
    return {line[1:] for line in preview.splitlines() if line.startswith("-") and line[:3] != "---"}


@pytest.mark.parametrize("shape", ["apply_patch", "shell-heredoc"])
@pytest.mark.parametrize(
    ("scenario", "lost"),
    [
        ("020-delete", {"obsolete"}),
        ("011-add-over-a-file", {"old content"}),
        ("010-move-onto-a-file", {"existing", "from"}),
        ("002-combined", {"obsolete", "line2"}),
    ],
)
async def test_F11_the_preview_shows_what_is_lost_and_the_gate_can_still_say_no(
    workspace: Path, scenario: str, lost: set[str], shape: str
) -> None:
    # Given a gate that says no, in a codex session
    before, text, _ = SCENARIOS[scenario]
    plant(workspace, before)
    gate = RecordingGate(GateDecision.deny("not that"))
    coordinator = Coordinator(TOOLS, gate=gate)
    try:
        session = coordinator.open_session(workspace, tool_profile="codex")
        log = EventLog()
        (denied,) = await coordinator.run_turn(session, [patch_call(shape, text)], on_event=log)
    finally:
        coordinator.close()
    # Then the gate was asked with a preview whose removed lines are every line lost
    (request,) = gate.requests
    (update,) = log.updates(UpdateKind.PREVIEW)
    assert request.preview == update.data
    assert lost_lines(request.preview) == lost
    # And it said no: nothing changed
    assert denied.error_code is ErrorCode.DENIED
    assert tree_of(workspace) == dict(before)


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_F11_a_codex_patch_that_fails_changes_nothing(
    pooled: Coordinator, workspace: Path, shape: str
) -> None:
    # Given a patch that deletes, adds over and moves onto files, then has a hunk
    # whose context the file does not hold
    plant(workspace, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "d.txt": "d\n"})
    text = patch(
        "*** Delete File: a.txt",
        "*** Add File: b.txt",
        "+B",
        "*** Update File: c.txt",
        "*** Move to: d.txt",
        "@@",
        "-c",
        "+C",
        "*** Update File: b.txt",
        "@@",
        " not there",
        "-B",
        "+BB",
    )
    session = pooled.open_session(workspace, tool_profile="codex")
    (failed,) = await pooled.run_turn(session, [patch_call(shape, text)])
    # Then it fails naming the hunk, and every file is as it was (context lines
    # still guard Update File)
    assert failed.is_error
    assert "Update File b.txt: hunk 1 of 1" in failed.text
    assert tree_of(workspace) == {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "d.txt": "d\n"}


async def test_F12_the_register_after_a_codex_patch(pooled: Coordinator, workspace: Path) -> None:
    # Given a codex session that adds over a file and deletes another, unread
    plant(workspace, {"x.txt": "old\n", "y.txt": "gone\n"})
    session = pooled.open_session(workspace, tool_profile="codex")
    text = patch("*** Add File: x.txt", "+new", "*** Delete File: y.txt")
    (done,) = await pooled.run_turn(session, [patch_call("apply_patch", text)])
    assert not done.is_error, done.text
    # Then the file it wrote whole is known whole (F5); the deleted one is forgotten
    stamp = session.files.get(workspace / "x.txt")
    assert stamp is not None and not stamp.partial
    assert session.files.get(workspace / "y.txt") is None
    # And a patch that updates the file it wrote applies on that knowledge
    again = patch("*** Update File: x.txt", "@@", "-new", "+newer")
    (updated,) = await pooled.run_turn(session, [patch_call("shell-argv", again)])
    assert not updated.is_error and (workspace / "x.txt").read_text() == "newer\n"


@pytest.mark.spec("F11", "X4")
@pytest.mark.parametrize("shape", ["apply_patch", "shell-argv"])
async def test_F11_without_the_guard_a_codex_patch_is_still_confined(
    pooled: Coordinator, workspace: Path, tmp_path: Path, shape: str
) -> None:
    # Given a file outside the workspace, a symlink to it inside, and a codex session
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    (workspace / "link.txt").symlink_to(outside)
    session = pooled.open_session(workspace, tool_profile="codex", max_tool_errors=0)
    attempts = [
        patch("*** Delete File: ../outside.txt"),
        patch("*** Delete File: link.txt"),
        patch("*** Add File: link.txt", "+mine"),
        patch(f"*** Add File: {outside}", "+mine"),
        patch(
            "*** Add File: in.txt",
            "+x",
            "*** Update File: in.txt",
            "*** Move to: ../o2.txt",
            "@@",
            "-x",
            "+y",
        ),
        patch(
            "*** Add File: in.txt",
            "+x",
            "*** Update File: in.txt",
            "*** Move to: link.txt",
            "@@",
            "-x",
            "+y",
        ),
    ]
    for index, text in enumerate(attempts):
        (refused,) = await pooled.run_turn(session, [patch_call(shape, text, f"p{index}")])
        # Then each is refused (paths are judged before any read rule), and nothing
        # outside, nor the link, changed
        assert refused.is_error, text
        assert "Access denied" in refused.text or "outside" in refused.text, refused.text
    assert outside.read_text() == "not yours\n"
    assert (workspace / "link.txt").is_symlink() and not (tmp_path / "o2.txt").exists()
    assert not (workspace / "in.txt").exists()
