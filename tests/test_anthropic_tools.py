"""Anthropic's own client tools through a real daemon: ``bash_20250124`` (F17) and the
text editor ``str_replace_based_edit_tool`` (F18), in a session of the ``anthropic``
tool profile, and the declarations of both providers' tools (E10).

Each model output is an ``anthropic.types.Message`` built with the SDK's classes,
submitted as it is; ``results_as("anthropic")`` is checked strictly against the
SDK's ``MessageParam`` for the next request. No request leaves the machine. Every
command is tried for what it does, for the errors Anthropic documents, for
toolpool's guards on top (read-before-write, a file changed since) and against a
path outside the session's roots.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic.types as anthropic_types
import openai.types.responses as responses_types
import pytest

from toolpool import Client, ToolResult
from toolpool.client import ApprovalRequested
from toolpool.models import ErrorCode
from toolpool.profiles import definition_name, owners

from .daemon_support import Daemon, shared_daemon
from .test_providers_sdk import valid

spec = pytest.mark.spec
EDITOR = "str_replace_based_edit_tool"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("anthropic")) as started:
        yield started


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as connected:
        yield connected


@pytest.fixture
def arena(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace (``a.py``, ``sub/b.txt``, a hidden ``.git/config``, a symlink
    ``out`` to a directory outside) and that outside directory."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "a.py").write_text("one\ntwo\nthree\nfour\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.txt").write_text("b\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / "out").symlink_to(outside)
    (outside / "secret.txt").write_text("secret\n")
    return workspace, outside


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b""
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def message(*uses: tuple[str, dict[str, Any]]) -> anthropic_types.Message:
    """Claude's reply: a text block, then a tool_use block per (name, input)."""
    return anthropic_types.Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=[
            anthropic_types.TextBlock(type="text", text="On it."),
            *(
                anthropic_types.ToolUseBlock(type="tool_use", id=f"toolu_{i}", name=n, input=a)
                for i, (n, a) in enumerate(uses)
            ),
        ],
        stop_reason="tool_use",
        stop_sequence=None,
        usage=anthropic_types.Usage(input_tokens=100, output_tokens=50),
    )


