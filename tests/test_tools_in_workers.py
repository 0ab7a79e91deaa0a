"""The built-in tools in real worker processes: the file-read register's stamps cross
to the worker with each call and come back (SPEC F2, F3, F5 across D1/D2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from toolpool import ErrorCode, ToolCall, tools_in_module
from toolpool.engine import Coordinator
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE


@pytest.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    config = PoolConfig(min_workers=2, max_workers=2, tool_modules=("toolpool.tools",))
    async with WorkerPool(config) as pool:
        coordinator = Coordinator(tools_in_module("toolpool.tools"), executor=PoolExecutor(pool))
        yield coordinator
        coordinator.close()


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(call_id, name, dict(arguments))


@pytest.mark.spec("F2", "F3", "F5", "D1")
async def test_read_then_edit_across_worker_processes(
    coordinator: Coordinator, workspace: Path
) -> None:
    target = workspace / "app.py"
    target.write_text("x = 1\n")
    session = coordinator.open_session(workspace)
    # An edit before any read is refused by validate in the coordinator (F3, code 2)
    (refused,) = await coordinator.run_turn(
        session, [call("e0", "edit", path="app.py", old_string="1", new_string="2")]
    )
    assert refused.details["validation_code"] == CODE_NOT_READ
    # A read in one worker, then edits in (possibly) another: the stamp the read
    # recorded in its worker came back to the session, and travels to the editors
    results = await coordinator.run_turn(
        session,
        [
            call("r", "read", path="app.py"),
            call("e1", "edit", path="app.py", old_string="x = 1", new_string="x = 2"),
            call("e2", "edit", path="app.py", old_string="x = 2", new_string="x = 3"),
        ],
    )
    assert [r.is_error for r in results] == [False, False, False], [r.text for r in results]
    assert target.read_text() == "x = 3\n"
    assert {r.details["worker"] for r in results} <= {"w1", "w2"}
    stamp = session.files.get(target)
    assert stamp is not None
    assert not stamp.partial  # F5: renewed by the last edit, in its worker
    # The file changes behind the session's back: refused (F3, code 3)
    target.write_text("x = 99\n")
    (stale,) = await coordinator.run_turn(
        session, [call("e3", "edit", path="app.py", old_string="99", new_string="4")]
    )
    assert stale.error_code is ErrorCode.VALIDATION_FAILED
    assert stale.details["validation_code"] == CODE_STALE


@pytest.mark.spec("F1")
async def test_every_builtin_runs_in_a_worker(coordinator: Coordinator, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("import os\nprint(os.getcwd())\n")
    session = coordinator.open_session(workspace)
    results = await coordinator.run_turn(
        session,
        [
            call("1", "glob", pattern="**/*.py"),
            call("2", "grep", pattern="import", output_mode="content"),
            call("3", "ls"),
            call("4", "read", path="src/a.py"),
            call("5", "write", path="src/b.py", content="print('b')\n"),
            call("6", "bash", command="python3 src/b.py && ls src"),
        ],
    )
    assert [r.is_error for r in results] == [False] * 6, [r.text for r in results]
    assert results[0].text.splitlines()[0] == "src/a.py"
    assert "src/a.py:1:import os" in results[1].text
    assert "src/" in results[2].text
    assert results[5].text == "b\na.py\nb.py\nExit code: 0"


@pytest.mark.spec("F2", "F3", "D1")
async def test_a_stamp_is_for_the_file_read_not_for_whatever_its_path_names_later(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given a file read through a directory, in a worker
    (workspace / "d").mkdir()
    (workspace / "d" / "a.py").write_text("x = 1\n")
    (workspace / "other").mkdir()
    (workspace / "other" / "a.py").write_text("x = 1\n")  # the same bytes, another file
    session = coordinator.open_session(workspace)
    (read,) = await coordinator.run_turn(session, [call("r", "read", path="d/a.py")])
    assert not read.is_error, read.text
    # When the directory is swapped for a link to another, where a file of that name is
    (workspace / "d" / "a.py").unlink()
    (workspace / "d").rmdir()
    (workspace / "d").symlink_to("other")
    (edit,) = await coordinator.run_turn(
        session, [call("e", "edit", path="d/a.py", old_string="x = 1", new_string="x = 2")]
    )
    # Then the edit is refused as of a file never read, and nothing is written: the
    # stamps travel under the real path they were taken of, in the coordinator and in
    # the worker alike
    assert edit.details.get("validation_code") == CODE_NOT_READ, edit.text
    assert (workspace / "other" / "a.py").read_text() == "x = 1\n"
