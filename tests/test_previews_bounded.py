"""The daemon's own work bounded, tried by an attacker (SPEC L10, L11): a tool's
validate and preview run in the call's worker under its limits, never in the daemon;
a preview is cut at its cap and says so; an edit's size is known before it is built.

The attacks are the ones that once cost the daemon a gigabyte and every session a
minute: a 220-byte multi_edit that multiplies a file, a preview that sleeps or
allocates, one that talks without end, and a notebook of thousands of cells.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

from toolpool import Client, ToolCall
from toolpool.client import ApprovalRequested
from toolpool.engine import Coordinator
from toolpool.engine.executor import ExecutionRequest
from toolpool.errors import ToolError
from toolpool.models import ErrorCode, ToolResult, ToolStart, ToolUpdate, UpdateKind
from toolpool.preflight import PREVIEW_CHARS, capped, cut_note
from toolpool.sandbox.limits import Limits
from toolpool.tool import Preview
from toolpool.tools import edit_tool
from toolpool.tools.multi_edit import multi_edit_tool

from .daemon_support import Daemon, shared_daemon
from .support import Probe
from .tool_support import read_whole, tool_context

MODULES = ("--tool-modules", "tests.hostile_tools")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("previews")
    with shared_daemon(tmp, *MODULES, "--min-workers", "2", "--max-workers", "2") as daemon:
        yield daemon


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as client:
        yield client


def pids_of(daemon: Daemon) -> tuple[int, set[int]]:
    """The daemon's pid, and its workers' (the zygote's children)."""
    workers = {p.pid for p in psutil.Process(daemon.pid).children(recursive=True)}
    return daemon.pid, workers


def mark(marks: Path, step: str) -> int | None:
    path = Path(f"{marks}.{step}")
    return int(path.read_text()) if path.exists() else None


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30  # a hang guard, not a measure
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


# --- L10: where validate and preview run ------------------------------------------------


@pytest.mark.spec("L10", "P7")
def test_L10_validate_and_preview_run_in_the_calls_worker_in_one_dispatch(
    daemon: Daemon, client: Client, workspace: Path, tmp_path: Path
) -> None:
    # Given a session with no gate, and a tool whose every step says where it ran
    marks = tmp_path / "bomb"
    with client.session(workspace) as session:
        turn = session.submit([ToolCall("b", "preview_bomb", {"marks": str(marks)})])
        (result,) = turn.results()
        events = turn.events
    assert result.text == "executed"
    daemon_pid, workers = pids_of(daemon)
    # Then validate, preview and execute all ran in one worker: one dispatch
    ran = {step: mark(marks, step) for step in ("validate", "preview", "execute")}
    assert len(set(ran.values())) == 1, ran
    assert ran["preview"] != daemon_pid and ran["preview"] in workers
    # And the preview's tool_update came before the tool executed (its progress)
    kinds = [
        e.kind if isinstance(e, ToolUpdate) else type(e).__name__
        for e in events
        if isinstance(e, ToolStart | ToolUpdate)
    ]
    assert kinds == ["ToolStart", UpdateKind.PREVIEW, UpdateKind.PROGRESS]


@pytest.mark.spec("L10", "P7", "P8")
def test_L10_under_a_gate_the_preview_is_made_in_a_worker_before_the_approval(
    daemon: Daemon, client: Client, workspace: Path, tmp_path: Path
) -> None:
    marks = tmp_path / "bomb"
    seen: list[str] = []

    def approve(request: ApprovalRequested) -> bool:
        # The preview was made before the gate asked, and not by the daemon
        assert mark(marks, "preview") is not None and mark(marks, "execute") is None
        seen.append(request.preview)
        return True

    with client.session(workspace, gate="ask", on_approval=approve) as session:
        turn = session.submit([ToolCall("b", "preview_bomb", {"marks": str(marks)})])
        (result,) = turn.results()
        previews = [
            e.data for e in turn.events if isinstance(e, ToolUpdate) and e.kind == "preview"
        ]
    assert result.text == "executed"
    assert seen == previews == ["p\n"]
    daemon_pid, workers = pids_of(daemon)
    for step in ("validate", "preview", "execute"):
        pid = mark(marks, step)
        assert pid != daemon_pid and pid in workers, (step, pid)


@pytest.mark.spec("L10")
def test_L10_a_preview_that_takes_its_time_stalls_no_other_session(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    # Given one session whose call's preview sleeps (a preview that costs what its
    # input asks: a diff of a huge file, a parse of a huge notebook)
    (workspace / "small.txt").write_text("hello\n")
    marks = tmp_path / "slow"
    with client.session(workspace) as slow, client.session(workspace) as other:
        turn = slow.submit([ToolCall("s", "preview_bomb", {"marks": str(marks), "sleep": 60})])
        wait_for(Path(f"{marks}.preview"))
        # When another session reads while that preview runs
        (read,) = other.submit([ToolCall("r", "read", {"path": "small.txt"})]).results()
        # Then the read is done, the preview still running, its tool not executed
        assert not read.is_error and "hello" in read.text
        assert mark(marks, "execute") is None
        slow.abort()
        (stopped,) = turn.results()
    assert stopped.error_code is ErrorCode.CANCELLED
    assert mark(marks, "execute") is None


@pytest.mark.spec("L10", "X7")
def test_L10_a_preview_that_allocates_meets_the_calls_memory_limit(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    marks = tmp_path / "greedy"
    limits = {"memory_bytes": 128 * 1024 * 1024}
    with client.session(workspace, limits=limits) as session:
        greedy = {"marks": str(marks), "allocate": 512 * 1024 * 1024}
        (result,) = session.submit([ToolCall("g", "preview_bomb", greedy)]).results()
        # The session goes on: the next call is served
        (after,) = session.submit([ToolCall("n", "ls", {})]).results()
    assert result.error_code is ErrorCode.LIMIT_EXCEEDED, result.text
    assert "memory" in result.text
    assert mark(marks, "execute") is None
    assert not after.is_error


@pytest.mark.spec("L10", "P8")
def test_L10_a_preview_over_its_cap_is_cut_and_the_approval_says_so(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    asked: list[ApprovalRequested] = []

    def approve(request: ApprovalRequested) -> bool:
        asked.append(request)
        return True

    args = {"marks": str(tmp_path / "chatty"), "chars": 3 * PREVIEW_CHARS}
    with client.session(workspace, gate="ask", on_approval=approve) as session:
        turn = session.submit([ToolCall("c", "preview_bomb", args)])
        (result,) = turn.results()
        (preview,) = [e.data for e in turn.events if isinstance(e, ToolUpdate)][:1]
    assert result.text == "executed"
    assert len(preview) <= PREVIEW_CHARS + len(cut_note())
    assert preview.endswith(cut_note())
    assert [r.preview_truncated for r in asked] == [True]
    assert asked[0].preview == preview


@pytest.mark.spec("L10", "L11", "F10")
def test_L10_the_220_byte_multi_edit_ends_bounded_and_the_file_is_unchanged(
    client: Client, workspace: Path
) -> None:
    # The attacker's repro: 100,000 × "a", read; then two replace_all edits that
    # make it 10 MB, then 200 MB — under a file size limit of 64 MB
    target = workspace / "a.txt"
    target.write_text("a" * 100_000)
    edits = [
        {"old_string": "a", "new_string": "b" * 100, "replace_all": True},
        {"old_string": "b", "new_string": "cc" * 10, "replace_all": True},
    ]
    limits = {"file_size_bytes": 64 * 1024 * 1024}
    with client.session(workspace, limits=limits) as session:
        session.submit([ToolCall("r", "read", {"path": "a.txt"})]).results()
        (result,) = session.submit(
            [ToolCall("m", "multi_edit", {"path": "a.txt", "edits": edits})]
        ).results()
    assert result.error_code is ErrorCode.LIMIT_EXCEEDED, result.text
    assert result.text.startswith("edits[1]: The edit would make a.txt 200,000,000 bytes")
    assert "file_size_bytes" in result.text
    assert target.read_text() == "a" * 100_000


@pytest.mark.spec("L10", "F7")
def test_L10_a_big_notebooks_preview_is_its_cells_diff(client: Client, workspace: Path) -> None:
    # Given a notebook of 20,000 cells (a 2 MB notebook once stalled the daemon ~2 s)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(f"cell {n}", id=f"m{n}") for n in range(20_000)]
    nbformat.write(nb, workspace / "big.ipynb")
    with client.session(workspace, turn_output_chars=0) as session:
        (read,) = session.submit([ToolCall("r", "read", {"path": "big.ipynb"})]).results()
        assert not read.is_error
        edit = {"path": "big.ipynb", "cell_id": "m0", "new_source": "changed"}
        turn = session.submit([ToolCall("e", "notebook_edit", edit)])
        (result,) = turn.results()
        (preview,) = [e.data for e in turn.events if isinstance(e, ToolUpdate)]
    assert not result.is_error, result.text
    assert preview == (
        "--- a/big.ipynb#m0\n+++ b/big.ipynb#m0\n@@ -1 +1 @@\n"
        "-cell 0\n\\ No newline at end of file\n+changed\n\\ No newline at end of file\n"
    )
    assert nbformat.read(workspace / "big.ipynb", as_version=4).cells[0].source == "changed"


# --- L11: the size of a change, before it is built ----------------------------------------


@pytest.mark.spec("L11")
def test_L11_an_edit_asking_for_a_hundred_gigabytes_is_refused_before_it_is_built(
    workspace: Path,
) -> None:
    # 100,000 × "a", each to become a million "b": 10^11 bytes. Built first, this
    # would be a MemoryError (or the machine's memory); refused first, it is a line.
    ctx = tool_context(workspace)
    (workspace / "a.txt").write_text("a" * 100_000)
    read_whole(ctx, "a.txt")
    args = {"path": "a.txt", "old_string": "a", "new_string": "b" * 1_000_000, "replace_all": True}
    for step in (edit_tool.preview, edit_tool.execute):
        with pytest.raises(ToolError) as refused:
            step(args, ctx)
        assert refused.value.code == ErrorCode.LIMIT_EXCEEDED.value
        assert "100,000,000,000 bytes" in refused.value.message
        assert f"{Limits().file_size_bytes:,} bytes (file_size_bytes)" in refused.value.message
    assert (workspace / "a.txt").read_text() == "a" * 100_000


@pytest.mark.spec("L11", "F10")
def test_L11_each_step_of_a_multi_edit_is_sized_before_it_is_built(workspace: Path) -> None:
    # The first step is fine (1 MB); the second would be 10^12 bytes: named by its
    # index, refused before its text exists, nothing written
    limits = Limits(file_size_bytes=8 * 1024 * 1024)
    ctx = dataclasses.replace(tool_context(workspace), limits=limits)
    (workspace / "a.txt").write_text("a" * 10_000)
    read_whole(ctx, "a.txt")
    edits = [
        {"old_string": "a", "new_string": "b" * 100, "replace_all": True},
        {"old_string": "b", "new_string": "c" * 1_000_000, "replace_all": True},
    ]
    with pytest.raises(ToolError) as refused:
        multi_edit_tool.execute({"path": "a.txt", "edits": edits}, ctx)
    assert refused.value.code == ErrorCode.LIMIT_EXCEEDED.value
    assert refused.value.message.startswith(
        "edits[1]: The edit would make a.txt 1,000,000,000,000 bytes, more than the file "
        "size limit of 8,388,608 bytes (file_size_bytes); nothing was changed."
    )
    assert (workspace / "a.txt").read_text() == "a" * 10_000


@pytest.mark.spec("L11")
def test_L11_the_size_counts_the_files_encoding_and_line_endings(workspace: Path) -> None:
    # A CRLF file: each "\n" of new_string is two bytes on disk, "é" two in UTF-8
    (workspace / "w.txt").write_bytes(b"x\r\n" * 10)
    args = {"path": "w.txt", "old_string": "x", "new_string": "é\n", "replace_all": True}
    size = 30 + 10 * (len("é\r\n".encode()) - 1)
    tight = dataclasses.replace(tool_context(workspace), limits=Limits(file_size_bytes=size - 1))
    read_whole(tight, "w.txt")
    with pytest.raises(ToolError, match=f"would make w.txt {size} bytes"):
        edit_tool.execute(args, tight)
    # One byte more, and it is written: exactly that size
    edit_tool.execute(args, dataclasses.replace(tight, limits=Limits(file_size_bytes=size)))
    assert len((workspace / "w.txt").read_bytes()) == size


# --- the rules of a preview, and the order of the steps ---------------------------------------


@pytest.mark.spec("L10")
@pytest.mark.parametrize(
    ("preview", "sent", "truncated"),
    [
        ("short\n", "short\n", False),
        (Preview("a diff\n", truncated=True), "a diff\n", True),
        ("x\n" * PREVIEW_CHARS, "x\n" * (PREVIEW_CHARS // 2) + cut_note(), True),
        ({"rows": [1, 2]}, {"rows": [1, 2]}, False),
        # A text a diff cut ends with the note: the flag follows it
        ("--- a/f\n" + cut_note(), "--- a/f\n" + cut_note(), True),
    ],
)
def test_L10_a_preview_is_capped_and_flagged(preview: Any, sent: Any, truncated: bool) -> None:
    assert capped(preview) == (sent, truncated)


@pytest.mark.spec("L10")
def test_L10_a_json_value_over_the_cap_becomes_its_json_cut() -> None:
    value, truncated = capped({"k": "v" * (2 * PREVIEW_CHARS)})
    assert truncated and isinstance(value, str)
    assert value.startswith('{"k": "vvv') and value.endswith(cut_note())


@pytest.mark.spec("L10", "P6", "P10")
async def test_L10_a_middleware_comes_after_validate_and_preview(workspace: Path) -> None:
    # Given a middleware that short-circuits every execution: it must still come
    # after P6 and P7, so a call its tool refuses ends refused, not short-circuited
    order: list[str] = []

    async def short_circuit(request: ExecutionRequest, call_next: Any) -> ToolResult:
        order.append("middleware")
        return ToolResult(request.call.id, request.call.name, ())

    probe = Probe()
    coordinator = Coordinator([probe], middlewares=[short_circuit])
    session = coordinator.open_session(workspace)
    refused, passed = await coordinator.run_turn(
        session,
        [
            ToolCall("1", "probe", {"path": "a", "fail": "validate"}),
            ToolCall("2", "probe", {"path": "b"}),
        ],
    )
    coordinator.close()
    assert refused.error_code is ErrorCode.VALIDATION_FAILED
    assert not passed.is_error
    assert [step for step, _ in probe.log] == ["validate", "validate", "preview"]
    assert order == ["middleware"]


@pytest.mark.spec("L10", "P7")
async def test_L10_in_process_one_dispatch_keeps_the_order_of_the_steps(workspace: Path) -> None:
    probe = Probe()
    coordinator = Coordinator([probe])
    session = coordinator.open_session(workspace)
    events: list[Any] = []
    (result,) = await coordinator.run_turn(
        session, [ToolCall("1", "probe", {"path": "a"})], on_event=events.append
    )
    coordinator.close()
    assert not result.is_error
    assert [step for step, _ in probe.log] == ["validate", "preview", "execute"]
    updates = [e.kind for e in events if isinstance(e, ToolUpdate)]
    assert updates == [UpdateKind.PREVIEW, UpdateKind.PROGRESS, UpdateKind.PROGRESS]
