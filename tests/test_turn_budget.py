"""A turn's output budget (SPEC L4): each call's share of ``turn_output_chars`` is
fixed at submission; a result over it is cut before its ``tool_end``, around a note
naming the spill file (in the session's scratch) that holds the full text; a cut
``read`` is a partial read for read-before-write."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import (
    ErrorCode,
    ImageBlock,
    MessageEnd,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolResult,
    TurnEnd,
    tools_in_module,
)
from toolpool.engine import Coordinator, Session
from toolpool.engine.budget import (
    DEFAULT_TURN_OUTPUT_CHARS,
    OPEN_TURN_SHARES,
    OutputShare,
    Spill,
    cut_to_share,
)
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.session_options import SessionOptions
from toolpool.tools import FILE_TOOLS
from toolpool.tools.support.stamps import CODE_NOT_READ

from .support import PNG_1X1, EventLog, ticks


def loud_text(call_id: str, chars: int) -> str:
    """``chars`` characters of numbered lines, different for each call."""
    out: list[str] = []
    size = 0
    for i in itertools.count(1):
        if size >= chars:
            break
        line = f"{call_id} line {i:05d}\n"
        out.append(line)
        size += len(line)
    return "".join(out)[:chars]


class Loud:
    """An async tool that answers ``chars`` characters of text after ``ticks`` turns
    of the event loop (a fake clock), with an image after the text if asked."""

    name = "loud"
    description = "Says a lot."
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "chars": {"type": "integer", "minimum": 0},
            "ticks": {"type": "integer", "minimum": 0},
            "image": {"type": "boolean"},
        },
        "required": ["chars"],
    }

    def read_only(self, args: dict[str, Any]) -> bool:
        return True

    async def execute_content(self, args: dict[str, Any], ctx: ToolContext) -> list[Any]:
        await ticks(args.get("ticks", 0))
        blocks: list[Any] = [TextBlock(loud_text(ctx.call_id, args["chars"]))]
        if args.get("image"):
            blocks.append(ImageBlock(base64.b64encode(PNG_1X1).decode(), "image/png"))
            blocks.append(TextBlock("after the image"))
        return blocks

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raise AssertionError("execute_content is used")


def loud(call_id: str, chars: int, ticks: int = 0, **more: Any) -> ToolCall:
    return ToolCall(call_id, "loud", {"chars": chars, "ticks": ticks, **more})


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(call_id, name, dict(arguments))


def text_chars(result: ToolResult) -> int:
    return sum(len(b.text) for b in result.content if isinstance(b, TextBlock))


def spill_of(result: ToolResult) -> Path:
    spill = result.details["output_cut"]["spill_file"]
    assert spill is not None
    return Path(spill)


def without_spill(result: ToolResult) -> tuple[str, dict[str, Any]]:
    """The result's text and cut details with the spill file's name left out (each
    turn's spill files have names of their own)."""
    path = str(spill_of(result))
    cut = {k: v for k, v in result.details["output_cut"].items() if k != "spill_file"}
    return result.text.replace(path, "<spill>"), cut


@pytest.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    coordinator = Coordinator([*FILE_TOOLS, Loud()], turn_output_chars=12_000)
    yield coordinator
    coordinator.close()


@pytest.mark.spec("L4")
async def test_L4_shares_are_fixed_at_submission_not_by_finishing_order(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given a turn of three calls (share 12,000 // 3 = 4,000): a small one and two
    # over their share, once with the small one finishing first, once last
    session = coordinator.open_session(workspace)
    runs: list[tuple[tuple[ToolResult, ...], EventLog]] = []
    for slow in (False, True):
        log = EventLog()
        calls = [
            loud("a", 1_000, ticks=40 if slow else 0),
            loud("b", 9_000, ticks=20),
            loud("c", 20_000, ticks=0 if slow else 40),
        ]
        runs.append((await coordinator.run_turn(session, calls, on_event=log), log))
    (first, first_log), (second, second_log) = runs
    assert [e.call_id for e in first_log.ends()] == ["a", "b", "c"]
    assert [e.call_id for e in second_log.ends()] == ["c", "b", "a"]
    # Then each call is cut alike, whatever finished first: the small one untouched,
    # each big one to its share of 4,000 characters, note included
    assert first[0].text == second[0].text == loud_text("a", 1_000)
    assert "output_cut" not in first[0].details
    for one, other in zip(first[1:], second[1:], strict=True):
        assert without_spill(one) == without_spill(other)
        assert text_chars(one) <= 4_000
        assert one.details["output_cut"]["share"] == 4_000
    # The cut keeps the head and the tail, whole lines, around the note
    b = first[1]
    full = loud_text("b", 9_000)
    head, _, tail = b.text.partition("\n[")
    assert full.startswith(head) and head.endswith("\n")
    assert full.endswith(tail.partition("]\n\n")[2])
    cut = b.details["output_cut"]
    assert cut["total_chars"] == 9_000
    assert f"{9_000 - cut['kept_chars']} of 9000 characters cut here" in b.text
    assert "turn_output_chars = 12000" in b.text
    # And every consumer saw the same cut result: tool_end, the messages, turn_end
    for results, log in runs:
        ends = {e.call_id: e.result for e in log.ends()}
        (turn_end,) = [e for e in log.events if isinstance(e, TurnEnd)]
        assert turn_end.results == results
        assert [ends[r.call_id] for r in results] == list(results)
        messages = [e.message for e in log.events if isinstance(e, MessageEnd)]
        assert [m.content for m in messages] == [r.text for r in results]


@pytest.mark.spec("L4", "X8")
async def test_L4_the_note_names_a_spill_file_only_its_session_can_read(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given a call whose 50,000 characters are over the turn's whole budget
    session = coordinator.open_session(workspace)
    other = coordinator.open_session(workspace)
    (result,) = await coordinator.run_turn(session, [loud("big", 50_000)])
    # Then the note names the spill file, private, in the session's scratch, holding
    # the full output
    spill = spill_of(result)
    assert f"Full output: {spill} (read it with offset and limit)" in result.text
    assert spill.parent == session.scratch_dir / "output"
    assert stat.S_IMODE(os.lstat(spill).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(spill.parent).st_mode) == 0o700
    assert await asyncio.to_thread(spill.read_text) == loud_text("big", 50_000)
    # And the session's read tool reads it, from a line the cut left out
    line = 2_000
    (read,) = await coordinator.run_turn(
        session, [call("r", "read", path=str(spill), offset=line, limit=2)]
    )
    assert not read.is_error, read.text
    assert f"{line:>6}\tbig line {line:05d}" in read.text
    assert f"big line {line:05d}" not in result.text
    # But no other session's
    (refused,) = await coordinator.run_turn(other, [call("r", "read", path=str(spill))])
    assert refused.is_error
    assert "big line" not in refused.text


@pytest.mark.spec("L4", "F3")
async def test_L4_a_cut_read_is_a_partial_read(coordinator: Coordinator, workspace: Path) -> None:
    # Given a file whose read (10,600 characters) is over a share of 6,000
    target = workspace / "big.py"
    target.write_text("".join(f"value_{i:04d} = {'x' * 30!r}\n" for i in range(200)))
    (workspace / "small.py").write_text("x = 1\n")
    session = coordinator.open_session(workspace)
    # When it is read beside another call, and then edited
    cut, _ = await coordinator.run_turn(
        session, [call("1", "read", path="big.py"), call("2", "read", path="small.py")]
    )
    (refused,) = await coordinator.run_turn(
        session, [call("3", "edit", path="big.py", old_string="value_0000", new_string="v")]
    )
    # Then the read was cut, says so, and counts as partly read: the edit is refused
    # as after a read with offset/limit (F3, code 2)
    assert cut.details["output_cut"]["partly_read"] == ["big.py"]
    assert "big.py now counts as partly read" in cut.text
    stamp = session.files.get(target)
    assert stamp is not None and stamp.partial
    assert refused.is_error
    assert refused.details["validation_code"] == CODE_NOT_READ
    assert "only partly read" in refused.text
    # And a read within its share (alone in its turn) lets the edit through
    (whole,) = await coordinator.run_turn(session, [call("4", "read", path="big.py")])
    assert "output_cut" not in whole.details
    (edited,) = await coordinator.run_turn(
        session, [call("5", "edit", path="big.py", old_string="value_0000", new_string="v")]
    )
    assert not edited.is_error, edited.text


@pytest.mark.spec("L4", "F9")
async def test_L4_a_cut_stale_refusal_is_no_read(workspace: Path) -> None:
    # Given a small file read whole, then changed behind the model's back
    target = workspace / "small.py"
    target.write_text("".join(f"line_{i} = {i}\n" for i in range(150)))
    (workspace / "tiny.py").write_text("x = 1\n")
    coordinator = Coordinator(FILE_TOOLS, turn_output_chars=4_000)
    try:
        session = coordinator.open_session(workspace)
        await coordinator.run_turn(session, [call("1", "read", path="small.py")])
        target.write_text(target.read_text().replace("line_0 = 0", "line_0 = 'changed'"))
        # When the edit's stale refusal, which would show the whole file and count as
        # its read (F9), is cut to fit its share of a turn of four calls (1,000)
        edit = call("2", "edit", path="small.py", old_string="line_1 = 1", new_string="x")
        others = [call(f"t{i}", "read", path="tiny.py") for i in range(3)]
        stale, *_ = await coordinator.run_turn(session, [edit, *others])
        (retry,) = await coordinator.run_turn(
            session, [call("3", "edit", path="small.py", old_string="line_1 = 1", new_string="x")]
        )
    finally:
        coordinator.close()
    # Then the model did not see the whole file: the retry needs a read
    assert stale.is_error and "output_cut" in stale.details
    assert retry.is_error
    assert retry.details["validation_code"] == CODE_NOT_READ


@pytest.mark.spec("L4")
async def test_L4_results_within_their_share_are_untouched(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given two calls at exactly their share (12,000 // 3) and a file read
    (workspace / "a.txt").write_text("hello\n")
    session = coordinator.open_session(workspace)
    results = await coordinator.run_turn(
        session, [loud("a", 4_000), loud("b", 4_000), call("r", "read", path="a.txt")]
    )
    # Then nothing is cut, no note, no spill file, and the read stamp is whole
    assert [r.text for r in results[:2]] == [loud_text("a", 4_000), loud_text("b", 4_000)]
    assert results[2].text == "     1\thello"
    assert all("output_cut" not in r.details for r in results)
    assert not (session.scratch_dir / "output").exists()
    stamp = session.files.get(workspace / "a.txt")
    assert stamp is not None and not stamp.partial


@pytest.mark.spec("L4")
async def test_L4_no_budget_no_cut(workspace: Path) -> None:
    # Given a coordinator without a budget (0), and one with the default
    unbounded = Coordinator([Loud()], turn_output_chars=0)
    bounded = Coordinator([Loud()])
    try:
        assert bounded.turn_output_chars == DEFAULT_TURN_OUTPUT_CHARS == 400_000
        huge = 2 * DEFAULT_TURN_OUTPUT_CHARS
        # Then nothing is cut there, nor in a session that turns the budget off (0)
        (plain,) = await unbounded.run_turn(unbounded.open_session(workspace), [loud("a", huge)])
        session = bounded.open_session(workspace, turn_output_chars=0)
        (also,) = await bounded.run_turn(session, [loud("a", huge)])
        assert plain.text == also.text == loud_text("a", huge)
        assert "output_cut" not in plain.details and "output_cut" not in also.details
        # While a session that says nothing (None) takes the coordinator's budget,
        # and one may set its own
        default = bounded.open_session(workspace)
        (cut,) = await bounded.run_turn(default, [loud("a", huge)])
        assert cut.details["output_cut"]["share"] == 400_000
        own = bounded.open_session(workspace, turn_output_chars=1_000)
        (small,) = await bounded.run_turn(own, [loud("a", 5_000)])
        assert text_chars(small) <= 1_000
        with pytest.raises(ValueError, match="turn_output_chars"):
            bounded.open_session(workspace, turn_output_chars=-1)
    finally:
        unbounded.close()
        bounded.close()


@pytest.mark.spec("L4")
async def test_L4_an_open_turn_gives_appended_calls_the_share_fixed_at_submission(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given an open turn submitted with one call: each call's share is the budget
    # over max(1, OPEN_TURN_SHARES), for the calls appended later too
    session = coordinator.open_session(workspace)
    share = 12_000 // OPEN_TURN_SHARES
    turn = coordinator.submit(session, [loud("a", 10_000, ticks=5)], open=True)
    await ticks(2)
    turn.add([loud("b", 10_000, ticks=1), loud("c", share)])
    await ticks(2)
    turn.add([loud("d", 50_000)])
    turn.close()
    a, b, c, d = await turn
    for result in (a, b, d):
        assert result.details["output_cut"]["share"] == share
        assert text_chars(result) <= share
    assert c.text == loud_text("c", share)
    assert "output_cut" not in c.details


@pytest.mark.spec("L4")
async def test_L4_only_text_counts_and_images_stay(
    coordinator: Coordinator, workspace: Path
) -> None:
    # Given a result of text, an image and more text, over its share
    session = coordinator.open_session(workspace)
    (result,) = await coordinator.run_turn(session, [loud("p", 30_000, image=True)])
    # Then its text is cut to the share, the image is kept where it was, and the
    # spill file holds the text (the blocks' texts, as ToolResult.text joins them)
    kinds = [type(b).__name__ for b in result.content]
    assert kinds == ["TextBlock", "ImageBlock", "TextBlock"]
    assert text_chars(result) <= 12_000
    assert result.content[-1] == TextBlock("after the image")
    full = loud_text("p", 30_000) + "\nafter the image"
    assert await asyncio.to_thread(spill_of(result).read_text) == full


@pytest.fixture
async def pooled() -> AsyncIterator[Coordinator]:
    config = PoolConfig(min_workers=1, max_workers=2, tool_modules=("toolpool.tools",))
    async with WorkerPool(config) as pool:
        coordinator = Coordinator(
            tools_in_module("toolpool.tools"), executor=PoolExecutor(pool), turn_output_chars=60_000
        )
        yield coordinator
        coordinator.close()


@pytest.mark.spec("L4", "D3")
async def test_L4_in_workers_output_bytes_still_caps_each_call(
    pooled: Coordinator, workspace: Path
) -> None:
    # Given the daemon's executor (worker processes), output_bytes = 100,000 and a
    # share of 20,000 characters: a read over output_bytes, a read and a search only
    # over their share
    (workspace / "huge.txt").write_text("".join(f"{'h' * 60}\n" for _ in range(2_000)))
    (workspace / "mid.txt").write_text("".join(f"mid {i:05d} {'m' * 40}\n" for i in range(1_000)))
    session = pooled.open_session(workspace, limits={"output_bytes": 100_000})
    huge, mid, found = await pooled.run_turn(
        session,
        [
            call("1", "read", path="huge.txt"),
            call("2", "read", path="mid.txt"),
            call("3", "grep", pattern="mid", path="mid.txt", output_mode="content"),
        ],
    )
    # Then the first is the per-call limit's error, as before, and not cut
    assert huge.error_code is ErrorCode.LIMIT_EXCEEDED
    assert "more than the output limit of 100000 bytes" in huge.text
    assert "output_cut" not in huge.details
    # And the read is cut to its share, its first lines (a partial read: its stamp,
    # recorded in a worker, narrowed to them)
    assert not mid.is_error
    assert text_chars(mid) <= 20_000
    assert mid.details["output_cut"]["partly_read"] == ["mid.txt"]
    kept = mid.details["lines_shown"][1]
    assert mid.text.startswith("     1\tmid 00000 ")
    assert f"{kept:>6}\tmid {kept - 1:05d}" in mid.text
    # And the search's spill file is readable by the session's read tool in a worker
    (spilled,) = await pooled.run_turn(
        session, [call("4", "read", path=str(spill_of(found)), offset=240, limit=1)]
    )
    assert not spilled.is_error, spilled.text
    assert f"mid {239:05d}" in spilled.text and f"mid {239:05d}" not in found.text
    (refused,) = await pooled.run_turn(
        session, [call("5", "edit", path="mid.txt", old_string="mid 00000", new_string="m")]
    )
    assert refused.details["validation_code"] == CODE_NOT_READ
    assert refused.details["missing_lines"] == [[kept + 1, 1_000]]


@pytest.mark.spec("L4")
def test_L4_a_session_checks_its_budget(workspace: Path) -> None:
    with pytest.raises(ValueError, match="turn_output_chars"):
        SessionOptions.parse({"turn_output_chars": True})  # a bool is no count
    session = Session(workspace, options=SessionOptions(turn_output_chars=0))
    try:
        assert session.turn_output_chars == 0
    finally:
        session.close()


@pytest.mark.spec("L4")
def test_L4_a_cut_fits_its_share_note_included_at_any_size(tmp_path: Path) -> None:
    # Given results of one, two and three text blocks (an image among them)
    image = ImageBlock(base64.b64encode(PNG_1X1).decode(), "image/png")
    texts = [loud_text("x", 3_000), "no newline here " * 40, loud_text("y", 500)]
    spill = Spill(tmp_path / "full.txt")
    for blocks in ([texts[0]], [texts[0], texts[1]], texts):
        content: tuple[TextBlock | ImageBlock, ...] = (
            TextBlock(blocks[0]),
            image,
            *(TextBlock(t) for t in blocks[1:]),
        )
        result = ToolResult("c", "loud", content)
        total = sum(map(len, blocks))
        for chars in (1, 50, 400, 401, 500, 1_000, 2_999, total - 1, total, total + 1):
            share = OutputShare(chars, 10 * chars)
            cut = cut_to_share(result, share, spill)
            if chars >= total:
                assert cut is result  # within the share: the very same result
                continue
            # Then the image stays, the text fits the share (or is the note alone,
            # for a share smaller than the note), and what is kept is the text's
            # head and tail, around the note
            assert image in cut.content
            kept = cut.details["output_cut"]["kept_chars"]
            note = f"{total - kept} of {total} characters cut here"
            assert note in cut.text and str(spill.path) in cut.text
            if text_chars(cut) > chars:
                assert kept == 0 and cut.text.startswith("[") and cut.text.endswith("]")
            joined = "".join(blocks)
            flat = "".join(b.text for b in cut.content if isinstance(b, TextBlock))
            head, _, rest = flat.partition("[" + note)
            tail = rest.partition("]")[2]
            assert joined.startswith(head.rstrip("\n") if kept else "")
            assert joined.endswith(tail.lstrip("\n"))
            assert len(head.rstrip("\n")) + len(tail.lstrip("\n")) <= kept + 2
