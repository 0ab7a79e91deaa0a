"""P6 and P7 where the call runs: a tool's ``validate`` and ``preview``, and what their
answers make of the call (SPEC P6, P7, L10).

Both run in the process that runs the call's ``execute`` — a worker, under the
call's limits, or the embedder's own process with the in-process executor — never
in the daemon: their cost grows with the tool's input (a preview diffs the whole
file, a stale refusal diffs what was read against what is there, a notebook is
parsed), and the daemon's event loop serves every session. The rules of what a
verdict, an exception or an oversized preview becomes live here, once, for both
places: ``refusal``, ``failed_as`` and ``capped``; the worker and the in-process
executor each drive the two steps in their own way (a worker has no event loop).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from toolpool.models import ErrorCode, ToolCall, ToolResult
from toolpool.outcomes import result_from_exception
from toolpool.tool import Preview, ValidationResult

# A preview travels as an event to the session's client and, under a gate, in the
# approval request: past this many characters it is cut, and says so.
PREVIEW_CHARS = 100_000


def cut_note(limit: int = PREVIEW_CHARS) -> str:
    """The last line of a text cut at ``limit`` characters (a preview, a diff). No
    line of a diff starts with "…", so a diff that ends with it was cut."""
    return f"… cut at {limit} characters\n"


def refusal(call: ToolCall, verdict: ValidationResult) -> ToolResult | None:
    """P6: the result of a call its tool's ``validate`` refused; None when it passed."""
    if verdict.ok:
        return None
    message = verdict.message or f'arguments for "{call.name}" failed validation'
    details = {"validation_code": verdict.code}
    if verdict.details:
        details = {**verdict.details, **details}
    return ToolResult.error(call, ErrorCode.VALIDATION_FAILED, message, details)


def not_a_verdict(value: object) -> TypeError:
    return TypeError(f"validate returned {type(value).__name__}, not ValidationResult")


def failed_as(call: ToolCall, exc: BaseException, code: ErrorCode) -> ToolResult:
    """A tool's validate or preview raised: an error result under that step's code —
    unless it met a limit (an edit too big to build), which stays ``limit_exceeded``
    (X7)."""
    result = result_from_exception(call, exc)
    if result.error_code is ErrorCode.LIMIT_EXCEEDED:
        return result
    return dataclasses.replace(result, error_code=code)


def capped(preview: Any, limit: int = PREVIEW_CHARS) -> tuple[Any, bool]:
    """P7: the preview as it is sent (a tool's ``Preview`` unwrapped to its text), and
    whether it was cut — by the tool (a diff stops at its cap) or here, at ``limit``
    characters of text, or of a JSON-able value's JSON (the value then becomes that
    text, cut)."""
    truncated = False
    if isinstance(preview, Preview):
        preview, truncated = preview.text, preview.truncated
    if isinstance(preview, str):
        if len(preview) <= limit:
            return preview, truncated or preview.endswith(cut_note(limit))
        return _cut(preview, limit), True
    try:
        text = json.dumps(preview, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # a key JSON has no form for, a cycle: its repr
        text = repr(preview)
        return _cut(text, limit), truncated or len(text) > limit
    if len(text) <= limit:
        return preview, truncated
    return _cut(text, limit), True


def _cut(text: str, limit: int) -> str:
    """``text`` cut at its last line end within ``limit`` (mid-line when it has none),
    with the note."""
    if len(text) <= limit:
        return text
    end = text.rfind("\n", 0, limit) + 1 or limit
    return text[:end] + ("" if text[end - 1 : end] == "\n" else "\n") + cut_note(limit)
