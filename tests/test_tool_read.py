"""The read tool: numbered text, paging, images, directories, clear failures, and the
stamp it leaves in the file-read register (SPEC F1, F2)."""

from __future__ import annotations

import base64
import codecs
import os
from pathlib import Path

import pytest

from toolpool import ImageBlock, TextBlock, ToolError
from toolpool.file_reads import content_hash
from toolpool.registry import ToolSpec
from toolpool.tools import read as read_module
from toolpool.tools import read_tool
from toolpool.tools.support.paths import Resolved
from toolpool.tools.support.stamps import Snapshot

from .support import PNG_1X1
from .tool_support import text, tool_context

GIF_1X1 = base64.b64decode("R0lGODlhAQABAIAAAP///wAAACH5BAEAAAAALAAAAAABAAEAAAICRAEAOw==")
WEBP_HEADER = b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(24)


def numbered(*lines: str, start: int = 1) -> str:
    return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, start=start))


@pytest.mark.spec("F1")
def test_text_comes_back_numbered_like_cat_n(workspace: Path) -> None:
    # Given a small text file
    (workspace / "app.py").write_text("import os\n\nprint(os.getcwd())\n")
    # When it is read
    out = text(read_tool.execute({"path": "app.py"}, tool_context(workspace)))
    # Then every line comes back with its number, right-aligned, and a tab
    assert out == numbered("import os", "", "print(os.getcwd())")


@pytest.mark.spec("F1")
def test_crlf_and_bom_are_not_shown(workspace: Path) -> None:
    (workspace / "win.txt").write_bytes(codecs.BOM_UTF8 + b"first\r\nsecond\r\n")
    out = text(read_tool.execute({"path": "win.txt"}, tool_context(workspace)))
    assert out == numbered("first", "second")


