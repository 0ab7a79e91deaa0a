"""Spill files (``toolpool.spill``): one rule for every file that keeps output whole —
a background shell's (SPEC L9), a foreground command's (X8), a cut result's (L4):
bytes as they came, whole UTF-8 at every offset offered, cut at the cap before a
character it would split, then the note; past the cap a pipe is drained and dropped
without killing the writer."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tool_support import tool_context
from toolpool.engine.budget import write_spill
from toolpool.spill import SpillFile, pump, truncation_note, utf8_boundary
from toolpool.tools.support.command_output import MAX_OUTPUT_CHARS, CommandOutput, read_output

NOTE = "\n[output truncated at {} bytes: spill_bytes]\n"


# Text rich in characters of every UTF-8 length (1 to 4 bytes).
_TEXT = st.text(st.sampled_from("ae\n€é😀中ß\u0800\U0010fffd"), max_size=200)


def _offered(data: bytes, cuts: list[int], limit: int) -> tuple[bytes, list[int], SpillFile]:
    """``data`` given to an SpillFile of ``limit`` in pieces cut at ``cuts``: the file's
    bytes, the ``written`` offsets it offered after each piece, the file."""
    with tempfile.TemporaryDirectory() as directory:
        output = SpillFile(Path(directory) / "out.log", limit)
        offered = []
        at = 0
        for cut in [*sorted(set(cuts)), len(data)]:
            output.add(data[at:cut])
            at = max(at, cut)
            offered.append(output.written)
        output.end()
        offered.append(output.written)
        output.close()
        return (Path(directory) / "out.log").read_bytes(), offered, output


@pytest.mark.spec("L9")
@settings(max_examples=300, deadline=None)
@given(text=_TEXT, cuts=st.lists(st.integers(0, 800), max_size=8), limit=st.integers(1, 900))
def test_L9_every_offset_offered_ends_a_whole_character_and_the_cap_splits_none(
    text: str, cuts: list[int], limit: int
) -> None:
    # Given text whose pieces arrive cut anywhere, mid-character included.
    data = text.encode()
    file, offered, output = _offered(data, cuts, limit)
    # Then every offset a reader was offered ends a whole character of the file.
    for end in offered:
        file[:end].decode("utf-8")  # strict: raises on a split character
    if len(data) <= limit:
        assert file == data and not output.truncated
        return
    # Past the cap: the longest prefix of whole characters that fits, then the note.
    kept = file[: len(file) - len(NOTE.format(limit).encode())]
    assert output.truncated and file == kept + NOTE.format(limit).encode()
    assert data.startswith(kept) and limit - 4 < len(kept) <= limit
    following = data[len(kept) :].decode()[0].encode()  # the character the cut left out
    assert len(kept) + len(following) > limit


@pytest.mark.spec("L9")
@pytest.mark.parametrize(
    ("data", "boundary"),
    [
        (b"", 0),
        (b"abc", 3),
        ("é".encode()[:1], 0),  # a lead byte alone: wait for its rest
        ("a€".encode()[:3], 1),  # two of €'s three bytes
        ("a😀".encode()[:4], 1),
        ("a😀".encode(), 5),
        (b"\xff\xfe", 2),  # not UTF-8: nothing to wait for, the reader replaces it
        (b"\x80\x80\x80\x80\x80", 5),
    ],
)
def test_L9_utf8_boundary_waits_only_for_an_incomplete_last_character(
    data: bytes, boundary: int
) -> None:
    assert utf8_boundary(data) == boundary


@pytest.mark.spec("L9")
def test_L9_past_the_cap_the_pipe_is_drained_and_dropped_and_the_writer_lives(
    tmp_path: Path,
) -> None:
    # Given a shell's pipe with its reader, and a cap of 1,000 bytes.
    read_fd, write_fd = os.pipe()
    output = SpillFile(tmp_path / "out.log", 1000)
    stop = threading.Event()
    reader = threading.Thread(target=pump, args=(read_fd, output, stop))
    reader.start()
    # When a writer writes 1 MiB past the cap, sixteen times what a pipe holds.
    total = 0
    with os.fdopen(write_fd, "wb", buffering=0) as writer:
        for _ in range(16):
            total += writer.write(b"y\n" * 32768)  # blocks while the pipe is full
    reader.join()
    os.close(read_fd)
    # Then every write went through (no EPIPE, no SIGPIPE: the pipe stayed open),
    # and the file holds the cap and the note, nothing read after it.
    assert total == 16 * 65536
    assert output.truncated
    assert (tmp_path / "out.log").read_bytes() == b"y\n" * 500 + NOTE.format(1000).encode()
    output.close()


def test_the_note_is_the_one_every_spill_file_ends_with() -> None:
    assert truncation_note(1024) == NOTE.format(1024).encode()


@pytest.mark.spec("L4")
@settings(max_examples=200, deadline=None)
@given(text=_TEXT, limit=st.integers(1, 900))
def test_L4_a_cut_results_spill_file_never_splits_a_character(text: str, limit: int) -> None:
    # Given a result's text and a session's spill_bytes that may fall inside a character.
    with tempfile.TemporaryDirectory() as scratch:
        # When the budget spills it.
        spill = write_spill(Path(scratch), "c1", text, limit)
        assert spill.path is not None
        file = spill.path.read_bytes()
        mode = stat.S_IMODE(os.lstat(spill.path).st_mode)
    data = text.encode()
    # Then the file is the text, or its longest prefix of whole characters within the
    # cap and the note: UTF-8 to its last byte, private to the daemon's user.
    assert mode == 0o600
    if len(data) <= limit:
        assert file == data
        return
    kept = file.removesuffix(NOTE.format(limit).encode())
    assert kept != file and data.startswith(kept) and limit - 4 < len(kept) <= limit
    kept.decode("utf-8")


@pytest.mark.spec("X8")
def test_X8_a_commands_spill_file_holds_its_bytes_cut_whole_and_the_model_its_end(
    tmp_path: Path,
) -> None:
    # Given a foreground command's output read from its pipe with a cap of 1,001 bytes,
    # and a command that writes "é" (2 bytes) 40,000 times, split mid-character
    # between writes, then a byte that is not UTF-8, then its last words.
    ctx = tool_context(tmp_path)
    output = CommandOutput(tmp_path / "c1.log", ctx, 1001)
    read_fd, write_fd = os.pipe()
    stop = threading.Event()
    reader = threading.Thread(target=read_output, args=(read_fd, output, stop))
    reader.start()
    data = "é".encode() * 40_000 + b"\xff" + b"the end\n"
    with os.fdopen(write_fd, "wb", buffering=0) as writer:
        step = 3333  # odd: characters split between writes
        for at in range(0, len(data), step):
            writer.write(data[at : at + step])
    reader.join()
    os.close(read_fd)
    output.close()
    # Then the spill file holds the command's bytes up to the last whole character
    # within the cap (1,000 bytes: 500 "é", never half of the next), then the note.
    assert output.spill_truncated
    assert (tmp_path / "c1.log").read_bytes() == "é".encode() * 500 + NOTE.format(1001).encode()
    # And the model's head and tail still cover the whole output, past the cap:
    # its last words, the byte that is not UTF-8 replaced.
    text, cut = output.text()
    assert cut and output.total_chars == 40_000 + 1 + len("the end\n")
    assert text.endswith("é\ufffdthe end\n") and len(text) < MAX_OUTPUT_CHARS + 200


@pytest.mark.spec("X8")
def test_X8_a_command_that_wrote_nothing_leaves_no_spill_file(tmp_path: Path) -> None:
    output = CommandOutput(tmp_path / "c1.log", tool_context(tmp_path), 1000)
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    read_output(read_fd, output, threading.Event())
    os.close(read_fd)
    output.close()
    assert not (tmp_path / "c1.log").exists()
    assert output.text() == ("", False)
