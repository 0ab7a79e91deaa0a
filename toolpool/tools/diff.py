"""Unified diffs: the preview (SPEC P7) of edit and write, for UIs and gates."""

from __future__ import annotations

import difflib

# A preview travels as an event to every client; past this size it says so and stops.
MAX_DIFF_CHARS = 100_000
_NO_NEWLINE = "\\ No newline at end of file\n"


def _lines(text: str) -> list[str]:
    """Lines with their ``\\n`` kept, split on ``\\n`` only (as the tools count lines)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(old: str, new: str, name: str, *, created: bool = False) -> str:
    """The unified diff from ``old`` to ``new`` of the file ``name`` (3 lines of
    context); ``created`` diffs from ``/dev/null``. Empty when nothing changes."""
    out: list[str] = []
    size = 0
    for line in difflib.unified_diff(
        _lines(old),
        _lines(new),
        fromfile="/dev/null" if created else f"a/{name}",
        tofile=f"b/{name}",
    ):
        # difflib leaves a last line without its newline as it is; say so as diff does.
        text = line if line.endswith("\n") else f"{line}\n{_NO_NEWLINE}"
        if size + len(text) > MAX_DIFF_CHARS:
            out.append(f"… diff cut at {MAX_DIFF_CHARS} characters\n")
            break
        out.append(text)
        size += len(text)
    return "".join(out)
