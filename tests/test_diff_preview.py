"""SPEC P7: the previews of edit and write are difflib's unified diff, byte for byte,
though they are no longer computed by difflib over the whole file.

The oracle is the preview as it was made before: ``difflib.unified_diff`` over every
line, cut at MAX_DIFF_CHARS. The property tests draw files (repeated and unique
lines, popular lines past 200, CRLF, no final newline, empty, unicode) and edits
(one or every occurrence, adjacent ones, at the first and the last line, adding or
removing newlines, an empty new_string) and writes, and compare.
"""

from __future__ import annotations

import codecs
import difflib
import random
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from toolpool.preflight import cut_note
from toolpool.sandbox.limits import Limits
from toolpool.tools.support import diff, diff_regions
from toolpool.tools.support.diff import MAX_DIFF_CHARS, unified_diff
from toolpool.tools.support.edit_plan import plan_edit
from toolpool.tools.support.text import TextDocument

# -- the oracle: the preview before windows -------------------------------------------

_NO_NEWLINE = "\\ No newline at end of file\n"


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def difflib_diff(old: str, new: str, name: str, *, created: bool = False) -> str:
    """toolpool/tools/support/diff.py's unified_diff as it was: difflib over the whole file."""
    out: list[str] = []
    size = 0
    for line in difflib.unified_diff(
        _lines(old),
        _lines(new),
        fromfile="/dev/null" if created else f"a/{name}",
        tofile=f"b/{name}",
    ):
        text = line if line.endswith("\n") else f"{line}\n{_NO_NEWLINE}"
        if size + len(text) > MAX_DIFF_CHARS:
            out.append(cut_note(MAX_DIFF_CHARS))
            break
        out.append(text)
        size += len(text)
    return "".join(out)


# -- files and changes ----------------------------------------------------------------

# Lines that repeat (and, in files of 200 lines or more, turn popular: difflib's
# autojunk), lines that repeat now and then, and lines that rarely do.
COMMON = ["", "x", "    pass", "  a", "\r", "b\r", "é", "日本", "\t}", " "]
line_text = st.one_of(
    st.sampled_from(COMMON),
    st.integers(0, 30).map(lambda k: f"line {k}"),
    st.integers(0, 10**6).map(lambda k: f"unique {k}"),
)


