"""The file tools through the whole pipeline: coordinator, session, turn, scheduler
(SPEC F1-F5 end to end, with M1 and P7/P8 where the tools show through)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from toolpool import ErrorCode, ImageBlock, TextBlock, ToolCall, ToolMessage, ToolResult, UpdateKind
from toolpool.engine import Coordinator, ExecutionRequest, Next
from toolpool.tools import FILE_TOOLS
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE

from .support import PNG_1X1, EventLog, RecordingGate
from .tool_support import copy_stdlib


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(call_id, name, dict(arguments))


@pytest.fixture
def app(workspace: Path) -> Path:
    path = workspace / "app.py"
    path.write_text("def main():\n    return 1\n")
    return path


@pytest.mark.spec("F1", "F2", "F3", "F5")
async def test_a_turn_reads_then_edits_the_same_file(workspace: Path, app: Path) -> None:
    # Given a coordinator with the file tools and a session on the workspace
    coordinator = Coordinator(FILE_TOOLS)
    session = coordinator.open_session(workspace)
    log = EventLog()
    # When one turn reads the file, edits it, and edits it again
    results = await coordinator.run_turn(
        session,
        [
            call("r", "read", path="app.py"),
            call("e1", "edit", path="app.py", old_string="return 1", new_string="return 2"),
            call("e2", "edit", path="app.py", old_string="def main", new_string="def run"),
        ],
        on_event=log,
    )
    # Then every call succeeded: the read stamped the file, the first edit passed F3,
    # and its renewed stamp let the second through without another read (F5)
    assert [r.is_error for r in results] == [False, False, False]
    assert await asyncio.to_thread(app.read_text) == "def run():\n    return 2\n"
    assert session.statistics().files_read == 1
    # And each edit's preview went out as a unified diff before it ran (P7)
    previews = log.updates(UpdateKind.PREVIEW)
    assert [p.call_id for p in previews] == ["e1", "e2"]
    assert "-    return 1\n+    return 2\n" in previews[0].data


@pytest.mark.spec("F3", "F4")
async def test_F4_an_edit_before_a_read_is_an_error_result_then_succeeds(
    workspace: Path, app: Path
) -> None:
    # Given a gate that records whom it is asked about
    gate = RecordingGate()
    coordinator = Coordinator(FILE_TOOLS, gate=gate)
    session = coordinator.open_session(workspace)
    edit = {"path": "app.py", "old_string": "return 1", "new_string": "return 3"}
    # When the model edits before reading, then reads, then edits again
    refused, read, accepted = await coordinator.run_turn(
        session,
        [call("1", "edit", **edit), call("2", "read", path="app.py"), call("3", "edit", **edit)],
    )
    # Then the first edit is an ordinary error result with code 2, telling it to read
    assert refused.is_error
    assert refused.error_code is ErrorCode.VALIDATION_FAILED
    assert refused.details["validation_code"] == CODE_NOT_READ
    assert "Read it first" in refused.text
    # And the user was not involved: the gate never heard of the refused edit
    assert [r.call.id for r in gate.requests] == ["2", "3"]
    assert gate.requests[1].permissions == ("write",)
    # And after the read, the same edit goes through
    assert not read.is_error
    assert not accepted.is_error
    assert await asyncio.to_thread(app.read_text) == "def main():\n    return 3\n"


@pytest.mark.spec("F3", "F4")
async def test_F4_a_partial_read_then_edit_is_refused_with_code_2(
    workspace: Path, app: Path
) -> None:
    coordinator = Coordinator(FILE_TOOLS)
    session = coordinator.open_session(workspace)
    _, refused = await coordinator.run_turn(
        session,
        [
            call("1", "read", path="app.py", limit=1),
            call("2", "edit", path="app.py", old_string="main", new_string="run"),
        ],
    )
    assert refused.is_error
    assert refused.details["validation_code"] == CODE_NOT_READ
    assert "only partly read" in refused.text


@pytest.mark.spec("F3", "F4")
async def test_F4_a_change_after_the_read_is_refused_with_code_3(
    workspace: Path, app: Path
) -> None:
    coordinator = Coordinator(FILE_TOOLS)
    session = coordinator.open_session(workspace)
    await coordinator.run_turn(session, [call("1", "read", path="app.py")])
    await asyncio.to_thread(app.write_text, "def main():\n    return 42  # the user's change\n")
    (refused,) = await coordinator.run_turn(
        session, [call("2", "write", path="app.py", content="overwritten\n")]
    )
    assert refused.is_error
    assert refused.details["validation_code"] == CODE_STALE
    assert "the user's change" in await asyncio.to_thread(app.read_text)


@pytest.mark.spec("F3", "F4")
async def test_F4_a_change_between_validate_and_execute_is_refused(
    workspace: Path, app: Path
) -> None:
    # Given a middleware that changes the file after validate passed, just before the
    # edit executes (a user saving in their editor at the worst moment)
    async def interloper(request: ExecutionRequest, call_next: Next) -> ToolResult:
        if request.call.name == "edit":
            await asyncio.to_thread(
                app.write_text, "def main():\n    return 1  # saved by the user\n"
            )
        return await call_next(request)

    coordinator = Coordinator(FILE_TOOLS, middlewares=[interloper])
    session = coordinator.open_session(workspace)
    # When the model reads, then edits
    _, edited = await coordinator.run_turn(
        session,
        [
            call("1", "read", path="app.py"),
            call("2", "edit", path="app.py", old_string="return 1", new_string="return 2"),
        ],
    )
    # Then the edit is refused at execute time with code 3, and the user's save stands
    assert edited.is_error
    assert edited.error_code is ErrorCode.EXECUTION_FAILED
    assert edited.details["validation_code"] == CODE_STALE
    assert (
        await asyncio.to_thread(app.read_text) == "def main():\n    return 1  # saved by the user\n"
    )


@pytest.mark.spec("F1", "F2")
async def test_reads_greps_globs_and_lists_run_in_one_turn(workspace: Path) -> None:
    # Given a workspace with stdlib packages and an image
    copy_stdlib(workspace, ("json", "email"))
    (workspace / "logo.png").write_bytes(PNG_1X1)
    coordinator = Coordinator(FILE_TOOLS, max_tool_concurrency=8)
    session = coordinator.open_session(workspace)
    # When one turn asks for many safe calls at once
    results = await coordinator.run_turn(
        session,
        [
            call("1", "read", path="json/__init__.py"),
            call("2", "read", path="email/utils.py", offset=10, limit=5),
            call(
                "3",
                "grep",
                pattern="class \\w+error",
                output_mode="content",
                **{"-i": True, "-C": 1},
            ),
            call("4", "glob", pattern="**/*.py", path="email"),
            call("5", "ls", path="json"),
            call("6", "read", path="logo.png"),
            call("7", "grep", pattern="import", path="json", output_mode="count"),
        ],
    )
    # Then all succeed, in the turn's order, each with its own answer
    assert [r.call_id for r in results] == ["1", "2", "3", "4", "5", "6", "7"]
    assert [r.is_error for r in results] == [False] * 7
    assert results[0].text.startswith("     1\t")
    assert results[1].text.startswith("    10\t")
    assert "json/decoder.py:" in results[2].text  # a match
    assert "json/decoder.py-" in results[2].text  # a context line
    assert "email/mime/text.py" in results[3].text.split("\n")
    assert results[4].text.startswith("json/\n  __init__.py")
    assert results[6].text.startswith("Found ")
    # And the image is a rich result: a tool message of content blocks (M1)
    message = ToolMessage.from_result(results[5])
    assert isinstance(message.content, tuple)
    assert isinstance(message.content[0], TextBlock)
    assert isinstance(message.content[1], ImageBlock)
    # And the register knows what was read, and which read was partial (F2)
    whole = session.files.get(workspace / "json" / "__init__.py")
    part = session.files.get(workspace / "email" / "utils.py")
    assert whole is not None
    assert not whole.partial
    assert part is not None
    assert part.partial
    assert len(session.files) == 3


@pytest.mark.spec("F1", "F4")
async def test_escapes_and_missing_files_are_error_results(workspace: Path) -> None:
    coordinator = Coordinator(FILE_TOOLS)
    session = coordinator.open_session(workspace)
    escape, missing = await coordinator.run_turn(
        session,
        [
            call("1", "write", path="../evil.txt", content="x"),
            call("2", "read", path="nothing.txt"),
        ],
    )
    assert escape.is_error
    assert escape.error_code is ErrorCode.VALIDATION_FAILED
    assert "Access denied" in escape.text
    assert not (workspace.parent / "evil.txt").exists()
    assert missing.is_error
    assert missing.text == "Path does not exist: nothing.txt."
