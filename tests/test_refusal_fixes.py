"""A refusal names its fix (SPEC F14): F3's code-2 refusal names the one read that
lifts it, in the spelling of the session's tool profile, worded from its code and
details — and that read, made as named, lifts it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import ErrorCode, FileReadRegister, FileReadStamp, ToolCall, ToolResult
from toolpool.adapter import Refusal
from toolpool.engine import Coordinator, Session
from toolpool.profiles.claude_code_refusals import NOT_READ, refusal
from toolpool.read_coverage import Part
from toolpool.refusals import not_read_message, unread_reason
from toolpool.tools import TOOLS
from toolpool.tools.support.stamps import CODE_NOT_READ, unread_details

pytestmark = pytest.mark.spec("F14")

LINES = 40


@pytest.fixture
def workspace_file(workspace: Path) -> Path:
    path = workspace / "mod.py"
    path.write_text("".join(f"line_{i:02d} = {i}\n" for i in range(1, LINES + 1)))
    return path


@pytest.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    coordinator = Coordinator(TOOLS)
    yield coordinator
    coordinator.close()


async def run(coordinator: Coordinator, session: Session, name: str, **args: Any) -> ToolResult:
    (result,) = await coordinator.run_turn(session, [ToolCall(f"c{name}", name, args)])
    return result


# The writes that share F3's guard, each refused before any read, in toolpool's names.
WRITES = {
    "edit": {"path": "mod.py", "old_string": "line_40 = 40", "new_string": "line_40 = -1"},
    "multi_edit": {"path": "mod.py", "edits": [{"old_string": "line_01", "new_string": "l1"}]},
    "write": {"path": "mod.py", "content": "replaced\n"},
    "apply_patch": {"input": "*** Begin Patch\n*** Delete File: mod.py\n*** End Patch"},
}


@pytest.mark.parametrize("tool", list(WRITES))
@pytest.mark.parametrize("first_read", [None, {"limit": 10}, {"offset": 5, "limit": 20}])
async def test_F14_the_named_read_lifts_the_refusal(
    coordinator: Coordinator,
    workspace: Path,
    workspace_file: Path,
    tool: str,
    first_read: dict[str, int] | None,
) -> None:
    # Given a file never read, or read in part
    session = coordinator.open_session(workspace)
    if first_read is not None:
        await run(coordinator, session, "read", path="mod.py", **first_read)
    # When a write of it is refused (code 2)
    refused = await run(coordinator, session, tool, **WRITES[tool])
    assert refused.error_code is ErrorCode.VALIDATION_FAILED
    assert refused.details["validation_code"] == CODE_NOT_READ
    # Then it names one read, in its text and its details, in toolpool's spelling
    fix = refused.details["read_first"]
    words = ", ".join(f"{k}={json.dumps(v)}" for k, v in fix.items())
    assert f"read({words})" in refused.text
    if first_read is None:
        assert fix == {"path": "mod.py"} and not refused.details["partly_read"]
    else:
        (gap, *more) = refused.details["missing_lines"]
        last = (more or [gap])[-1][1]
        offset = fix.get("offset", 1)  # left out when it is read's default
        assert (offset, offset + fix["limit"] - 1) == (gap[0], last)
    # And that read, made as named, lifts it: the same call now applies
    assert not (await run(coordinator, session, "read", **fix)).is_error
    applied = await run(coordinator, session, tool, **WRITES[tool])
    assert not applied.is_error, applied.text


async def test_F14_a_claude_code_refusal_names_its_read(
    coordinator: Coordinator, workspace: Path, workspace_file: Path
) -> None:
    # Given a Claude Code session that read lines 1-15 of the file, then edits it
    session = coordinator.open_session(workspace, tool_profile="claude-code")
    path = str(workspace_file)
    await run(coordinator, session, "Read", file_path=path, limit=15)
    edit = {"file_path": path, "old_string": "line_40 = 40", "new_string": "line_40 = -1"}
    refused = await run(coordinator, session, "Edit", **edit)
    # Then Claude Code's own sentence comes first, then the Read that lifts it, in
    # Claude Code's spelling (file_path)
    assert refused.text == (
        f"{NOT_READ}\n\nFile mod.py was only partly read: lines 16-40 of its 40 lines were "
        'never shown. Read them first: Read(file_path="mod.py", offset=16, limit=25).'
    )
    # And that Read, made as named, lifts it
    await run(coordinator, session, "Read", file_path="mod.py", offset=16, limit=25)
    assert not (await run(coordinator, session, "Edit", **edit)).is_error
    # A file never read: Claude Code's sentence, then the Read
    (workspace / "new.py").write_text("x = 1\n")
    other = await run(
        coordinator, session, "Write", file_path=str(workspace / "new.py"), content="y\n"
    )
    assert other.text == f'{NOT_READ}\n\nRead it with Read(file_path="new.py").'


def test_F14_a_profiles_words_come_from_code_and_details_never_from_toolpools_text() -> None:
    # Given a code-2 refusal's details, and any message at all beside them
    register = FileReadRegister()
    register.record("/w/a.py", _stamp(lines=10, shown=((1, 3), (7, 8))))
    details = {**unread_details("a.py", register.get("/w/a.py")), "validation_code": 2}
    worded = {
        message: refusal(Refusal(message, unread_reason(details), details), {})
        for message in ("", "Ceci n'est pas un refus.", not_read_message(details, "toolpool"))
    }
    # Then Claude Code's refusal is the same whatever the message said
    (only,) = set(worded.values())
    assert only == (
        f"{NOT_READ}\n\nFile a.py was only partly read: lines 4-6 and lines 9-10 of its 10 "
        'lines were never shown. Read them first: Read(file_path="a.py", offset=4, limit=7).'
    )
    # And toolpool's names the read as toolpool spells it; Codex's (no read tool) none
    assert not_read_message(details, "toolpool").endswith(
        'Read them first: read(path="a.py", offset=4, limit=7).'
    )
    assert not_read_message(details, "codex") == (
        "File a.py was only partly read: lines 4-6 and lines 9-10 of its 10 lines were never shown."
    )
    # A file whose lines were never counted (a PDF's pages): the whole read
    register.record("/w/b.pdf", FileReadStamp(1.0, 1, 9, "p"))
    pdf = unread_details("b.pdf", register.get("/w/b.pdf"))
    assert pdf == {"partly_read": True, "read_first": {"path": "b.pdf"}}
    assert not_read_message(pdf).endswith('Read it first: read(path="b.pdf").')


@pytest.mark.spec("F14", "E4")
@pytest.mark.parametrize(
    "name", ['say "hi".py', "two\nlines.py", "back\\slash.py", "bidi\u202etxt.py"]
)
async def test_F14_a_hostile_file_name_cannot_break_out_of_the_named_call(
    coordinator: Coordinator, workspace: Path, name: str
) -> None:
    # Given a file whose name holds a quote, a newline, a backslash or a bidi control
    (workspace / name).write_text("x = 1\n")
    session = coordinator.open_session(workspace)
    refused = await run(coordinator, session, "write", path=name, content="y\n")
    # Then the refusal is one line, with no raw control or bidi character, and the
    # named call's path is a string literal that reads back as the file's name
    assert "\n" not in refused.text and "\u202e" not in refused.text
    literal = refused.text.rpartition("read(path=")[2].removesuffix(").")
    assert json.loads(literal) == name
    # And the read its details name, made, lifts it
    assert not (await run(coordinator, session, "read", **refused.details["read_first"])).is_error
    assert not (await run(coordinator, session, "write", path=name, content="y\n")).is_error


@pytest.mark.spec("F14", "P6", "P11")
async def test_F14_the_refusal_still_counts_for_the_breaker(
    coordinator: Coordinator, workspace: Path, workspace_file: Path
) -> None:
    # Given three edits of an unread file in a row (max_tool_errors = 3)
    session = coordinator.open_session(workspace)
    edit = WRITES["edit"]
    for n in range(3):
        refused = await run(coordinator, session, "edit", **edit)
        assert refused.details["validation_code"] == CODE_NOT_READ
        assert session.breaker.failures("edit") == n + 1
    # Then the breaker opens: a model that does not follow the named read is stopped
    blocked = await run(coordinator, session, "edit", **edit)
    assert blocked.error_code is ErrorCode.BREAKER_OPEN


def _stamp(*, lines: int, shown: tuple[tuple[int, int], ...]) -> FileReadStamp:
    parts = tuple(Part(1.0 + i, a, b, f"c{i}") for i, (a, b) in enumerate(shown))
    return FileReadStamp(1.0, 1, 9, "h", lines, parts)
