"""File text as the model sees it and as it is written back.

The model reads lines split on ``\\n`` (a ``\\r`` before it is not shown) and writes
``\\n``. A ``TextDocument`` keeps what the model does not see — a UTF-8 byte order
mark and CRLF line endings — so that an edit puts them back.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

MAX_LINE_CHARS = 2000


def cut_line(line: str, limit: int = MAX_LINE_CHARS) -> str:
    """``line``, cut after ``limit`` characters with a marker saying how much is left."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]}… [line cut: {len(line) - limit} more characters]"


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` without their endings; a final newline ends the last line
    rather than starting an empty one. Only ``\\n`` separates lines, as in editors."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" not in text:  # most files: no line has an ending to take off
        return lines
    return [line.removesuffix("\r") for line in lines]


def line_of(text: str, index: int) -> int:
    """The 1-based line number of character ``index`` of ``text``."""
    return text.count("\n", 0, index) + 1


@dataclass(frozen=True, slots=True)
class TextDocument:
    """A UTF-8 text file's content with its BOM and CRLF endings taken out.

    ``crlf`` is set only when every line ending is CRLF; a file with mixed endings is
    kept as it is (its ``\\r`` characters stay in ``text``), so that an edit does not
    rewrite lines it did not touch.
    """

    text: str
    bom: bool
    crlf: bool

    @classmethod
    def decode(cls, data: bytes) -> TextDocument:
        """Decode a file's bytes; raises UnicodeDecodeError when they are not UTF-8."""
        bom = data.startswith(codecs.BOM_UTF8)
        text = data[len(codecs.BOM_UTF8) :].decode("utf-8") if bom else data.decode("utf-8")
        # Counting CRLFs costs twice a count of newlines: only a text with a \r has any.
        crlf = "\r" in text and text.count("\r\n") == text.count("\n") > 0
        return cls(text.replace("\r\n", "\n") if crlf else text, bom, crlf)

    def normalise(self, model_text: str) -> str:
        """Text from the model in this document's form (LF when the file is CRLF)."""
        return model_text.replace("\r\n", "\n") if self.crlf else model_text

    def encode(self, text: str) -> bytes:
        """``text`` (in this document's form) as file bytes, with the BOM and CRLF
        endings put back."""
        if self.crlf:
            text = text.replace("\n", "\r\n")
        data = text.encode("utf-8")
        return codecs.BOM_UTF8 + data if self.bom else data
