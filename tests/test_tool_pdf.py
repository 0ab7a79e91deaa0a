"""read of a PDF: its text page by page, pages ranges, pages without text, encrypted
files, and the stamp it leaves (SPEC F8, F2)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from toolpool import ToolError
from toolpool.tools import read_tool
from toolpool.tools.support import pdf

from .tool_support import text, tool_context


def make_pdf(pages: list[str | None]) -> bytes:
    """A PDF written by hand: one Helvetica text line per line of each page's text,
    in a content stream; a page given as None holds only a drawn line (no text, as
    a scan has none)."""
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(len(pages))), len(pages)),
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    for i, page_text in enumerate(pages):
        page, content = 4 + 2 * i, 5 + 2 * i
        objects[page] = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % content
        )
        if page_text is None:
            stream = b"0 0 m 200 200 l S"
        else:
            lines = []
            for k, line in enumerate(page_text.split("\n")):
                escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
                lines.append(f"BT /F1 12 Tf 72 {720 - 14 * k} Td ({escaped}) Tj ET")
            stream = "\n".join(lines).encode("latin-1")
        objects[content] = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream)
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = out.tell()
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, objects[number]))
    xref = out.tell()
    size = max(objects) + 1
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % size)
    out.write(b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, size)))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref))
    return out.getvalue()


def encrypted(data: bytes, password: str) -> bytes:
    writer = PdfWriter(clone_from=io.BytesIO(data))
    writer.encrypt(user_password=password, owner_password="owner", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def read(workspace: Path, **args: object) -> str:
    return text(read_tool.execute_content({"path": "doc.pdf", **args}, tool_context(workspace)))


@pytest.fixture
def three(workspace: Path) -> Path:
    path = workspace / "doc.pdf"
    path.write_bytes(make_pdf(["Hello page one\nsecond line", None, "Third (page)"]))
    assert len(PdfReader(path).pages) == 3  # a PDF pypdf itself takes as one
    return path


@pytest.mark.spec("F8", "F1")
def test_F8_a_pdf_comes_back_as_text_by_page(workspace: Path, three: Path) -> None:
    # When a PDF is read, Then each page's text comes under its header, and a page
    # without text says so
    assert read(workspace) == (
        "PDF doc.pdf: 3 pages.\n"
        "--- Page 1 of 3 ---\nHello page one\nsecond line\n"
        "--- Page 2 of 3 ---\n"
        "[No extractable text on this page: it may be a scanned image or a drawing.]\n"
        "--- Page 3 of 3 ---\nThird (page)"
    )


@pytest.mark.spec("F8")
@pytest.mark.parametrize(
    ("pages", "shown", "note"),
    [
        ("3", [3], ""),
        ("2-3", [2, 3], ""),
        (" 1 - 1 ", [1], ""),
        ("2-9", [2, 3], "\n[The document ends at page 3.]"),
    ],
)
def test_F8_pages_picks_pages(
    workspace: Path, three: Path, pages: str, shown: list[int], note: str
) -> None:
    out = read(workspace, pages=pages)
    assert [
        int(line.split()[2]) for line in out.splitlines() if line.startswith("--- Page")
    ] == shown
    assert out.endswith(note)


@pytest.mark.spec("F8")
@pytest.mark.parametrize(
    ("pages", "message"),
    [
        ("0", "pages counts from 1: '0' has a page 0."),
        ("5-3", "pages '5-3' ends before it starts: write the lower page first."),
        ("x", "pages must be a page number or a range like \"3-5\", not 'x'."),
        ("1,2", "pages must be a page number or a range like \"3-5\", not '1,2'."),
        ("4", "doc.pdf has 3 pages; pages 4 starts past its end."),
    ],
)
def test_F8_bad_pages_are_refused_with_the_reason(
    workspace: Path, three: Path, pages: str, message: str
) -> None:
    with pytest.raises(ToolError) as caught:
        read(workspace, pages=pages)
    assert caught.value.message == message


@pytest.mark.spec("F8")
def test_F8_pages_is_for_pdfs_only(workspace: Path) -> None:
    (workspace / "a.txt").write_text("x\n")
    with pytest.raises(ToolError, match=r"^pages applies to PDF files only; a.txt is not one"):
        read_tool.execute({"path": "a.txt", "pages": "1"}, tool_context(workspace))


@pytest.mark.spec("F8", "F2")
def test_F8_a_large_pdf_shows_its_first_pages_and_how_to_read_on(workspace: Path) -> None:
    # Given a PDF of 45 pages
    path = workspace / "doc.pdf"
    path.write_bytes(make_pdf([f"text of page {n}" for n in range(1, 46)]))
    ctx = tool_context(workspace)
    # When it is read without pages, Then the first 20 come, with how to read on
    out = text(read_tool.execute({"path": "doc.pdf"}, ctx))
    assert out.count("--- Page ") == pdf.DEFAULT_PAGES == 20
    assert out.endswith(
        '[Pages 1-20 of 45 shown; at most 20 per read. Read on with pages="21-40".]'
    )
    stamp = ctx.files.get(path)
    assert stamp is not None and stamp.partial  # not every page was shown
    # And a range over 20 pages is cut to 20, saying so
    out = text(read_tool.execute({"path": "doc.pdf", "pages": "30-45"}, ctx))
    assert out.count("--- Page ") == 16
    out = text(read_tool.execute({"path": "doc.pdf", "pages": "1-45"}, ctx))
    assert out.count("--- Page ") == 20
    assert out.endswith('Read on with pages="21-40".]')


@pytest.mark.spec("F8")
def test_F8_the_text_of_one_read_is_bounded(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pdf, "MAX_CHARS", 40)
    (workspace / "doc.pdf").write_bytes(make_pdf(["a" * 30, "b" * 30, "c" * 30]))
    out = read(workspace)
    assert "--- Page 3" not in out
    assert "b" * 10 + "\n[page cut here: the read's text limit]" in out
    assert out.endswith('read on with pages="2-3", or fewer pages.]')


@pytest.mark.spec("F8")
def test_F8_an_encrypted_pdf_says_so(workspace: Path) -> None:
    (workspace / "doc.pdf").write_bytes(encrypted(make_pdf(["secret"]), "pw"))
    with pytest.raises(ToolError) as caught:
        read(workspace)
    assert caught.value.message == (
        "doc.pdf is an encrypted PDF (it needs a password); its text cannot be read."
    )


@pytest.mark.spec("F8")
def test_F8_an_encrypted_pdf_without_a_user_password_is_read(workspace: Path) -> None:
    (workspace / "doc.pdf").write_bytes(encrypted(make_pdf(["open to all"]), ""))
    assert read(workspace).endswith("--- Page 1 of 1 ---\nopen to all")


@pytest.mark.spec("F8")
def test_F8_a_damaged_pdf_is_refused_not_a_crash(workspace: Path) -> None:
    (workspace / "doc.pdf").write_bytes(b"%PDF-1.4\n" + b"\x00garbage" * 10)
    with pytest.raises(ToolError, match=r"^doc.pdf is a PDF that cannot be read: "):
        read(workspace)
