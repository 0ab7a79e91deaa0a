"""The reasons of toolpool's refusals and errors (``ValidationResult.reason``,
``ToolError.reason``): stable names a tool profile words its own refusals from
(``profiles/claude_code.py``, the Anthropic editor's), never toolpool's English.

The tools decide them and word toolpool's sentences beside that decision (F3's in
``tools/support/stamps.py``, edit's in ``tools/support/edit_plan.py``, a missing path's in
``tools/support/suggest.py``); the names are here, low in the import graph, because the
profiles read them and the client's side imports the profiles' table (which must
import no tool). So is F3's code-2 refusal, worded from its details alone: the tool
says it in the session's profile's spelling, and a profile words its own from the
same details (SPEC F14).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from toolpool.call_forms import quote, read_arguments, read_call


class Reason(StrEnum):
    """Why a tool refused or failed, where a profile may say it in its own words."""

    NOT_READ = "not_read"  # F3, code 2: never read
    PARTLY_READ = "partly_read"  # F3, code 2: some of it never shown
    CHANGED = "changed"  # F3, code 3, in validate: read it again
    CHANGED_SHOWN = "changed_shown"  # F3, code 3: the refusal showed the whole file
    CHANGED_BEFORE_WRITE = "changed_before_write"  # F3, code 3 at execute: nothing written
    NOT_FOUND = "not_found"  # edit: old_string is not in the file
    AMBIGUOUS = "ambiguous"  # edit: it is there more than once (details: "occurrences")
    NO_CHANGE = "no_change"  # edit: old_string and new_string are the same
    NO_FILE = "no_file"  # the path does not exist
    PERMISSION_DENIED = "permission_denied"  # the OS refused (EACCES, EPERM)


# --- F3's code-2 refusal, and the read that lifts it (F14) -----------------------------

# What a note of a file shown in part (a read's window, a cut output) says F3 asks;
# the Anthropic editor says it with its own tools' names.
WHOLE_READ_NEEDED = "edit and write need every line shown (reads of parts of it add up)."


def unread_reason(details: Mapping[str, Any]) -> str:
    """The reason of a code-2 refusal with these details."""
    return Reason.PARTLY_READ if details.get("partly_read") else Reason.NOT_READ


def fix_call(details: Mapping[str, Any], profile: str) -> str | None:
    """The read a code-2 refusal's details name, in ``profile``'s spelling; None when
    they name none or the profile has no read tool."""
    fix = details.get("read_first")
    if not isinstance(fix, Mapping) or not isinstance(fix.get("path"), str):
        return None
    return read_call(profile, *read_arguments(fix))


def not_read_message(details: Mapping[str, Any], profile: str = "toolpool") -> str:
    """F3's code-2 refusal (of ``edit``, ``write`` and the tools sharing their guard)
    worded from its details (``tools/support/stamps.py``'s ``unread_details``): what was not
    read, and the read that lifts it in ``profile``'s spelling (F14)."""
    name = quote(str(details["read_first"]["path"]))
    call = fix_call(details, profile)
    if not details.get("partly_read"):
        first = f"File {name} has not been read yet. Read it first before writing to it"
        return f"{first}: {call}." if call else f"{first}."
    return f"File {name} was only partly read{unread_part(details)}.{read_first(details, profile)}"


def unread_part(details: Mapping[str, Any]) -> str:
    """What of a partly read file was never shown, from a code-2 refusal's details:
    a clause that follows "was only partly read"."""
    gaps = details.get("missing_lines")
    if not gaps:
        return " (not every part of it was shown)"
    one = len(gaps) == 1 and gaps[0][0] == gaps[0][1]
    return (
        f": {_spans(gaps)} of its {details['total_lines']} lines "
        f"{'was' if one else 'were'} never shown"
    )


def read_first(details: Mapping[str, Any], profile: str) -> str:
    """The sentence naming the read a code-2 refusal's details name (with a space
    before it), in ``profile``'s spelling; "" when there is none to name."""
    call = fix_call(details, profile)
    if call is None:
        return ""
    gaps = details.get("missing_lines") or []
    what = "them" if len(gaps) > 1 or (gaps and gaps[0][0] != gaps[0][1]) else "it"
    return f" Read {what} first: {call}."


def _spans(gaps: list[Any]) -> str:
    words = [f"line {a}" if a == b else f"lines {a}-{b}" for a, b in gaps[:4]]
    if len(gaps) > 4:
        words.append(f"{len(gaps) - 4} more spans")
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
