"""OpenAI's own tools in the Responses API: their call items in, their output items out.

The documented shapes (platform.openai.com/docs/api-reference/responses, and the
``openai`` SDK's types: ``ResponseApplyPatchToolCall``, ``ResponseFunctionShellToolCall``,
``LocalShellCall`` and the input items that answer them)::

    output item  {"type": "apply_patch_call", "id": "apc_1", "call_id": "call_1",
                  "status": "completed",
                  "operation": {"type": "update_file", "path": "a.py", "diff": "@@ …"}}
    input item   {"type": "apply_patch_call_output", "call_id": "call_1",
                  "status": "completed" | "failed", "output": "Updated a.py"}
    output item  {"type": "shell_call", "id": "sh_1", "call_id": "call_2",
                  "status": "completed",
                  "action": {"commands": ["ls"], "timeout_ms": 5000, "max_output_length": 4096}}
    input item   {"type": "shell_call_output", "call_id": "call_2", "max_output_length": 4096,
                  "output": [{"stdout": "…", "stderr": "",
                              "outcome": {"type": "exit", "exit_code": 0}}]}
    output item  {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_3",
                  "status": "completed",
                  "action": {"type": "exec", "command": ["ls"], "env": {}}}
    input item   {"type": "local_shell_call_output", "id": "call_3", "output": "{…}"}

A call item becomes a ToolCall of the tool that runs it (``toolpool.profiles.declared``),
its one argument the item's ``operation`` or ``action`` (checked at P5 against the
tool's schema, so a malformed one is that call's error result, answered in its own
item type). A ``shell_call`` whose ``environment`` is not ``local`` (a container
OpenAI runs) is OpenAI's to run, and skipped. Results are answered by the tool they
name: ``apply_patch_call_output`` for ``openai_apply_patch``… (``item_output``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolpool.models import JSONObject, ToolCall, ToolResult
from toolpool.profiles.declared import (
    ITEM_ARGUMENTS,
    ITEM_OUTPUTS,
    ITEM_TOOLS,
    OPENAI_APPLY_PATCH,
    OPENAI_LOCAL_SHELL,
)
from toolpool.providers.payload import required_text

# What a shell_call's result details hold (toolpool.tools.openai_shell writes them).
SHELL_OUTPUT = "shell_output"
MAX_OUTPUT_LENGTH = "max_output_length"


def item_call(item: Mapping[str, Any], where: str) -> ToolCall | None:
    """The call of one of OpenAI's own tools that ``item`` is; None for any other item
    (and for a shell call in a container OpenAI runs)."""
    kind = item.get("type")
    tool = ITEM_TOOLS.get(kind) if isinstance(kind, str) else None
    if tool is None or (kind == "shell_call" and not _local(item)):
        return None
    field = ITEM_ARGUMENTS[str(kind)]
    arguments: JSONObject = {field: item[field]} if field in item else {}
    return ToolCall(required_text(item, "call_id", where), tool, arguments)


def _local(item: Mapping[str, Any]) -> bool:
    environment = item.get("environment")
    return not isinstance(environment, Mapping) or environment.get("type") in (None, "local")


def answers_as_item(result: ToolResult) -> bool:
    """Whether ``result`` is answered by an item of its own type (``item_output``)."""
    return result.tool_name in ITEM_OUTPUTS


def item_output(result: ToolResult) -> JSONObject:
    """The input item that answers the call ``result`` ends, in its tool's item type."""
    kind = ITEM_OUTPUTS[result.tool_name]
    if result.tool_name == OPENAI_APPLY_PATCH:
        return {
            "type": kind,
            "call_id": result.call_id,
            "status": "failed" if result.is_error else "completed",
            "output": result.text,
        }
    if result.tool_name == OPENAI_LOCAL_SHELL:
        # Its ``id`` is the call's id; ``output`` a string (the JSON of Codex's exec
        # output when the command ran, the error's text when it did not).
        return {"type": kind, "id": result.call_id, "output": result.text}
    item: JSONObject = {"type": kind, "call_id": result.call_id, "output": _shell_output(result)}
    limit = result.details.get(MAX_OUTPUT_LENGTH)
    if isinstance(limit, int) and not isinstance(limit, bool):
        item["max_output_length"] = limit
    return item


_FAILED: JSONObject = {"type": "exit", "exit_code": 1}


def _shell_output(result: ToolResult) -> list[JSONObject]:
    """Each command's stdout, stderr and outcome, as the tool recorded them. A call
    that ran no command (refused, denied, cancelled) is one entry whose stderr says
    why; a result the turn's output budget cut (L4) is one entry of the text the
    model may see, with the last command's outcome."""
    outputs = result.details.get(SHELL_OUTPUT)
    if not _entries(outputs):
        return [{"stdout": "", "stderr": result.text, "outcome": dict(_FAILED)}]
    assert isinstance(outputs, list)
    if "output_cut" in result.details:
        last = outputs[-1]["outcome"] if outputs else _FAILED
        return [{"stdout": result.text, "stderr": "", "outcome": dict(last)}]
    return [
        {"stdout": entry["stdout"], "stderr": entry["stderr"], "outcome": dict(entry["outcome"])}
        for entry in outputs
    ]


def _entries(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(entry, Mapping)
            and isinstance(entry.get("stdout"), str)
            and isinstance(entry.get("stderr"), str)
            and isinstance(entry.get("outcome"), Mapping)
            for entry in value
        )
    )