@pytest.mark.spec("F1", "F2")
def test_offset_and_limit_page_and_say_the_file_continues(workspace: Path) -> None:
    # Given a file of 10 lines
    (workspace / "ten.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    ctx = tool_context(workspace)
    # When lines 3-5 are read
    out = text(read_tool.execute({"path": "ten.txt", "offset": 3, "limit": 3}, ctx))
    # Then they come back with their own numbers, and a note says how to go on
    body, note = out.split("\n\n")
    assert body == numbered("line 3", "line 4", "line 5", start=3)
    assert note.startswith("[Lines 3-5 of 10 shown.")
    assert 'read(path="ten.txt", offset=6, limit=5) shows the rest.' in note
    assert "edit and write need every line shown" in note


@pytest.mark.spec("F1")
def test_the_default_limit_is_2000_lines(workspace: Path) -> None:
    (workspace / "long.txt").write_text("x\n" * 2500)
    out = text(read_tool.execute({"path": "long.txt"}, tool_context(workspace)))
    assert "  2000\tx\n\n[Lines 1-2000 of 2500 shown" in out
    assert "  2001\t" not in out


@pytest.mark.spec("F1")
def test_an_offset_past_the_end_is_an_error(workspace: Path) -> None:
    (workspace / "short.txt").write_text("one\ntwo\n")
    with pytest.raises(ToolError, match=r"has 2 lines; offset 5 is past its end"):
        read_tool.execute({"path": "short.txt", "offset": 5}, tool_context(workspace))


@pytest.mark.spec("F1")
def test_long_lines_are_cut_with_a_marker(workspace: Path) -> None:
    (workspace / "min.js").write_text("a" * 2500 + "\nshort\n")
    out = text(read_tool.execute({"path": "min.js"}, tool_context(workspace)))
    first, second = out.split("\n")
    assert first == f"     1\t{'a' * 2000}… [line cut: 500 more characters]"
    assert second == "     2\tshort"


@pytest.mark.spec("F1", "F2")
def test_an_empty_file_says_so(workspace: Path) -> None:
    (workspace / "empty.txt").write_bytes(b"")
    ctx = tool_context(workspace)
    assert text(read_tool.execute({"path": "empty.txt"}, ctx)) == "empty.txt is empty."
    stamp = ctx.files.get(workspace / "empty.txt")
    assert stamp is not None
    assert not stamp.partial


# --- F2: the stamp ----------------------------------------------------------------


@pytest.mark.spec("F2")
@pytest.mark.parametrize(
    ("window", "partial"),
    [
        ({}, False),
        ({"offset": 1, "limit": 3}, False),  # a window covering every line is whole
        ({"offset": 1, "limit": 2}, True),
        ({"offset": 2}, True),
    ],
)
def test_F2_read_records_time_mtime_whole_file_hash_and_partial(
    workspace: Path, window: dict[str, int], partial: bool
) -> None:
    # Given a file of three lines
    path = workspace / "code.py"
    path.write_text("a = 1\nb = 2\nc = 3\n")
    ctx = tool_context(workspace)
    # When it is read, whole or in part
    read_tool.execute({"path": "code.py", **window}, ctx)
    # Then the register holds its stamp: mtime, size, the hash of the WHOLE file's
    # bytes (whatever part was shown), and whether only part was shown
    stamp = ctx.files.get(path)
    assert stamp is not None
    assert stamp.mtime_ns == path.stat().st_mtime_ns
    assert stamp.size == path.stat().st_size
    assert stamp.content_hash == content_hash(path.read_bytes())
    assert stamp.partial is partial
    assert stamp.read_at > 0


@pytest.mark.spec("F2")
def test_F2_a_failed_read_records_nothing(workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02")
    ctx = tool_context(workspace)
    with pytest.raises(ToolError):
        read_tool.execute({"path": "blob.bin"}, ctx)
    assert len(ctx.files) == 0


@pytest.mark.spec("F2")
def test_F2_a_stamp_describes_the_file_as_it_was_read(workspace: Path) -> None:
    # Given a snapshot of a file (its stat taken as it was opened, then its bytes)
    path = workspace / "a.txt"
    path.write_text("old\n")
    snapshot = Snapshot.take(path)
    # When the file changes afterwards, keeping its size
    os.utime(path, ns=(0, snapshot.mtime_ns + 1_000_000_000))
    # Then a stamp made from it later still describes the file as it was read, so
    # the register sees the change
    assert snapshot.stamp(partial=False).mtime_ns != path.stat().st_mtime_ns
    assert snapshot.stamp(partial=False).content_hash == content_hash(b"old\n")


# --- images, directories ----------------------------------------------------------


@pytest.mark.spec("F1")
@pytest.mark.parametrize(
    ("name", "data", "media_type"),
    [
        ("pixel.png", PNG_1X1, "image/png"),
        ("pixel.gif", GIF_1X1, "image/gif"),
        ("photo.jpg", b"\xff\xd8\xff\xe0" + bytes(16), "image/jpeg"),
        ("pic.webp", WEBP_HEADER, "image/webp"),
        ("no_extension", PNG_1X1, "image/png"),  # detected by content, not by name
    ],
)
def test_images_come_back_as_image_blocks(
    workspace: Path, name: str, data: bytes, media_type: str
) -> None:
    # Given an image file
    (workspace / name).write_bytes(data)
    ctx = tool_context(workspace)
    # When it is read
    blocks = read_tool.execute_content({"path": name}, ctx)
    # Then a short text names it, and an image block carries its bytes and media type
    assert isinstance(blocks[0], TextBlock)
    assert blocks[0].text.startswith(f"Image {name} ({media_type}")
    image = blocks[1]
    assert isinstance(image, ImageBlock)
    assert image.media_type == media_type
    assert base64.b64decode(image.data) == data
    stamp = ctx.files.get(workspace / name)
    assert stamp is not None
    assert not stamp.partial


@pytest.mark.spec("F1")
def test_a_file_named_like_an_image_is_judged_by_its_content(workspace: Path) -> None:
    (workspace / "fake.png").write_text("not really a picture\n")
    output = read_tool.execute_content({"path": "fake.png"}, tool_context(workspace))
    assert text(output) == numbered("not really a picture")


@pytest.mark.spec("F1")
def test_a_directory_comes_back_as_a_listing(workspace: Path) -> None:
    # Given a directory with files, a subdirectory and an ignored cache
    src = workspace / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "deep.py").write_text("")
    (src / "main.py").write_text("")
    (src / "__pycache__").mkdir()
    # When it is read
    out = text(read_tool.execute({"path": "src"}, tool_context(workspace)))
    # Then its entries are listed, one level, directories first
    assert out == "src is a directory with 2 entries:\npkg/\nmain.py"


@pytest.mark.spec("F1")
def test_an_empty_directory_says_so(workspace: Path) -> None:
    (workspace / "void").mkdir()
    out = text(read_tool.execute({"path": "void"}, tool_context(workspace)))
    assert out == "void is an empty directory."


# --- failures ---------------------------------------------------------------------


@pytest.mark.spec("F1")
def test_binary_files_are_refused(workspace: Path) -> None:
    (workspace / "lib.so").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(100))
    with pytest.raises(ToolError, match=r"lib.so is a binary file \(108 bytes\)"):
        read_tool.execute({"path": "lib.so"}, tool_context(workspace))


