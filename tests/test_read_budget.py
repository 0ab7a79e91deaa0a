"""A read cut by its turn's share says where it stopped, and the reads of a turn add up
(SPEC L4, F2, F13, F14).

The L4 cut of a text read keeps whole numbered lines from the start, no tail; its
note and details name the lines shown and the read of the rest; the register counts
only the lines kept. Then the replay of the pattern that broke editing: four large
files read side by side under the default budget, then edited — through real
workers, with every edit applied after one more read turn and the breaker shut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import ErrorCode, TextBlock, ToolCall, ToolResult, tools_in_module
from toolpool.engine import Coordinator
from toolpool.engine.budget import DEFAULT_TURN_OUTPUT_CHARS, OutputShare
from toolpool.engine.line_cut import cut, plan
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.tools import TOOLS
from toolpool.tools.support.stamps import CODE_NOT_READ

pytestmark = pytest.mark.spec("L4")


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, name, dict(arguments))


def source(module: int, lines: int) -> str:
    """A Python module of ``lines`` lines, about 55 characters each: like click's
    ``core.py`` and attrs' ``_make.py``, whose first 2,000 numbered lines are over a
    quarter of the default budget."""
    out = [f'"""Module {module}."""\n']
    for i in range(1, lines):
        if i % 6 == 1:
            out.append(f"def handler_{module}_{i:05d}(context, value, option=None):\n")
        elif i % 6 == 0:
            out.append("\n")
        else:
            out.append(f"    result_{i:05d} = context.apply(value, option, step={i})\n")
    return "".join(out)


def last_step(lines: int) -> str:
    """The text of the last ``result`` line of ``source(_, lines)``."""
    i = next(i for i in range(lines - 1, 0, -1) if i % 6 not in (0, 1))
    return f"step={i})"


def numbered_lines(text: str, first: int, last: int) -> str:
    lines = text.splitlines()[first - 1 : last]
    return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, start=first))


@pytest.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    coordinator = Coordinator(TOOLS, turn_output_chars=60_000)
    yield coordinator
    coordinator.close()


async def test_L4_a_cut_read_keeps_whole_lines_from_the_start_and_says_where_it_stopped(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given a 1,500-line file (81,000 characters read) read beside another call: a
    # share of 30,000 characters
    content = source(1, 1_500)
    (workspace / "big.py").write_text(content)
    (workspace / "small.py").write_text("x = 1\n")
    session = coordinator.open_session(workspace)
    big, _ = await coordinator.run_turn(
        session, [call("1", "read", path="big.py"), call("2", "read", path="small.py")]
    )
    # Then its text is its first lines, whole and numbered, then one note: no tail
    first, last = big.details["lines_shown"]
    body, _, note = big.text.rpartition("\n\n")
    assert first == 1 and 300 < last < 1_500
    assert body == numbered_lines(content, 1, last)
    assert len(big.text) <= 30_000
    # The note says which lines were shown and names the read of the rest
    rest = f'read(path="big.py", offset={last + 1}, limit={1_500 - last}) shows the rest.'
    assert note.startswith(f"[Lines 1-{last} of 1500 shown: this call's share of the turn's")
    assert rest in note and note.endswith("(reads of parts of it add up).]")
    # The details say the same for programs; no spill file is written
    assert big.details["next_offset"] == last + 1
    assert big.details["total_lines"] == 1_500
    assert big.details["output_cut"]["spill_file"] is None
    assert big.details["output_cut"]["partly_read"] == ["big.py"]
    assert not (session.scratch_dir / "output").exists()
    # And the register counts the lines kept: the edit's refusal names the rest
    edit = call("3", "edit", path="big.py", old_string=last_step(1_500), new_string="step=0)")
    (refused,) = await coordinator.run_turn(session, [edit])
    assert refused.details["validation_code"] == CODE_NOT_READ
    assert refused.details["missing_lines"] == [[last + 1, 1_500]]
    # And the read it names, alone in its turn, fits and makes the file whole
    (more,) = await coordinator.run_turn(
        session, [call("4", "read", path="big.py", offset=last + 1, limit=1_500 - last)]
    )
    assert "output_cut" not in more.details
    (edited,) = await coordinator.run_turn(session, [edit])
    assert not edited.is_error, edited.text


async def test_L4_a_cut_takes_back_only_its_own_read(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given a file read whole alone in a turn (every line shown)
    (workspace / "big.py").write_text(source(2, 1_000))
    (workspace / "small.py").write_text("x = 1\n")
    session = coordinator.open_session(workspace)
    await coordinator.run_turn(session, [call("1", "read", path="big.py")])
    # When it is read again beside another call, and that read is cut
    again, _ = await coordinator.run_turn(
        session, [call("2", "read", path="big.py"), call("3", "read", path="small.py")]
    )
    assert "output_cut" in again.details
    # Then it still counts as read whole: its lines were all shown, by the first read
    assert again.details["output_cut"]["partly_read"] == []
    stamp = session.files.get(workspace / "big.py")
    assert stamp is not None and not stamp.partial


@pytest.mark.spec("L4", "F12")
async def test_L4_the_cut_note_names_the_rest_as_the_profile_spells_it(
    coordinator: Coordinator, workspace: Path
) -> None:
    (workspace / "big.py").write_text(source(3, 1_500))
    session = coordinator.open_session(workspace, tool_profile="claude-code")
    cut_read, _ = await coordinator.run_turn(
        session,
        [
            call("1", "Read", file_path=str(workspace / "big.py")),
            call("2", "Glob", pattern="*.py"),
        ],
    )
    last = cut_read.details["lines_shown"][1]
    call_text = f'Read(file_path="big.py", offset={last + 1}, limit={1_500 - last})'
    assert f"{call_text} shows the rest." in cut_read.text


def test_L4_the_cut_fits_its_share_and_keeps_a_prefix_at_any_size() -> None:
    # Given a read's result of 400 numbered lines (one of them long), with its note
    content = source(4, 400).replace("step=200)", "step=200)" + "#" * 1_900)
    text = numbered_lines(content, 1, 400)
    details = {"path": "m.py", "lines_shown": [1, 400], "total_lines": 900, "next_offset": 401}
    result = ToolResult("c", "read", (TextBlock(f"{text}\n\n[Lines 1-400 of 900 shown.]"),))
    result = ToolResult("c", "read", result.content, details=details)
    for chars in (1, 100, 300, 301, 2_000, 11_000, 11_900, 12_100, 20_000, len(text) + 100):
        share = OutputShare(chars, 4 * chars)
        line_cut = plan(result, share, "toolpool")
        assert line_cut is not None
        done = cut(result, share, line_cut, ["m.py"])
        kept = line_cut.kept_last
        # Then the text is whole lines from the first, then the note; it fits the
        # share unless the share is smaller than the note (the note alone then)
        head, _, note = done.text.rpartition("\n\n")
        assert head == (numbered_lines(content, 1, kept) if kept else "")
        assert note.startswith("[") and note.endswith("]")
        assert len(done.text) <= chars or kept == 0
        assert done.details.get("lines_shown") == ([1, kept] if kept else None)
        assert done.details["next_offset"] == kept + 1
        assert done.details["total_lines"] == 900
        # And no room was wasted: one more line would not have fitted
        if 0 < kept < 400:
            longer = numbered_lines(content, 1, kept + 1)
            assert len(longer) + 2 + len(note) > chars - 4 * len("900")


def test_L4_a_result_that_only_claims_to_be_a_read_is_cut_as_any_other() -> None:
    # Given results a tool could return with read's details but not read's text
    share = OutputShare(1_000, 4_000)
    claims = [
        ("one line, no newline: " + "x" * 3_000, {"lines_shown": [1, 50], "total_lines": 50}),
        ("a\nb\n" * 1_000, {"lines_shown": [1, "2"], "total_lines": 9}),
        ("a\nb\n" * 1_000, {"lines_shown": [5, 2], "total_lines": 9}),
        ("a\nb\n" * 1_000, {"lines_shown": [1, 20], "total_lines": 10}),
        ("a\nb\n" * 1_000, {"lines_shown": [True, 2], "total_lines": 9}),
    ]
    for text, details in claims:
        result = ToolResult("c", "t", (TextBlock(text),), details={"path": "p", **details})
        # Then no line cut is planned (the usual head-and-tail cut applies)
        assert plan(result, share, "toolpool") is None
    # Nor for an error, or a result without a path
    lines = "\n".join(f"{n:>6}\tx" for n in range(1, 501))
    ok = {"path": "p", "lines_shown": [1, 500], "total_lines": 500}
    error = ToolResult("c", "read", (TextBlock(lines),), True, ErrorCode.EXECUTION_FAILED, ok)
    assert plan(error, share, "toolpool") is None
    pathless = ToolResult("c", "read", (TextBlock(lines),), details={**ok, "path": None})
    assert plan(pathless, share, "toolpool") is None


# --- the replay: four large files read side by side, then edited -------------------------


@pytest.fixture
async def pooled() -> AsyncIterator[Coordinator]:
    config = PoolConfig(min_workers=2, max_workers=2, tool_modules=("toolpool.tools",))
    async with WorkerPool(config) as pool:
        coordinator = Coordinator(tools_in_module("toolpool.tools"), executor=PoolExecutor(pool))
        yield coordinator
        coordinator.close()


@pytest.mark.spec("L4", "F2", "F13", "P2")
async def test_L4_four_large_files_read_side_by_side_then_edited(
    pooled: Coordinator, workspace: Path
) -> None:
    # Given four modules of 100-150 KB, as a model meets click's core.py and attrs'
    # _make.py, and a session under the default budget (a share of 100,000 each)
    sizes = {"core.py": 3_000, "types.py": 2_200, "make.py": 2_400, "testing.py": 2_600}
    for index, (name, lines) in enumerate(sizes.items()):
        (workspace / name).write_text(source(index, lines))
        assert 100_000 <= (workspace / name).stat().st_size <= 150_000
    assert pooled.turn_output_chars == DEFAULT_TURN_OUTPUT_CHARS
    session = pooled.open_session(workspace)
    turns: list[list[ToolResult]] = []

    async def turn(calls: list[ToolCall]) -> list[ToolResult]:
        turns.append(list(await pooled.run_turn(session, calls)))
        return turns[-1]

    # When the model reads the four side by side (turn 1): each is cut, by its share
    # or its limit, and says where it stopped
    reads = await turn([call(f"r{i}", "read", path=name) for i, name in enumerate(sizes)])
    cut_by_share = [r for r in reads if "output_cut" in r.details]
    assert len(cut_by_share) >= 3
    assert all(r.details["next_offset"] <= sizes[r.details["path"]] for r in reads)
    # And reads the rest of each as the details say (turn 2), side by side too
    rests = await turn(
        [
            call(
                f"m{i}",
                "read",
                path=r.details["path"],
                offset=r.details["next_offset"],
                limit=r.details["total_lines"] - r.details["next_offset"] + 1,
            )
            for i, r in enumerate(reads)
        ]
    )
    assert all("next_offset" not in r.details for r in rests), [r.details for r in rests]
    # Then edits of each (turn 3), at their ends and their starts, all apply
    edits = []
    for i, (name, lines) in enumerate(sizes.items()):
        tail = last_step(lines)
        edits.append(call(f"e{i}", "edit", path=name, old_string=tail, new_string="step=-1)"))
        edits.append(
            call(
                f"h{i}",
                "edit",
                path=name,
                old_string=f'"""Module {i}."""',
                new_string=f'"""M{i}."""',
            )
        )
    done = await turn(edits)
    assert [r.is_error for r in done] == [False] * len(edits), [r.text for r in done if r.is_error]
    for i, (name, lines) in enumerate(sizes.items()):
        text = (workspace / name).read_text()
        assert text.startswith(f'"""M{i}."""') and last_step(lines) not in text
    # And no call of any turn was refused, so the breaker never opened
    every = [r for results in turns for r in results]
    assert not any(r.is_error for r in every)
    assert not any(r.error_code is ErrorCode.BREAKER_OPEN for r in every)
    assert session.breaker.statistics().failures == {}


@pytest.mark.spec("L4", "F14", "P2")
async def test_L4_an_edit_made_too_early_names_the_one_read_that_lifts_it(
    pooled: Coordinator, workspace: Path
) -> None:
    # Given two large files read side by side, cut, and edited at once (too early)
    sizes = {"core.py": 2_700, "make.py": 1_900}
    for index, (name, lines) in enumerate(sizes.items()):
        (workspace / name).write_text(source(index, lines))
    session = pooled.open_session(workspace, turn_output_chars=150_000)
    await pooled.run_turn(
        session, [call(f"r{i}", "read", path=name) for i, name in enumerate(sizes)]
    )
    edits = [
        call(f"e{i}", "edit", path=name, old_string=last_step(lines), new_string="step=-1)")
        for i, (name, lines) in enumerate(sizes.items())
    ]
    refused = await pooled.run_turn(session, edits)
    # Then each refusal (code 2) names the read of exactly the lines never shown
    fixes = []
    for result in refused:
        assert result.details["validation_code"] == CODE_NOT_READ
        fix = result.details["read_first"]
        (gap,) = result.details["missing_lines"]
        assert (fix["offset"], fix["offset"] + fix["limit"] - 1) == tuple(gap)  # not line 1
        named = f'read(path="{fix["path"]}", offset={fix["offset"]}, limit={fix["limit"]})'
        assert named in result.text
        fixes.append(call(f"f{fix['path']}", "read", **fix))
    # And one turn of those reads lifts them: the edits apply, the breaker shut
    assert not any(r.is_error for r in await pooled.run_turn(session, fixes))
    assert not any(r.is_error for r in await pooled.run_turn(session, edits))
    assert session.breaker.statistics().failures == {}
