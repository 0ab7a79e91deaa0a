"""SPEC L9 without a daemon: a background shell's output file (bytes, whole UTF-8 at
every offset it offers, cut at the cap before a character it would split, drained
and dropped past it without killing the writer), the caps on how many shells run,
and which limit ended a shell, as the supervisor decides them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpool.pool.shell_bounds import ShellCaps, at_exit, reached
from toolpool.pool.shell_output import OutputFile, pump, utf8_boundary
from toolpool.sandbox import confine_exec
from toolpool.sandbox.limits import Limits

NOTE = "\n[output truncated at {} bytes: spill_bytes]\n"

# Text rich in characters of every UTF-8 length (1 to 4 bytes).
_TEXT = st.text(st.sampled_from("ae\n€é😀中ß\u0800\U0010fffd"), max_size=200)


def _offered(data: bytes, cuts: list[int], limit: int) -> tuple[bytes, list[int], OutputFile]:
    """``data`` given to an OutputFile of ``limit`` in pieces cut at ``cuts``: the file's
    bytes, the ``written`` offsets it offered after each piece, the file."""
    with tempfile.TemporaryDirectory() as directory:
        output = OutputFile(Path(directory) / "out.log", limit)
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
    output = OutputFile(tmp_path / "out.log", 1000)
    stop = threading.Event()
    reader = threading.Thread(target=pump, args=(read_fd, output, stop))
    reader.start()
    # When a writer writes 1 MiB past the cap, sixteen times what a pipe holds.
    total = 0
    with os.fdopen(write_fd, "wb", buffering=0) as writer:
        for _ in range(16):
            total += writer.write(b"y\n" * 32768)  # blocks while the pipe is full
    reader.join()
    # Then every write went through (no EPIPE, no SIGPIPE: the pipe stayed open),
    # and the file holds the cap and the note, nothing read after it.
    assert total == 16 * 65536
    assert output.truncated
    assert (tmp_path / "out.log").read_bytes() == b"y\n" * 500 + NOTE.format(1000).encode()
    output.close()


@pytest.mark.spec("L9")
@pytest.mark.parametrize(
    ("running", "session", "client", "refusal"),
    [
        ([("s1", "c1")] * 15, "s1", "c1", None),
        ([("s1", "c1")] * 16, "s1", "c1", "the most a session may (16)"),
        ([("s1", "c1")] * 16 + [("s2", "c1")] * 3, "s2", "c1", None),
        (
            [("s1", "c1")] * 16 + [("s2", "c1")] * 4,
            "s3",
            "c1",
            "max_background_shells_per_client = 20",
        ),
        ([("s1", "c1")] * 16 + [("s2", "c1")] * 4, "s9", "c2", None),  # another client
        ([("s1", None)] * 16 + [("s2", None)] * 4, "s3", None, None),  # owners not known
        ([(f"s{i}", f"c{i}") for i in range(30)], "s99", "c99", "max_background_shells = 30"),
    ],
)
def test_L9_the_caps_count_running_shells_by_session_client_and_daemon(
    running: list[tuple[str, str | None]], session: str, client: str | None, refusal: str | None
) -> None:
    caps = ShellCaps(per_client=20, total=30)
    said = caps.refusal(running, session, client)
    if refusal is None:
        assert said is None
    else:
        assert said is not None and refusal in said


LIMITS = Limits(cpu_seconds=2, memory_bytes=64 << 20, processes=32)
KILL, XCPU = 128 + signal.SIGKILL, 128 + signal.SIGXCPU


@pytest.mark.spec("L9")
@pytest.mark.parametrize(
    ("code", "cpu", "oom", "pids", "limit"),
    [
        (0, 0.1, 0, 0, None),  # its own end
        (KILL, 0.3, 0, 0, None),  # killed by someone, its CPU far from spent
        (0, 2.5, 0, 0, None),  # it spent the allowance but exited by itself
        (XCPU, 1.97, 0, 0, "cpu_seconds = 2"),  # RLIMIT_CPU's SIGXCPU, under bubblewrap:
        (-signal.SIGXCPU, None, 0, 0, "cpu_seconds = 2"),  # its tick clock runs ahead
        (KILL, 3.0, 0, 0, "cpu_seconds = 2"),  # its SIGKILL, SIGXCPU ignored
        (-signal.SIGKILL, 2.01, 0, 0, "cpu_seconds = 2"),  # the same, without bubblewrap
        (KILL, 1.97, 0, 0, None),  # a SIGKILL of someone's, the CPU not spent
        (KILL, None, 0, 0, None),  # no CPU counted: nothing to tell it by
        (KILL, 0.2, 1, 0, "memory_bytes = 67108864"),  # the OOM killer
        (1, 0.2, 0, 3, "processes = 32"),  # a fork refused, then it gave up
    ],
)
def test_L9_the_limit_that_ended_a_shell_is_told_from_its_own_end(
    code: int, cpu: float | None, oom: int, pids: int, limit: str | None
) -> None:
    ended = at_exit(LIMITS, code, cpu, oom, pids)
    if limit is None:
        assert ended is None
    else:
        assert ended is not None and limit in ended.reason


@pytest.mark.spec("L9")
def test_L9_a_running_shell_past_its_cpu_or_with_a_refused_fork_has_reached_a_limit() -> None:
    assert reached(LIMITS, 1.9, 0) is None
    assert reached(LIMITS, None, 0) is None
    cpu = reached(LIMITS, 2.1, 0)
    assert cpu is not None and (cpu.name, cpu.value) == ("cpu_seconds", 2)
    assert cpu.reason == "it used up its CPU time limit (cpu_seconds = 2)"
    pids = reached(LIMITS, 0.5, 1)
    assert pids is not None and pids.reason == "it reached its process limit (processes = 32)"


@pytest.mark.spec("L9")
def test_L9_a_shells_cpu_rlimit_warns_with_sigxcpu_a_second_before_its_sigkill() -> None:
    # Given the exec wrapper a shell starts through, asked for CPU=3:4 and NOFILE=64.
    show = "import resource as r; print(r.getrlimit(r.RLIMIT_CPU), r.getrlimit(r.RLIMIT_NOFILE))"
    argv = [sys.executable, "-I", "-S", confine_exec.__file__, "--rlimit", "CPU=3:4"]
    argv += ["--rlimit", "NOFILE=64", "--", sys.executable, "-I", "-S", "-c", show]
    # When the command it execs reads its own rlimits.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    # Then CPU's soft and hard limits are apart (SIGXCPU comes first), the rest equal.
    assert done.stdout.split("\n")[0] == "(3, 4) (64, 64)"