@pytest.mark.spec("F1")
def test_a_missing_file_suggests_near_names_and_the_same_name_elsewhere(
    workspace: Path,
) -> None:
    # Given a project where app.py lives in src/, and config.py in two places
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("")
    (workspace / "lib").mkdir()
    (workspace / "lib" / "config.py").write_text("")
    (workspace / "src" / "config.py").write_text("")
    ctx = tool_context(workspace)
    # When the model misspells a name, Then the close name is offered
    with pytest.raises(ToolError) as caught:
        read_tool.execute({"path": "src/ap.py"}, ctx)
    assert caught.value.message == "Path does not exist: src/ap.py. Did you mean src/app.py?"
    # When it looks in the wrong directory, Then the files of that name are offered
    with pytest.raises(ToolError) as caught:
        read_tool.execute({"path": "config.py"}, ctx)
    assert "Files with the same name: lib/config.py, src/config.py." in caught.value.message
    # When the directory does not exist either, Then it says so
    with pytest.raises(ToolError, match=r"Its directory nope does not exist either"):
        read_tool.execute({"path": "nope/app.py"}, ctx)


@pytest.mark.spec("F1")
def test_a_permission_error_is_explained(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a file the process may not open (simulated: tests may run as root, whom
    # file modes do not stop)
    (workspace / "locked.txt").write_text("private\n")

    def refuse(target: Resolved, shown: str) -> Snapshot:
        raise PermissionError(13, "Permission denied", str(target.path))

    monkeypatch.setattr(read_module, "read_snapshot", refuse)
    # When it is read, Then the error says so in words
    with pytest.raises(ToolError, match=r"Permission denied: locked.txt cannot be read"):
        read_tool.execute({"path": "locked.txt"}, tool_context(workspace))


@pytest.mark.spec("F1")
def test_a_named_pipe_is_refused_without_blocking(workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    with pytest.raises(ToolError, match=r"not a regular file"):
        read_tool.execute({"path": "pipe"}, tool_context(workspace))


# --- the contract -----------------------------------------------------------------


@pytest.mark.spec("F1", "T2", "T3")
def test_read_is_read_only_concurrency_safe_and_names_its_file(workspace: Path) -> None:
    spec = ToolSpec(read_tool)
    args = {"path": "src/app.py"}
    assert spec.read_only(args)
    assert spec.concurrency_safe(args)
    assert spec.label() == "Read"
    assert spec.activity(args) == "Reading src/app.py"
    assert spec.permissions == ("read",)
    assert spec.file_paths(args, tool_context(workspace)) == [
        workspace.resolve() / "src" / "app.py"
    ]
