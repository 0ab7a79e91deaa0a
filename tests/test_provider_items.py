"""The providers' own tools in the formats and profiles, without a daemon (E10, F15–F18):
OpenAI's call items read and answered, the declarations each format gives, which
profile lists and offers what, the call names an anthropic session renames, and
OpenAI's apply_patch checked against the OpenAI Agents SDK's own V4A applier.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
from agents.apply_diff import apply_diff

from toolpool import ToolCall, ToolResult
from toolpool.declared import DECLARATIONS, ITEM_TOOLS
from toolpool.engine.session import Session
from toolpool.models import ErrorCode, TextBlock
from toolpool.profiles import PROFILES, definition_name, in_profile, lists, offers, owners
from toolpool.providers import (
    definitions,
    detect_call_format,
    parse_tool_calls,
    results_to_openai_responses,
)
from toolpool.registry import ToolRegistry
from toolpool.session_options import SessionOptions
from toolpool.tools import PROVIDER_TOOLS, TOOLS, apply_patch_tool
from toolpool.tools.openai_patch import OpenAIApplyPatch, operation_problem, patch_of
from toolpool.tools.support.edit_history import MAX_VERSION_BYTES, MAX_VERSIONS, EditHistory

from .tool_support import tool_context

spec = pytest.mark.spec
REGISTRY = ToolRegistry(TOOLS)
SHELL_ITEM = {
    "type": "shell_call", "id": "sh_1", "call_id": "c2", "status": "completed",
    "action": {"commands": ["ls"], "timeout_ms": 1000},
}  # fmt: skip
PATCH_ITEM = {
    "type": "apply_patch_call", "id": "apc_1", "call_id": "c1", "status": "completed",
    "operation": {"type": "delete_file", "path": "a.txt"},
}  # fmt: skip
LOCAL_ITEM = {
    "type": "local_shell_call", "id": "lsh_1", "call_id": "c3", "status": "completed",
    "action": {"type": "exec", "command": ["ls"], "env": {}},
}  # fmt: skip


# --- calls in -------------------------------------------------------------------------------


@spec("E10")
def test_E10_openai_items_are_calls_of_their_tools_in_any_shape() -> None:
    function = {"type": "function_call", "id": "fc", "call_id": "c0", "name": "read",
                "arguments": '{"path": "x"}'}  # fmt: skip
    output = [function, PATCH_ITEM, SHELL_ITEM, LOCAL_ITEM]
    expected = [
        ToolCall("c0", "read", {"path": "x"}),
        ToolCall("c1", "openai_apply_patch", {"operation": PATCH_ITEM["operation"]}),
        ToolCall("c2", "openai_shell", {"action": SHELL_ITEM["action"]}),
        ToolCall("c3", "openai_local_shell", {"action": LOCAL_ITEM["action"]}),
    ]
    assert parse_tool_calls(output) == expected  # the bare output list, detected
    assert parse_tool_calls({"output": output}) == expected  # a response
    assert parse_tool_calls([PATCH_ITEM], "openai-responses") == expected[1:2]
    assert detect_call_format([SHELL_ITEM]) == "openai-responses"
    # what answers them is no call, in a conversation's input list
    answered = [{"type": "shell_call_output", "call_id": "c2", "output": []},
                {"type": "apply_patch_call_output", "call_id": "c1", "status": "completed"},
                {"type": "local_shell_call_output", "id": "c3", "output": "{}"}]  # fmt: skip
    assert parse_tool_calls(answered) == []


@spec("E10")
def test_E10_an_item_without_its_call_id_is_refused_naming_it() -> None:
    broken = {k: v for k, v in SHELL_ITEM.items() if k != "call_id"}
    with pytest.raises(ValueError, match=r"output\[0\] has no 'call_id'"):
        parse_tool_calls([broken], "openai-responses")


# --- results out ----------------------------------------------------------------------------


def result(tool: str, text: str = "", *, error: bool = False, **details: Any) -> ToolResult:
    code = ErrorCode.EXECUTION_FAILED if error else None
    return ToolResult("c", tool, (TextBlock(text),), error, code, details)


@spec("E10", "F16")
def test_E10_results_are_answered_in_their_tools_item_types() -> None:
    entries = [{"stdout": "a\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    answered = results_to_openai_responses(
        [
            result("openai_apply_patch", "Created a.txt"),
            result("openai_apply_patch", "nope", error=True),
            result("openai_shell", "$ ls", shell_output=entries, max_output_length=10),
            result("openai_shell", "Invalid arguments", error=True),
            result("openai_local_shell", '{"output": ""}'),
            result("read", "hello"),
        ]
    )
    assert answered == [
        {"type": "apply_patch_call_output", "call_id": "c", "status": "completed",
         "output": "Created a.txt"},
        {"type": "apply_patch_call_output", "call_id": "c", "status": "failed", "output": "nope"},
        {"type": "shell_call_output", "call_id": "c", "output": entries, "max_output_length": 10},
        {"type": "shell_call_output", "call_id": "c", "output": [
            {"stdout": "", "stderr": "Invalid arguments",
             "outcome": {"type": "exit", "exit_code": 1}}]},
        {"type": "local_shell_call_output", "id": "c", "output": '{"output": ""}'},
        {"type": "function_call_output", "call_id": "c", "output": "hello"},
    ]  # fmt: skip


@spec("F16", "L4")
def test_F16_a_shell_result_the_turns_budget_cut_answers_with_what_the_model_may_see() -> None:
    # A result cut to its share (L4) keeps its details: the answer must not carry more
    # than the cut text, whatever the details hold.
    entries = [{"stdout": "x" * 50_000, "stderr": "", "outcome": {"type": "exit", "exit_code": 2}}]
    cut = result("openai_shell", "xxx [47000 characters cut here]", shell_output=entries,
                 output_cut={"share": 100})  # fmt: skip
    (item,) = results_to_openai_responses([cut])
    assert item["output"] == [
        {"stdout": "xxx [47000 characters cut here]", "stderr": "",
         "outcome": {"type": "exit", "exit_code": 2}}
    ]  # fmt: skip


# --- declarations out, and who is offered what -----------------------------------------------


@spec("E10")
def test_E10_each_format_declares_its_providers_tools_and_leaves_out_the_others() -> None:
    specs = list(REGISTRY)
    declared = {name for name, _ in DECLARATIONS.items()}
    for format in ("openai", "gemini", "mcp", "langchain"):
        names = {definition_name(d) for d in definitions(specs, format)}
        assert not names & declared, format
    anthropic = [d for d in definitions(specs, "anthropic") if "type" in d]
    assert anthropic == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    responses = [d for d in definitions(specs, "openai-responses") if d["type"] != "function"]
    assert responses == [{"type": "apply_patch"}, {"type": "shell"}, {"type": "local_shell"}]
    assert {"bash", "read"} <= {definition_name(d) for d in definitions(specs, "anthropic")}


@spec("E10", "F12")
def test_E10_profiles_list_their_providers_tools_and_openais_items_run_everywhere() -> None:
    assert PROFILES["openai"] == ("openai_apply_patch", "openai_shell")
    assert PROFILES["anthropic"] == ("anthropic_bash", "anthropic_text_editor")
    for tool in PROVIDER_TOOLS:
        assert tool.name in DECLARATIONS
    for profile in PROFILES:
        # OpenAI's call items are no function call: every session runs them
        assert all(offers(profile, tool) for tool in ITEM_TOOLS.values())
        # Anthropic's names mean its tools in its profile's sessions only
        assert offers(profile, "anthropic_bash") is (profile == "anthropic")
        # listed only where their profile lists them; local_shell nowhere
        assert lists(profile, "openai_shell") is (profile == "openai")
        assert not lists(profile, "openai_local_shell")
        assert lists(profile, "word_count")  # a user's tool: every profile's
    assert owners("openai_local_shell") == ()
    specs = list(REGISTRY)
    assert in_profile(definitions(specs, "openai-responses"), "openai") == [
        {"type": "apply_patch"},
        {"type": "shell"},
    ]
    assert [d["name"] for d in in_profile(definitions(specs, "anthropic"), "anthropic")] == [
        "bash",
        "str_replace_based_edit_tool",
    ]


@spec("F17")
def test_F17_an_anthropic_session_renames_anthropics_names_and_no_other_does(
    tmp_path: Path,
) -> None:
    calls = [
        ToolCall("1", "bash", {"command": "ls"}),
        ToolCall("2", "str_replace_based_edit_tool", {"command": "view", "path": "."}),
        ToolCall("3", "str_replace_editor", {"command": "undo_edit", "path": "a"}),
        ToolCall("4", "read", {"path": "a"}),
    ]
    anthropic = Session(tmp_path, options=SessionOptions.parse({"tool_profile": "anthropic"}))
    toolpool = Session(tmp_path)
    try:
        renamed = anthropic.named(calls)
        assert [c.name for c in renamed] == [
            "anthropic_bash", "anthropic_text_editor", "anthropic_text_editor", "read",
        ]  # fmt: skip
        pairs = zip(renamed, calls, strict=True)
        assert [dataclasses.replace(c, name=o.name) for c, o in pairs] == calls
        assert toolpool.named(calls) is calls  # nothing to rename: the same list
    finally:
        anthropic.close()
        toolpool.close()


# --- F15: the same engine as Codex's patches, checked against OpenAI's own applier -------------

V4A_UPDATES = [
    "@@\n a\n-b\n+B\n c\n",  # context above and below
    "@@ def f():\n-    return 1\n+    return 2\n",  # a header line, then the change
    "@@\n a\n+inserted\n b\n",  # only an added line, between context lines
    "@@\n-a\n+A\n@@\n-e\n+E\n",  # two hunks, in the file's order
    "@@\n d\n-e\n+E\n*** End of File\n",  # a hunk at the file's end
    " a\n-b\n+B\n",  # the first hunk without its @@
]
FILE = "a\nb\nc\ndef f():\n    return 1\nd\ne\n"


@spec("F15")
@pytest.mark.parametrize("diff", V4A_UPDATES)
def test_F15_an_update_leaves_what_openais_own_v4a_applier_leaves(
    tmp_path: Path, diff: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.py").write_text(FILE)
    ctx = tool_context(workspace, scratch_dir=tmp_path / "scratch")
    tool = OpenAIApplyPatch(apply_patch_tool)
    args = {"operation": {"type": "update_file", "path": "f.py", "diff": diff}}
    assert operation_problem(args["operation"]) is None
    assert tool.validate(args, ctx).ok
    assert tool.execute(args, ctx) == "Updated f.py"
    assert (workspace / "f.py").read_text() == apply_diff(FILE, diff)


@spec("F15")
def test_F15_a_created_file_ends_with_a_newline_where_the_agents_sdks_does_not(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    ctx = tool_context(workspace, scratch_dir=tmp_path / "scratch")
    diff = "+line one\n+line two\n"
    args = {"operation": {"type": "create_file", "path": "n.txt", "diff": diff}}
    OpenAIApplyPatch(apply_patch_tool).execute(args, ctx)
    assert (workspace / "n.txt").read_text() == apply_diff("", diff, mode="create") + "\n"


@spec("F15")
def test_F15_the_call_and_the_codex_patch_it_is_leave_the_same_bytes(tmp_path: Path) -> None:
    # Given two copies of one workspace
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    (first / "f.py").write_text(FILE)
    shutil.copytree(first, second)
    operation = {"type": "update_file", "path": "f.py", "diff": V4A_UPDATES[1]}
    # When one gets the apply_patch_call and the other the built-in with its patch
    OpenAIApplyPatch(apply_patch_tool).execute(
        {"operation": operation}, tool_context(first, scratch_dir=tmp_path / "s1")
    )
    apply_patch_tool.execute(
        {"input": patch_of(operation)}, tool_context(second, scratch_dir=tmp_path / "s2")
    )
    # Then the files are byte for byte the same
    assert (first / "f.py").read_bytes() == (second / "f.py").read_bytes()


# --- F18: what undo_edit keeps ------------------------------------------------------------


@spec("F18", "X8")
def test_F18_the_undo_history_is_private_bounded_and_never_skips_a_change(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    history = EditHistory(scratch, tmp_path / "ws" / "a.py")
    # Given more versions than it keeps
    for n in range(MAX_VERSIONS + 3):
        history.push(f"version {n}".encode())
    # Then the newest ten are kept, in private files
    kept = [p for p in (scratch / "editor").rglob("*") if p.is_file()]
    assert len(kept) == MAX_VERSIONS
    assert {p.stat().st_mode & 0o777 for p in kept} == {0o600}
    assert (scratch / "editor").stat().st_mode & 0o777 == 0o700
    assert history.last() == f"version {MAX_VERSIONS + 2}".encode()
    history.drop_last()
    assert history.last() == f"version {MAX_VERSIONS + 1}".encode()
    # And a version too big to keep drops the history: an undo cannot skip back past it
    history.push(b"x" * (MAX_VERSION_BYTES + 1))
    assert history.last() is None
    # Another file's history is its own
    other = EditHistory(scratch, tmp_path / "ws" / "b.py")
    other.push(b"b")
    assert other.last() == b"b" and history.last() is None