@st.composite
def long_line_lists(draw: st.DrawFn) -> list[str]:
    """Around 200 lines (where difflib starts to treat lines as popular): drawn by a
    seeded generator, which hypothesis draws far faster than 200 lines one by one."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    pool = COMMON[: draw(st.integers(1, len(COMMON)))]
    pool += [f"line {k}" for k in range(draw(st.sampled_from([1, 5, 40])))]
    unique = draw(st.sampled_from([0.0, 0.3, 0.9]))  # the share of lines seen once
    repeats = draw(st.sampled_from([0.0, 0.05]))  # blocks copied from earlier on
    weights = [rng.random() ** 3 for _ in pool]
    lines: list[str] = []
    for k in range(draw(st.integers(190, 240))):
        if lines and rng.random() < repeats:
            at = rng.randrange(len(lines))
            lines += lines[at : at + rng.randrange(1, 6)]
        else:
            lines.append(f"unique {k}" if rng.random() < unique else rng.choices(pool, weights)[0])
    return lines


line_lists = st.one_of(st.lists(line_text, max_size=30), long_line_lists())


@st.composite
def files(draw: st.DrawFn) -> str:
    lines = draw(line_lists)
    text = "\n".join(lines)
    if lines and draw(st.booleans()):
        text += "\n"
    return text


@st.composite
def crlf_files(draw: st.DrawFn) -> bytes:
    """File bytes as edit reads them: LF, CRLF or mixed endings, maybe a BOM."""
    text = draw(files())
    ending = draw(st.sampled_from(["lf", "crlf", "mixed"]))
    if ending == "crlf":
        text = text.replace("\n", "\r\n")
    elif ending == "mixed":
        text = text.replace("\n", "\r\n", 1)
    data = text.encode("utf-8", errors="surrogatepass")
    return codecs.BOM_UTF8 + data if draw(st.booleans()) else data


replacements = st.one_of(
    st.sampled_from(["", "\n", "q", "q\n", "\nq", "\n\n", "x\n", "\nx", "line 1\n", "    pass\n"]),
    st.lists(line_text, max_size=4).map("\n".join),
    st.text(alphabet="xq\n é", max_size=8),
)


@st.composite
def edits(draw: st.DrawFn) -> tuple[bytes, dict[str, object]]:
    """A file and the arguments of an edit of it that plan_edit accepts."""
    data = draw(crlf_files())
    text = TextDocument.decode(data).text  # as plan_edit matches it
    if not text:
        text = draw(st.sampled_from(["x", "x\n"]))
        data = text.encode()
    length = draw(st.sampled_from([1, 2, 3, 5, 12, 40]))
    start = draw(
        st.one_of(
            st.just(0),  # the first line
            st.just(max(len(text) - length, 0)),  # the last
            st.integers(0, len(text) - 1),
        )
    )
    # as plan_edit matches it: LF for CRLF in a CRLF file
    old = TextDocument.decode(data).normalise(text[start : start + length])
    assume(old in text)
    new = draw(st.one_of(replacements, st.just(old + "\n"), st.just("\n" + old), st.just("")))
    if new == old:
        new = old + "q"
    replace_all = text.count(old) > 1 or draw(st.booleans())
    return data, {"path": "f", "old_string": old, "new_string": new, "replace_all": replace_all}


@st.composite
def rewrites(draw: st.DrawFn) -> tuple[str, str]:
    """An old and a new content of a file: a few edits of it, or another file."""
    old = draw(files())
    if draw(st.integers(0, 3)) == 0:
        return old, draw(files())
    new = old
    for _ in range(draw(st.integers(1, 3))):
        if not new:
            new = draw(files())
            continue
        at = draw(st.integers(0, len(new) - 1))
        cut = draw(st.integers(0, 30))
        new = new[:at] + draw(replacements) + new[at + cut :]
    return old, new


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the properties -------------------------------------------------------------------


@pytest.mark.spec("P7", "H3")
@PROPERTY
@given(edits())
def test_an_edit_preview_is_difflibs_diff(edit: tuple[bytes, dict[str, object]]) -> None:
    # Given a file and an edit of it, When the edit is planned and its preview made
    data, args = edit
    plan = plan_edit(data, args, "f", Limits().file_size_bytes)
    # Then the preview is what difflib makes of the whole file
    assert plan.diff("f") == difflib_diff(plan.old_text, plan.new_text, "f")


@pytest.mark.spec("P7", "H3")
@PROPERTY
@given(rewrites())
def test_a_write_preview_is_difflibs_diff(contents: tuple[str, str]) -> None:
    old, new = contents
    assert unified_diff(old, new, "f") == difflib_diff(old, new, "f")


@pytest.mark.spec("P7", "H3")
@PROPERTY
@given(files())
def test_a_new_files_preview_is_difflibs_diff(content: str) -> None:
    assert unified_diff("", content, "f", created=True) == difflib_diff(
        "", content, "f", created=True
    )


# -- cases where difflib does not diff the replaced span alone ------------------------

# difflib matches the longest runs of lines first, not where the text was replaced:
# a preview built only from the replaced lines would differ from it on these.
BIG = "".join(f"def f{k}():\n    return {k}\n\n" for k in range(80))  # popular blank lines
TRICKY = [
    # a run repeated elsewhere: difflib keeps the first copy, deletes the second
    ("A\nB\nC\nA\nB\nC\nz\n", "A\nB\nC\n", ""),
    # old_string b→c in "a\nb": difflib keeps "b"
    ("x\na\nb\ny\n", "a\nb\n", "b\nc\n"),
    # a blank line added beside a blank line, in a file where blank lines are popular
    (BIG, "    return 3\n", "    return 3\n\n"),
    # a popular-only end of file after the change
    (BIG + "\n\n\n", "    return 79\n", "    return 79 + 1\n"),
    # the block around the insertion occurs again later: difflib matches that copy
    ("p\nq\nr\ns\nM\np\nq\nr\ns\n", "q\nr", "q\nNEW\nr"),
    # a line removed next to an equal one
    ("k\nv\nv\nw\n", "v\nv", "v"),
    # several occurrences, adjacent and far apart
    ("a\nb\na\n" + "c\n" * 300 + "a\n", "a", "A"),
    # a long run through the edited line and the lines after it (difflib keeps the
    # edited line, as the first of the run, and drops the last)
    ("x\n" * 5 + "\n" + "x\n" * 150, "\n\nx", "\n\nqx"),
]


@pytest.mark.spec("P7")
@pytest.mark.parametrize(("text", "old", "new"), TRICKY)
def test_tricky_edits_match_difflib(text: str, old: str, new: str) -> None:
    args = {"path": "f", "old_string": old, "new_string": new, "replace_all": True}
    plan = plan_edit(text.encode(), args, "f", Limits().file_size_bytes)
    assert plan.diff("f") == difflib_diff(plan.old_text, plan.new_text, "f")


@pytest.mark.spec("P7")
def test_a_long_new_file_preview_is_cut_like_difflibs() -> None:
    content = "".join(f"line {k}\n" for k in range(20_000)) + "tail"
    assert unified_diff("", content, "f", created=True) == difflib_diff(
        "", content, "f", created=True
    )
    assert unified_diff(content[:-9], content, "f") == difflib_diff(content[:-9], content, "f")


@pytest.mark.spec("P7")
@pytest.mark.parametrize("at", [0, 4095, 4096, 4097, 20_000, -4097, -4096, -1])
def test_a_write_of_a_long_file_finds_the_change_wherever_it_is(at: int) -> None:
    # The common start and end are found by comparing slices of 4096 characters.
    old = "".join(f"line {k}\n" for k in range(3000))  # 26 kB
    for new in (old[:at] + "X" + old[at:], old[:at] + old[at:][1:], old[:at] + "\n" + old[at:]):
        assert unified_diff(old, new, "f") == difflib_diff(old, new, "f")


# -- and the point of it: real edits take the windows, not difflib --------------------


def stdlib_source(lines: int) -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text() for p in sorted((stdlib / "asyncio").glob("*.py")))
    return "".join(text.splitlines(keepends=True)[:lines])


@pytest.mark.spec("P7")
@pytest.mark.parametrize("lines", [200, 2000])
def test_a_one_line_edit_of_real_source_is_diffed_from_its_window(
    lines: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given real source and an edit of a line of it in the middle
    text = stdlib_source(lines)
    line = next(
        x for x in text.split("\n")[lines // 2 :] if len(x.strip()) > 12 and text.count(x) == 1
    )
    args = {"path": "f", "old_string": line, "new_string": line + "  # edited"}
    plan = plan_edit(text.encode(), args, "f", Limits().file_size_bytes)
    # When its preview is made, Then difflib is not run, and the diff is difflib's
    monkeypatch.setattr(diff.difflib, "unified_diff", _no_difflib)
    preview = plan.diff("f")
    monkeypatch.undo()
    assert preview == difflib_diff(plan.old_text, plan.new_text, "f")
    # nor for a write that changes the same line
    monkeypatch.setattr(diff.difflib, "unified_diff", _no_difflib)
    assert unified_diff(plan.old_text, plan.new_text, "f") == preview


def _no_difflib(*args: object, **kwargs: object) -> None:
    raise AssertionError("difflib ran over the whole file")


@pytest.mark.spec("P7")
def test_count_line_counts_whole_lines_only() -> None:
    text = "ab\nb\nb\nxb\nb"
    assert diff_regions.count_line(text, "b\n", 10) == 2  # not "ab", "xb", nor the last
    assert diff_regions.count_line(text, "b", 10) == 1  # the last line, without newline
    assert diff_regions.count_line(text, "b\n", 1) == 1  # no further than the limit
    assert diff_regions.count_line("\n\n\n", "\n", 10) == 3
