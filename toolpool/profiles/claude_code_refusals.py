"""Claude Code's refusals: the sentences a Claude Code model knows by heart ("File has
not been read yet. Read it first before writing to it.", "String to replace not found
in file."…), said in place of toolpool's by each refusal's reason and details
(``toolpool.refusals``), never by reading toolpool's English; toolpool's explanation
follows them where it tells more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolpool.adapter import Adapter, Refusal
from toolpool.refusals import Reason, fix_call, not_read_message
from toolpool.tool import Arguments

PROFILE = "claude-code"

# Claude Code's own sentences (its Edit, Write and NotebookEdit refusals).
NOT_READ = "File has not been read yet. Read it first before writing to it."
MODIFIED = "File has been modified since read, either by the user or by a linter."
MODIFIED_READ_AGAIN = f"{MODIFIED} Read it again before attempting to write it."
UNEXPECTEDLY_MODIFIED = (
    "File has been unexpectedly modified. Read it again before attempting to write it."
)
NOT_FOUND = "String to replace not found in file."
NO_CHANGES = "No changes to make: old_string and new_string are exactly the same."
NO_FILE = "File does not exist."
MATCHES = (
    "Found {count} matches of the string to replace, but replace_all is false. To replace "
    "all occurrences, set replace_all to true. To replace only one occurrence, please "
    "provide more context to uniquely identify the instance."
)

# A refusal's reason → Claude Code's sentence in place of toolpool's first one, with
# toolpool's explanation after it (what changed).
_INSTEAD_OF_FIRST: dict[str, str] = {
    Reason.CHANGED: MODIFIED_READ_AGAIN,
    Reason.CHANGED_SHOWN: MODIFIED,  # the refusal showed the whole file: a read
    Reason.CHANGED_BEFORE_WRITE: UNEXPECTEDLY_MODIFIED,
}


def refusal(refused: Refusal, args: Arguments) -> str:
    """A read-before-write refusal (SPEC F3) or an edit's error in Claude Code's
    words, from its reason and details, toolpool's explanation after them when it
    says more; others as they are. ``args`` are the call's (Claude Code's)
    arguments: the edit's old_string is quoted back, as Claude Code does (a
    MultiEdit's failing edit's, ``edit_index``). A refusal of a file not read whole
    is worded from its details alone, naming the Read that lifts it (F14)."""
    details = refused.details
    if refused.reason in (Reason.NOT_READ, Reason.PARTLY_READ) and "read_first" in details:
        return not_read(details)
    if refused.reason in _INSTEAD_OF_FIRST:
        return f"{_INSTEAD_OF_FIRST[refused.reason]}\n\n{refused.explanation.strip()}".strip()
    index = details.get("edit_index")
    prefix = ""
    old = args.get("old_string")
    if isinstance(index, int):
        prefix = f"edits[{index}]: "
        edits = args.get("edits") or []
        old = edits[index].get("old_string") if index < len(edits) else None
    quoted = "" if old is None else f"\nString: {old}"
    body = refused.message.removeprefix(prefix)
    return prefix + _claude_sentence(refused.reason, body, quoted, details)


def not_read(details: Mapping[str, Any]) -> str:
    """F3's code-2 refusal in Claude Code's words, from its details: its sentence,
    then what was not shown and the Read that shows it."""
    if not details.get("partly_read"):
        call = fix_call(details, PROFILE)
        return f"{NOT_READ}\n\nRead it with {call}." if call else NOT_READ
    return f"{NOT_READ}\n\n{not_read_message(details, PROFILE)}"


def _claude_sentence(reason: str, body: str, quoted: str, details: Mapping[str, Any]) -> str:
    """Claude Code's sentence for an edit's refusal of this ``reason`` (toolpool's
    ``body`` after it, where it tells more); ``body`` alone for the others."""
    if reason == Reason.NOT_FOUND:
        return f"{NOT_FOUND}{quoted}\n\n{body}"
    if reason == Reason.AMBIGUOUS:
        return f"{MATCHES.format(count=details['occurrences'])}{quoted}\n\n{body}"
    if reason == Reason.NO_CHANGE:
        return NO_CHANGES
    if reason == Reason.NO_FILE:
        return f"{NO_FILE}\n\n{body}"
    return body


class ClaudeCodeTool(Adapter):
    """A Claude Code tool: its refusals in Claude Code's words."""

    profile = PROFILE

    def refused(self, refused: Refusal, args: Arguments) -> str:
        return refusal(refused, args)
