"""PDF files as ``read`` shows them (SPEC F8): their text page by page, with ``pypdf``.

Each page comes under a header ``--- Page 3 of 12 ---``; a page without extractable
text (a scanned image, a drawing) says so. ``pages`` ("3", "3-5", 1-based) picks
pages; without it the first ``DEFAULT_PAGES`` are shown, and the output says how to
read on. At most ``MAX_PAGES`` pages and ``MAX_CHARS`` characters per read.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolpool.errors import ToolError

if TYPE_CHECKING:  # pypdf is imported by the first PDF read: 25 MB a process otherwise
    from pypdf import PdfReader

DEFAULT_PAGES = 20
MAX_PAGES = 20
MAX_CHARS = 100_000
_PAGES = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")

# pypdf logs its warnings about a file's oddities (a damaged xref it repaired…):
# nothing the model or the daemon's log needs.
logging.getLogger("pypdf").setLevel(logging.ERROR)


def is_pdf(data: bytes) -> bool:
    """A PDF starts with ``%PDF-`` (readers allow junk before it, within 1 KiB)."""
    return b"%PDF-" in data[:1024]


def page_range(pages: str) -> tuple[int, int]:
    """``pages`` ("3" or "3-5") as a 1-based, inclusive (first, last); a ToolError
    that says what is wrong with it."""
    match = _PAGES.fullmatch(pages)
    if match is None:
        raise ToolError(f'pages must be a page number or a range like "3-5", not {pages!r}.')
    first = int(match.group(1))
    last = int(match.group(2) or first)
    if first < 1:
        raise ToolError(f"pages counts from 1: {pages!r} has a page 0.")
    if last < first:
        raise ToolError(f"pages {pages!r} ends before it starts: write the lower page first.")
    return first, last


@dataclass(frozen=True, slots=True)
class PdfText:
    """What read shows of a PDF; ``partial`` when not every page was shown whole."""

    text: str
    partial: bool


def pdf_text(data: bytes, shown: str, pages: str | None) -> PdfText:
    """The text of the PDF ``data`` (the file ``shown``), of ``pages`` or the first
    ones; a ToolError for an encrypted or unreadable PDF, or pages past its end."""
    chosen = None if pages is None else page_range(pages)
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _opened(reader):
            raise ToolError(
                f"{shown} is an encrypted PDF (it needs a password); its text cannot be read."
            )
        count = len(reader.pages)
    except ToolError:
        raise
    except Exception as exc:  # pypdf raises many kinds for a damaged or odd file
        raise ToolError(f"{shown} is a PDF that cannot be read: {exc}.") from None
    if count == 0:
        return PdfText(f"PDF {shown} has no pages.", False)
    first, last = chosen or (1, min(count, DEFAULT_PAGES))
    if first > count:
        raise ToolError(f"{shown} has {count} {_pages(count)}; pages {pages} starts past its end.")
    asked_last = last
    last = min(last, count, first + MAX_PAGES - 1)
    parts = [f"PDF {shown}: {count} {_pages(count)}."]
    size = 0
    cut_at = None
    for number in range(first, last + 1):
        text = _page_text(reader, number - 1)
        if size + len(text) > MAX_CHARS:
            text = text[: max(MAX_CHARS - size, 0)] + "\n[page cut here: the read's text limit]"
            cut_at = number
        parts.append(f"--- Page {number} of {count} ---\n{text}")
        size += len(text)
        if cut_at is not None:
            last = number
            break
    notes = []
    if asked_last > count:
        notes.append(f"The document ends at page {count}.")
    if cut_at is not None:
        notes.append(
            f"Text cut at page {cut_at} ({MAX_CHARS:,} characters per read): "
            f'read on with pages="{cut_at}-{min(cut_at + MAX_PAGES - 1, count)}", or fewer pages.'
        )
    elif last < count and (chosen is None or asked_last > last):
        notes.append(
            f"Pages {first}-{last} of {count} shown; at most {MAX_PAGES} per read. "
            f'Read on with pages="{last + 1}-{min(last + MAX_PAGES, count)}".'
        )
    if notes:
        parts.append(f"[{' '.join(notes)}]")
    partial = first > 1 or last < count or cut_at is not None
    return PdfText("\n".join(parts), partial)


def _opened(reader: PdfReader) -> bool:
    """Whether an encrypted PDF opens without a password (many do: only their
    permissions are set)."""
    try:
        from pypdf import PasswordType

        return bool(reader.decrypt("") != PasswordType.NOT_DECRYPTED)
    except Exception:  # an encryption pypdf cannot undo: as good as a password
        return False


def _page_text(reader: PdfReader, index: int) -> str:
    try:
        text = reader.pages[index].extract_text().strip()
    except Exception as exc:  # one bad page does not spoil the others
        return f"[The text of this page could not be extracted: {exc}.]"
    return text or "[No extractable text on this page: it may be a scanned image or a drawing.]"


def _pages(count: int) -> str:
    return "page" if count == 1 else "pages"
