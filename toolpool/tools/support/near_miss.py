"""Why edit's ``old_string`` was not found, when the reason can be seen: text that is
in the file but for its whitespace, or but for its line endings. A model that knows
which, fixes its next call instead of guessing."""

from __future__ import annotations

from toolpool.tools.support.text import line_of

# At most this many lines of the file are quoted back.
_MAX_QUOTED_LINES = 20


def _squeeze(line: str) -> str:
    """A line without any whitespace: what is left to compare when only spacing and
    indentation differ."""
    return "".join(line.split())


def whitespace_match(text: str, old: str) -> tuple[int, str] | None:
    """Where ``old`` is in ``text`` if whitespace is ignored: the 1-based line of the
    first such place and the file's lines there; None when there is none."""
    wanted = [_squeeze(line) for line in old.split("\n")]
    while wanted and not wanted[0]:
        wanted.pop(0)
    while wanted and not wanted[-1]:
        wanted.pop()
    if not wanted:
        return None
    lines = text.split("\n")
    squeezed = [_squeeze(line) for line in lines]
    n = len(wanted)
    for i in range(len(lines) - n + 1):
        window = squeezed[i : i + n]
        # old_string may start inside its first line and stop inside its last one.
        if n == 1:
            hit = wanted[0] in window[0]
        else:
            hit = (
                window[0].endswith(wanted[0])
                and window[1:-1] == wanted[1:-1]
                and window[-1].startswith(wanted[-1])
            )
        if hit:
            return i + 1, "\n".join(lines[i : i + min(n, _MAX_QUOTED_LINES)])
    return None


def not_found_message(text: str, old: str, shown: str) -> str:
    """The error for an ``old_string`` that is not in ``text`` (the file ``shown``)."""
    base = f"old_string was not found in {shown}."
    if "\r" in text or "\r" in old:
        lf_text, lf_old = text.replace("\r\n", "\n"), old.replace("\r\n", "\n")
        if lf_old in lf_text:
            line = line_of(lf_text, lf_text.index(lf_old))
            why = (
                "old_string has CRLF (\\r\\n) line endings and the file has LF (\\n)"
                if "\r" not in text
                else "the file mixes CRLF (\\r\\n) and LF (\\n) endings, and old_string's "
                "differ from the file's there"
            )
            return (
                f"{base} It is there, at line {line}, except for line endings: {why}. "
                "Send old_string with the file's line endings, or edit a smaller piece "
                "that does not span a line end."
            )
    found = whitespace_match(text, old)
    if found is not None:
        line, quoted = found
        return (
            f"{base} It is there except for whitespace or indentation, at line {line}; "
            f"the file has:\n{quoted}\nCopy old_string exactly as read shows it: the "
            "file's text starts after the tab that follows each line number."
        )
    return (
        f"{base} Read the file again and copy old_string exactly, including whitespace "
        "and indentation, without the line-number prefix."
    )
