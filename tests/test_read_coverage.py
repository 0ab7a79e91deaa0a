"""Reads that add up (SPEC F13) and what a text read says of the lines it showed (F2).

The register records, per file and content token, which lines the session was shown:
parts of one content add up to a whole read, a change between them starts over, and
a part of a whole-shown content leaves it whole. Each case is driven through the
``read`` tool and checked by what ``edit`` then does (F3), the way a model meets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolpool import FileReadRegister, FileReadStamp, ToolCall, ToolContext
from toolpool.engine import Coordinator
from toolpool.file_reads import RecordingRegister, apply_changes, content_hash
from toolpool.read_coverage import MAX_PARTS, Part, covers, missing, narrowed
from toolpool.tools import TOOLS, edit_tool, read_tool
from toolpool.tools.support.stamps import CODE_NOT_READ

from .tool_support import text, tool_context

pytestmark = pytest.mark.spec("F13")

LINES = 30


@pytest.fixture
def target(workspace: Path) -> Path:
    path = workspace / "code.py"
    path.write_text("".join(f"value_{i:02d} = {i}\n" for i in range(1, LINES + 1)))
    return path


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return tool_context(workspace)


def read(ctx: ToolContext, offset: int = 1, limit: int | None = None, call: str = "c") -> Any:
    """A read of code.py as call ``call`` (each read a call of its own)."""
    args: dict[str, Any] = {"path": "code.py", "offset": offset}
    if limit is not None:
        args["limit"] = limit
    ctx.call_id = call
    return read_tool.execute(args, ctx)


def may_edit(ctx: ToolContext) -> bool:
    verdict = edit_tool.validate(
        {"path": "code.py", "old_string": "value_01", "new_string": "v"}, ctx
    )
    assert verdict.ok or verdict.code == CODE_NOT_READ, verdict.message
    return verdict.ok


# --- parts add up, through read, judged by edit -------------------------------------------


@pytest.mark.parametrize(
    "windows",
    [
        pytest.param([(1, 15), (16, 15)], id="two-halves"),
        pytest.param([(16, 15), (1, 15)], id="two-halves-last-first"),
        pytest.param([(1, 10), (11, 10), (21, 10)], id="three-thirds"),
        pytest.param([(21, 10), (1, 10), (11, 10)], id="three-thirds-out-of-order"),
        pytest.param([(1, 20), (5, 10), (15, 16)], id="overlapping-parts"),
        pytest.param([(1, 12), (10, 21)], id="overlap-past-the-end"),
        pytest.param([(n, 1) for n in range(LINES, 0, -1)], id="line-by-line-backwards"),
    ],
)
def test_F13_parts_that_cover_an_unchanged_file_are_a_whole_read(
    target: Path, ctx: ToolContext, windows: list[tuple[int, int]]
) -> None:
    # Given reads of parts of an unchanged file, each one its own call
    for index, (offset, limit) in enumerate(windows):
        assert not may_edit(ctx), "partly read, before the last part"
        read(ctx, offset, limit, call=f"r{index}")
    # Then together they are a whole read: edit passes F3, and the stamp says so
    assert may_edit(ctx)
    stamp = ctx.files.get(target)
    assert stamp is not None and not stamp.partial and stamp.lines == LINES


def test_F13_a_gap_keeps_it_partial_and_the_refusal_names_the_gap(
    target: Path, ctx: ToolContext
) -> None:
    # Given lines 1-10 and 21-30 shown, 11-20 never
    read(ctx, 1, 10, call="a")
    read(ctx, 21, 10, call="b")
    # Then edit refuses (code 2), naming exactly the lines never shown
    verdict = edit_tool.validate({"path": "code.py", "old_string": "x", "new_string": "y"}, ctx)
    assert verdict.code == CODE_NOT_READ
    assert verdict.details["missing_lines"] == [[11, 20]]
    assert verdict.details["read_first"] == {"path": "code.py", "offset": 11, "limit": 10}
    # And the read it names lifts it
    read(ctx, 11, 10, call="c")
    assert may_edit(ctx)


def test_F13_a_change_between_parts_starts_over(target: Path, ctx: ToolContext) -> None:
    # Given the first half read, then the file changed (another content token)
    original = target.read_text()
    read(ctx, 1, 15, call="a")
    target.write_text(original.replace("value_02 = 2", "value_02 = 'two'"))
    # When the second half of the new content is read
    read(ctx, 16, 15, call="b")
    # Then the halves are of two contents: only lines 16-30 of this one were shown
    assert not may_edit(ctx)
    stamp = ctx.files.get(target)
    assert stamp is not None
    assert stamp.content_hash == content_hash(target.read_bytes())
    assert stamp.missing_lines() == [(1, 15)]
    # And when it changes back, the first content's half is not brought back: the
    # register moved on, and a read of the other half starts over once more
    target.write_text(original)
    read(ctx, 16, 15, call="c")
    assert not may_edit(ctx)
    read(ctx, 1, 15, call="d")
    assert may_edit(ctx)


def test_F13_a_part_of_a_whole_shown_file_leaves_it_whole(target: Path, ctx: ToolContext) -> None:
    # Given a file read whole, then read again in part (the same content)
    read(ctx, call="whole")
    read(ctx, 5, 3, call="part")
    # Then it is still read whole: every line of it was shown
    assert may_edit(ctx)
    # And after an edit (F5: the model wrote the new content) a part read of that
    # content keeps it whole too
    assert not edit_tool.execute(
        {"path": "code.py", "old_string": "value_01 = 1", "new_string": "value_01 = 'one'"}, ctx
    ).startswith("Error")
    read(ctx, 2, 2, call="after")
    assert may_edit(ctx)


def test_F13_reads_side_by_side_in_workers_add_up_in_the_session() -> None:
    # Given two workers' registers, each seeded with what the session held (nothing),
    # each recording one half of one content, as two reads of one turn do
    register = FileReadRegister()
    path = "/w/code.py"
    halves = []
    for first, last, call in ((1, 15, "a"), (16, 30, "b")):
        worker = RecordingRegister({})
        stamp = FileReadStamp(
            1.0, 7, 300, "h", lines=30, shown=(Part(1.0 + first, first, last, call),)
        )
        worker.record(path, stamp)
        halves.append(worker.changes_dict())
    # When the session applies what each sent back, in either order
    for changes in halves:
        apply_changes(register, changes)
    # Then it holds both: the whole content; and applying one again changes nothing
    held = register.get(path)
    assert held is not None and not held.partial
    apply_changes(register, halves[0])
    assert register.get(path) == held
    assert FileReadStamp.from_dict(held.to_dict()) == held


def test_F13_a_stamp_of_another_content_replaces_it_whole() -> None:
    register = FileReadRegister()
    whole = FileReadStamp(1.0, 1, 10, "old", lines=3, shown=(Part(1.0, 1, 3, "a"),))
    register.record("/w/f", whole)
    newer = FileReadStamp(2.0, 2, 10, "new", lines=3, shown=(Part(2.0, 1, 1, "b"),))
    held = register.record("/w/f", newer)
    assert held == newer and held.partial


def test_F13_parts_settle_at_each_turns_end_and_stay_bounded_within_one() -> None:
    # Given a 500-line file read one line a turn: the register settles at each end
    register = FileReadRegister()
    for line in range(1, 501):
        part = Part(float(line), line, line, f"c{line}")
        held = register.record("/w/f", FileReadStamp(float(line), 1, 9, "h", 500, (part,)))
        assert held.partial is (line < 500)
        register.settle()
        # Then its parts are one union, whatever number of reads made it
        settled = register.get("/w/f")
        assert settled is not None and len(settled.shown) == 1
        assert settled.partial is held.partial and not settled.shown[0].call_id
    # And 500 reads of one line each within one turn keep at most MAX_PARTS parts:
    # past it the smallest are dropped, so that they never add up to a whole read
    register = FileReadRegister()
    for line in range(1, 501):
        part = Part(float(line), line, line, f"c{line}")
        held = register.record("/w/g", FileReadStamp(float(line), 1, 9, "h", 500, (part,)))
        assert held.partial and len(held.shown) <= MAX_PARTS
    # Nor do reads of every other line, settled or not
    register = FileReadRegister()
    for line in range(1, 1001, 2):
        part = Part(float(line), line, line, f"c{line}")
        held = register.record("/w/h", FileReadStamp(float(line), 1, 9, "h", 1000, (part,)))
        assert held.partial and len(held.shown) <= MAX_PARTS
        if line % 7 == 0:
            register.settle()


def test_F13_a_settled_part_is_never_taken_back_by_a_later_cut() -> None:
    # Given a file read whole in one turn (settled), then read again in the next
    register = FileReadRegister()
    register.record("/w/f", FileReadStamp(1.0, 1, 9, "h", 10, (Part(1.0, 1, 10, "a"),)))
    register.settle()
    register.record("/w/f", FileReadStamp(2.0, 1, 9, "h", 10, (Part(2.0, 1, 10, "a"),)))
    # When the second read (the same call id, as providers reuse them) is cut to 3 lines
    assert not register.narrow("/w/f", call_id="a", since=1.5, kept=(1, 3))
    # Then the file is still read whole: the first turn's lines stay shown
    held = register.get("/w/f")
    assert held is not None and not held.partial


def test_F13_coverage_arithmetic() -> None:
    parts = [Part(1, 1, 3, "a"), Part(2, 7, 9, "b"), Part(3, 4, 5, "c")]
    assert missing(parts, 10) == [(6, 6), (10, 10)]
    assert not covers(parts, 10) and covers([*parts, Part(4, 6, 10, "d")], 10)
    assert covers([Part(1, 1, None, "w")], 0)  # a whole part: the whole content
    assert not covers([], 5) and missing([], 5) == [(1, 5)]
    # A cut narrows only its own call's parts, recorded since it began
    kept, changed = narrowed(parts, "b", since=2, kept=(7, 8))
    assert changed and kept == (parts[0], Part(2, 7, 8, "b"), parts[2])
    assert narrowed(parts, "b", since=2.5, kept=None) == (tuple(parts), False)
    assert narrowed(parts, "a", since=0, kept=None) == ((parts[1], parts[2]), True)


# --- F2: what a text read says of the lines it showed ---------------------------------------


@pytest.mark.spec("F2")
@pytest.mark.parametrize(
    ("window", "shown", "next_offset"),
    [
        ({}, [1, LINES], None),
        ({"offset": 11, "limit": 5}, [11, 15], 16),
        ({"offset": 25}, [25, LINES], None),
        ({"limit": 29}, [1, 29], 30),
    ],
)
def test_F2_a_text_read_details_say_which_lines_it_showed(
    target: Path,
    ctx: ToolContext,
    window: dict[str, int],
    shown: list[int],
    next_offset: int | None,
) -> None:
    output = read_tool.execute({"path": "code.py", **window}, ctx)
    details = output.details
    assert details["lines_shown"] == shown
    assert details["total_lines"] == LINES
    assert details.get("next_offset") == next_offset
    note = text(output).rpartition("\n\n")[2]
    if shown == [1, LINES]:
        assert "[" not in text(output)  # a whole read has no note
        return
    # And the note says the same in words, naming the read that shows the rest
    assert note.startswith(f"[Lines {shown[0]}-{shown[1]} of {LINES} shown.")
    if next_offset is not None:
        rest = LINES - next_offset + 1
        assert f'read(path="code.py", offset={next_offset}, limit={rest}) shows the rest.' in note


@pytest.mark.spec("F2", "F12", "F14")
def test_F2_the_note_names_the_rest_in_the_sessions_profile(target: Path, workspace: Path) -> None:
    ctx = tool_context(workspace)
    ctx.tool_profile = "claude-code"
    note = text(read_tool.execute({"path": "code.py", "limit": 10}, ctx))
    assert 'Read(file_path="code.py", offset=11, limit=20) shows the rest.' in note
    ctx.tool_profile = "codex"  # no read tool to name: the offset alone
    assert "offset=11 shows the rest." in text(
        read_tool.execute({"path": "code.py", "limit": 10}, ctx)
    )


@pytest.mark.spec("F2")
def test_F2_every_text_read_says_its_total_and_an_empty_file_has_none(
    workspace: Path, ctx: ToolContext
) -> None:
    (workspace / "empty.txt").write_bytes(b"")
    assert read_tool.execute({"path": "empty.txt"}, ctx).details == {
        "path": "empty.txt",
        "total_lines": 0,
    }


@pytest.mark.spec("F2", "F13")
def test_F2_a_line_shortened_at_2000_characters_counts_as_shown(
    workspace: Path, ctx: ToolContext
) -> None:
    (workspace / "min.js").write_text("a" * 5_000 + "\nshort\n")
    out = text(read_tool.execute({"path": "min.js"}, ctx))
    assert "[line cut: 3000 more characters]" in out
    verdict = edit_tool.validate({"path": "min.js", "old_string": "short", "new_string": "s"}, ctx)
    assert verdict.ok


@pytest.mark.spec("F13")
async def test_F13_reads_in_other_turns_add_up_through_the_pipeline(
    workspace: Path, target: Path
) -> None:
    # Given a session that reads a file in two turns, as the read's note says
    coordinator = Coordinator(TOOLS)
    try:
        session = coordinator.open_session(workspace)
        (first,) = await coordinator.run_turn(
            session, [ToolCall("1", "read", {"path": "code.py", "limit": 12})]
        )
        rest = {"offset": first.details["next_offset"]}
        (second,) = await coordinator.run_turn(
            session, [ToolCall("2", "read", {"path": "code.py", **rest})]
        )
        # Then the second ends at the file's end; the turns' parts, settled at each
        # turn's end, are one; and the edit after them applies
        assert second.details["lines_shown"] == [13, LINES]
        assert "next_offset" not in second.details
        stamp = session.files.get(target)
        assert stamp is not None and not stamp.partial
        assert [(p.first, p.last, p.call_id) for p in stamp.shown] == [(1, None, "")]
        edit = {"path": "code.py", "old_string": "value_30", "new_string": "v"}
        (edited,) = await coordinator.run_turn(session, [ToolCall("3", "edit", edit)])
        assert not edited.is_error, edited.text
    finally:
        coordinator.close()