def editor(command: str, path: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    return EDITOR, {"command": command, "path": path, **arguments}


def bash(**arguments: Any) -> tuple[str, dict[str, Any]]:
    return "bash", arguments


class Claude:
    """An anthropic session: each reply one turn, answered as the next request's
    user message (checked against the SDK's ``MessageParam``)."""

    def __init__(self, client: Client, workspace: Path, **options: Any) -> None:
        self._session = client.session(workspace, tool_profile="anthropic", **options)

    def __enter__(self) -> Claude:
        return self

    def __exit__(self, *_: object) -> None:
        self._session.close()

    def turn(self, *uses: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        turn = self._session.submit(message(*uses))
        results: tuple[ToolResult, ...] = turn.results(timeout=60)
        reply = valid(anthropic_types.MessageParam, turn.results_as("anthropic", timeout=60))
        blocks: list[dict[str, Any]] = reply["content"]
        assert [b["tool_use_id"] for b in blocks] == [r.call_id for r in results]
        assert [b["is_error"] for b in blocks] == [r.is_error for r in results]
        return blocks

    def one(self, use: tuple[str, dict[str, Any]]) -> tuple[str, bool]:
        (block,) = self.turn(use)
        return text(block), block["is_error"]


def text(block: dict[str, Any]) -> str:
    return "\n".join(part["text"] for part in block.get("content", []) if part["type"] == "text")


# --- F17: bash_20250124 ---------------------------------------------------------------------


@spec("F17")
def test_F17_one_persistent_shell_that_restart_clears(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    # Given an anthropic session whose shell option is the default (not persistent)
    with Claude(client, workspace) as claude:
        # When one command leaves a variable, a function and a directory behind
        out, error = claude.one(bash(command='export WHO=me; cd sub; hi() { echo "hi $WHO"; }'))
        assert (out, error) == ("(no output)", False)
        # Then the next command has them (bash_20250124 is one persistent session)
        assert claude.one(bash(command="hi; basename $PWD")) == ("hi me\nsub", False)
        # And restart clears them: the next command starts afresh in the workspace
        assert claude.one(bash(restart=True)) == ("tool has been restarted.", False)
        out, error = claude.one(bash(command='echo "[$WHO]"; type hi; pwd'))
    assert not error
    assert out.startswith("[]\n") and "hi: not found" in out
    assert str(workspace.resolve()) in out.splitlines()
    assert "Exit code" not in out  # an exit code shows only when not 0


@spec("F17")
def test_F17_errors_and_exit_codes(client: Client, arena: tuple[Path, Path]) -> None:
    workspace, _ = arena
    with Claude(client, workspace) as claude:
        blocks = claude.turn(
            bash(),  # neither command nor restart
            bash(command="echo oops >&2; exit 3"),
            bash(command="nonexistentcommand"),
            bash(restart=True, command="echo fresh"),
        )
    assert blocks[0]["is_error"] and "no command provided" in text(blocks[0])
    assert (text(blocks[1]), blocks[1]["is_error"]) == ("oops\nExit code: 3", False)
    assert "command not found" in text(blocks[2]) and "Exit code: 127" in text(blocks[2])
    assert text(blocks[3]) == "tool has been restarted.\nfresh"


@spec("F17", "X1")
def test_F17_commands_are_confined(client: Client, arena: tuple[Path, Path]) -> None:
    workspace, outside = arena
    before = tree(outside)
    with Claude(client, workspace) as claude:
        blocks = claude.turn(
            bash(command=f"echo owned > {outside}/secret.txt"),
            bash(command="echo owned > out/secret.txt; touch out/new.txt"),
        )
    assert all("Exit code: " in text(b) for b in blocks)  # each one failed
    assert tree(outside) == before


@spec("F17", "F12")
def test_F17_bash_means_anthropics_tool_only_in_an_anthropic_session(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    with client.session(workspace) as session:  # the toolpool profile
        results = session.submit(
            message(bash(restart=True), ("anthropic_bash", {"command": "true"}))
        ).results(timeout=60)
    assert [r.tool_name for r in results] == ["bash", "anthropic_bash"]
    assert results[0].error_code is ErrorCode.INVALID_ARGUMENTS  # toolpool's bash
    assert results[1].error_code is ErrorCode.TOOL_NOT_FOUND
    assert 'tool of the "anthropic" tool profile' in results[1].text


# --- F18: the text editor -------------------------------------------------------------------


@spec("F18")
def test_F18_view_a_file_a_range_and_a_directory(client: Client, arena: tuple[Path, Path]) -> None:
    workspace, _ = arena
    with Claude(client, workspace) as claude:
        blocks = claude.turn(
            editor("view", "a.py"),
            editor("view", str(workspace / "a.py"), view_range=[2, 3]),
            editor("view", "a.py", view_range=[3, -1]),
            editor("view", "."),
        )
    whole, middle, end, listing = map(text, blocks)
    assert whole == "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour"
    assert middle.startswith("     2\ttwo\n     3\tthree\n\n[Lines 2-3 of 4 shown.")
    assert f'{EDITOR}(command="view", path="a.py", view_range=[4, 4]) shows the rest' in middle
    assert "str_replace and insert need every line shown" in middle
    assert end.startswith("     3\tthree\n     4\tfour\n\n[Lines 3-4 of 4 shown.")
    assert listing.splitlines()[0] == (
        "Here's the files and directories up to 2 levels deep in ., excluding hidden items:"
    )
    assert "sub/" in listing and "b.txt" in listing and ".git" not in listing


@spec("F18", "F5")
def test_F18_create_str_replace_insert_and_undo_edit(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    new = workspace / "pkg" / "new.py"
    with Claude(client, workspace) as claude:
        blocks = claude.turn(
            editor("create", "pkg/new.py", file_text="def f():\n    return 1\n"),
            # created whole: it may be changed with no view (F5)
            editor("str_replace", "pkg/new.py", old_str="return 1", new_str="return 2"),
            editor("insert", "pkg/new.py", insert_line=0, insert_text='"""A module."""'),
            editor("insert", "pkg/new.py", insert_line=3, insert_text="# end"),
        )
        assert [text(b) for b in blocks] == [
            "File created successfully at: pkg/new.py",
            "Successfully replaced text at exactly one location.",
            "Successfully inserted text at the top of the file in pkg/new.py.",
            "Successfully inserted text after line 3 in pkg/new.py.",
        ]
        assert new.read_text() == '"""A module."""\ndef f():\n    return 2\n# end\n'
        # undo_edit, of the older versions (str_replace_editor), steps back one change
        # at a time, the file's history its own
        undo = ("str_replace_editor", {"command": "undo_edit", "path": "pkg/new.py"})
        assert claude.one(undo) == ("Last edit to pkg/new.py undone successfully.", False)
        assert new.read_text() == '"""A module."""\ndef f():\n    return 2\n'
        claude.turn(undo, undo)
        assert new.read_text() == "def f():\n    return 1\n"
        out, error = claude.one(undo)
    assert error and out == "Error: No edit history found for pkg/new.py."


@spec("F18")
@pytest.mark.parametrize(
    ("use", "says"),
    [
        (editor("view", "missing.py"), "Error: File not found\n\nPath does not exist: missing.py"),
        (editor("create", "a.py", file_text="x"),
         "Error: File already exists at: a.py. Cannot overwrite files using command `create`."),
        (editor("str_replace", "a.py", old_str="five", new_str="5"),
         "Error: No match found for replacement. Please check your text and try again."),
        (editor("str_replace", "a.py", old_str="o", new_str="0"),
         "Error: Found 3 matches for replacement text. Please provide more context to make a "
         "unique match.\n\nold_str occurs 3 times in a.py (lines 1, 2, 4)."),
        (editor("insert", "a.py", insert_line=9, insert_text="x"),
         "Error: Invalid `insert_line` parameter: 9. It should be within the range of lines "
         "of the file: [0, 4]"),
        (editor("view", "sub", view_range=[1, 2]),
         "Error: The `view_range` parameter is not allowed when `path` points to a directory."),
        (editor("view", "a.py", view_range=[9, -1]), "Error: Invalid `view_range`: [9, -1]."),
        (editor("create", "c.py"), "Error: Parameter `file_text` is required for command: create"),
        (editor("str_replace", "missing.py", old_str="a", new_str="b"),
         "Error: File not found\n\nFile does not exist: missing.py."),
        (editor("undo_edit", "a.py"), "Error: No edit history found for a.py."),
    ],
)  # fmt: skip
def test_F18_the_documented_errors(
    client: Client, arena: tuple[Path, Path], use: tuple[str, dict[str, Any]], says: str
) -> None:
    workspace, _ = arena
    before = tree(workspace)
    with Claude(client, workspace) as claude:
        claude.turn(editor("view", "a.py"))  # viewed whole: only the command's error is left
        out, error = claude.one(use)
    assert error
    assert out.startswith(says)
    assert tree(workspace) == before


@spec("F18", "F3", "F9", "F14")
def test_F18_toolpools_guards_view_before_a_change_and_no_change_unseen(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    with Claude(client, workspace) as claude:
        # Never viewed: refused, naming the view that lifts the refusal (F3, F14)
        out, error = claude.one(editor("str_replace", "a.py", old_str="two", new_str="2"))
        assert error and f'{EDITOR}(command="view", path="a.py")' in out
        # Viewed in part: refused, naming the view of the lines never shown
        claude.turn(editor("view", "a.py", view_range=[1, 2]))
        out, error = claude.one(editor("insert", "a.py", insert_line=1, insert_text="x"))
        assert error and f'{EDITOR}(command="view", path="a.py", view_range=[3, 4])' in out
        # Viewed whole, then changed by someone else: refused, showing the change (F9)
        claude.turn(editor("view", "a.py", view_range=[3, -1]))  # the parts add up (F13)
        (workspace / "a.py").write_text("one\nTWO\nthree\nfour\n")
        out, error = claude.one(editor("str_replace", "a.py", old_str="one", new_str="1"))
        assert error and "-two\n+TWO" in out
        # The refusal showed the whole file: the retry needs no view
        assert claude.one(editor("str_replace", "a.py", old_str="one", new_str="1")) == (
            "Successfully replaced text at exactly one location.",
            False,
        )
    assert (workspace / "a.py").read_text() == "1\nTWO\nthree\nfour\n"


@spec("F18", "X4")
@pytest.mark.parametrize(
    "use",
    [
        editor("view", "{outside}/secret.txt"), editor("view", "out/secret.txt"),
        editor("view", "../outside"), editor("view", "/"),
        editor("create", "out/new.txt", file_text="owned"),
        editor("create", "../outside/new.txt", file_text="owned"),
        editor("str_replace", "out/secret.txt", old_str="secret", new_str="owned"),
        editor("str_replace", "{outside}/secret.txt", old_str="secret", new_str="owned"),
        editor("insert", "out/secret.txt", insert_line=0, insert_text="owned"),
        editor("undo_edit", "../outside/secret.txt"),
    ],
)  # fmt: skip
def test_F18_a_path_outside_the_roots_is_refused_for_every_command(
    client: Client, arena: tuple[Path, Path], use: tuple[str, dict[str, Any]]
) -> None:
    workspace, outside = arena
    before = tree(outside)
    name, arguments = use
    arguments = {**arguments, "path": arguments["path"].format(outside=outside)}
    with Claude(client, workspace) as claude:
        out, error = claude.one((name, arguments))
    assert error and out.startswith("Error: Access denied")
    assert "secret\n" not in out
    assert tree(outside) == before


# --- E10: the providers' declarations ---------------------------------------------------------


@spec("E10")
def test_E10_each_profile_lists_its_providers_declarations(client: Client) -> None:
    anthropic = client.tools("anthropic", profile="anthropic")
    openai = client.tools("openai-responses", profile="openai")
    # (this daemon has tools of no profile too, tests.worker_tools: they come after)
    assert anthropic[:2] == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    assert openai[:2] == [{"type": "apply_patch"}, {"type": "shell"}]
    assert not any(owners(definition_name(d)) for d in [*anthropic[2:], *openai[2:]])
    # ready for the SDKs' requests, as their own types have them
    for declared in anthropic[:2]:
        valid(anthropic_types.ToolUnionParam, declared)
    for declared in openai[:2]:
        valid(responses_types.ToolParam, declared)
    # Other profiles list none of them, in any format; every tool lists them all
    for format in ("toolpool", "openai", "openai-responses", "anthropic", "gemini", "mcp"):
        listed = json.dumps(client.tools(format, profile="toolpool"))
        assert "openai_" not in listed and "anthropic_" not in listed
        assert 'apply_patch"}' not in listed and "bash_2025" not in listed
    everything = client.tools("openai-responses", profile=None)
    assert {"type": "local_shell"} in everything and {"type": "shell"} in everything


@spec("E10")
def test_E10_toolpool_tools_prints_them_without_a_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolpool.cli import main

    none = str(tmp_path / "none")
    assert main(["tools", "--profile", "anthropic", "--format", "anthropic",
                 "--runtime-dir", none]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out) == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    assert main(["tools", "--profile", "openai", "--format", "openai-responses",
                 "--runtime-dir", none]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out) == [{"type": "apply_patch"}, {"type": "shell"}]


# --- the pipeline around them: previews, the gate, limits ------------------------------------


@spec("F18", "P7", "P8")
def test_F18_the_gate_is_asked_with_the_diff_and_a_view_is_not_asked(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    asked: list[ApprovalRequested] = []

    def approve(request: ApprovalRequested) -> bool:
        asked.append(request)
        return True

    policy = [{"read_only": True, "action": "allow"}, {"permission": "write", "action": "ask"}]
    with Claude(client, workspace, gate="policy", policy=policy, on_approval=approve) as claude:
        claude.turn(editor("view", "a.py"))
        assert asked == []  # a view only reads
        claude.turn(editor("str_replace", "a.py", old_str="two", new_str="2"))
    (request,) = asked
    assert (request.call.name, request.label) == ("anthropic_text_editor", "TextEditor")
    assert "-two\n+2" in request.preview


@spec("F18", "L1")
def test_F18_a_file_over_the_calls_size_limit_is_not_left_behind(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    with Claude(client, workspace, limits={"file_size_bytes": 1000}) as claude:
        out, error = claude.one(editor("create", "big.txt", file_text="x" * 5000))
    assert error and "file size limit" in out
    assert not (workspace / "big.txt").exists()
    assert [p.name for p in workspace.iterdir() if p.name.endswith(".tmp")] == []
