"""Tool profiles (F12): Claude Code's and Codex's tool sets over toolpool's built-ins.

Each profile's session is driven from a fixture of model output in that agent's own
call shapes, through a real daemon; the adapters' translations, their refusals'
wording, and that they add no copy of behaviour (the same call through the adapter
and through the built-in leaves the same bytes on disk) are checked one by one.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client, ToolCall
from toolpool.adapter import Refusal
from toolpool.client import RequestFailed
from toolpool.errors import ToolError
from toolpool.models import ErrorCode, ToolResult
from toolpool.profiles import TOOLPOOL_NAMES, offers, owners
from toolpool.profiles.claude_code_refusals import (
    MODIFIED,
    MODIFIED_READ_AGAIN,
    NOT_FOUND,
    NOT_READ,
    UNEXPECTEDLY_MODIFIED,
    refusal,
)
from toolpool.profiles.codex import command_line, patch_of, split_exit_code
from toolpool.refusals import Reason
from toolpool.tool import InterruptBehavior
from toolpool.tools import (
    BUILTIN_TOOLS,
    PROFILE_TOOLS,
    apply_patch_tool,
    bash,
)
from toolpool.tools.support import stamps

from .daemon_support import Daemon, shared_daemon
from .tool_support import read_whole, text, tool_context

pytestmark = pytest.mark.spec("F12")
FIXTURES = Path(__file__).parent / "fixtures" / "profiles"
ADAPTERS = {tool.name: tool for tool in PROFILE_TOOLS}
PATCH = "*** Begin Patch\n*** Add File: new.txt\n+hello\n*** End Patch"


def project(root: Path) -> Path:
    """The small workspace both fixtures work on."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "calc.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b  # sub\n"
    )
    (root / "src" / "names.py").write_text("OLD = 1\nprint(OLD)\n")
    (root / "tests").mkdir()
    return root


def fixture_turns(name: str, workspace: Path) -> list[Any]:
    data = (FIXTURES / name).read_text().replace("{workspace}", str(workspace))
    turns: list[Any] = json.loads(data)["turns"]
    return turns


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("profiles")) as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as connected:
        yield connected


# -- the fixtures' sessions, through a real daemon ---------------------------------------


def test_F12_a_claude_code_session_from_its_own_tool_use_blocks(
    client: Client, tmp_path: Path
) -> None:
    # Given a workspace and a Claude Code model's turns (Anthropic tool_use blocks)
    workspace = project(tmp_path / "ws")
    turns = fixture_turns("claude_code.json", workspace)
    results: dict[str, ToolResult] = {}
    messages = []
    with client.session(workspace, tool_profile="claude-code") as session:
        # When each assistant message is submitted as it came
        for message in turns[:-1]:
            turn = session.submit(message["content"])
            results.update({r.call_id: r for r in turn.results()})
            messages.append(turn.results_as("anthropic"))
        shell = re.search(r"background shell (\S+):", results["toolu_11"].text)
        assert shell is not None, results["toolu_11"].text
        # the model reads its background build until the line it waits for is there
        poll = json.loads(json.dumps(turns[-1]).replace("{shell}", shell.group(1)))
        for _ in range(200):
            (output,) = session.submit(poll["content"]).results()
            if "build done" in output.text:
                break
        results["toolu_12"] = output

    # Then the refusals read as Claude Code's, the results as toolpool's
    assert results["toolu_01"].is_error
    not_read = f'{NOT_READ}\n\nRead it with Read(file_path="src/calc.py").'
    assert results["toolu_01"].text == not_read
    assert messages[0]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_01",
        "content": [{"type": "text", "text": not_read}],
        "is_error": True,
    }
    assert "src/calc.py:1:def add(a, b):" in results["toolu_02"].text
    assert results["toolu_03"].text.startswith("     1\tdef add(a, b):\n     2\t    return a + b")
    assert "src/names.py" in results["toolu_05"].text
    assert not results["toolu_06"].is_error and not results["toolu_07"].is_error
    assert results["toolu_08"].text.startswith(f"{NOT_FOUND}\nString: not in the file\n\n")
    assert not results["toolu_09"].is_error
    assert results["toolu_10"].text == "2\nExit code: 0"
    assert "build done" in results["toolu_12"].text
    # And the workspace holds what the edits, the MultiEdit and the Write made
    assert (workspace / "src" / "calc.py").read_text().endswith("    return a - b\n")
    assert (workspace / "src" / "names.py").read_text() == "NEW = 1\nprint(NEW)\n"
    assert "def test_sub" in (workspace / "tests" / "test_calc.py").read_text()


def test_F12_a_codex_session_from_its_own_responses_items(client: Client, tmp_path: Path) -> None:
    # Given a workspace and a Codex model's Responses output: shell with argv, a
    # custom_tool_call apply_patch, apply_patch through the shell, a function apply_patch
    workspace = project(tmp_path / "ws")
    turns = fixture_turns("codex.json", workspace)
    with client.session(workspace, tool_profile="codex") as session:
        # When each response is submitted as it came
        submitted = [session.submit(response) for response in turns]
        results = {r.call_id: r for turn in submitted for r in turn.results()}
        answers = submitted[1].results_as("openai-responses")

    # Then the shell answers as Codex's does: the output, with its exit code
    shell = json.loads(results["call_1"].text)
    assert shell["metadata"]["exit_code"] == 3
    assert shell["output"].startswith("def add(a, b):")
    assert json.loads(results["call_6"].text)["output"] == "2"
    # a custom tool call is answered by a custom_tool_call_output, a function call not
    assert [(a["type"], a["call_id"]) for a in answers] == [
        ("custom_tool_call_output", "call_2"),
        ("function_call_output", "call_3"),
    ]
    assert answers[0]["output"].startswith("Success. Updated the following files:\nM src/calc.py")
    patched = json.loads(results["call_3"].text)
    assert patched["output"] == "Success. Updated the following files:\nA NOTES.md\n"
    assert patched["metadata"]["exit_code"] == 0
    assert not results["call_4"].is_error and not results["call_5"].is_error
    # And every patch, whichever shape it came in, is on disk
    assert (workspace / "src" / "calc.py").read_text().endswith("    return a - b\n")
    assert (workspace / "NOTES.md").read_text() == "sub fixed\n"
    assert (workspace / "src" / "names.py").read_text() == "NEW = 1\nprint(NEW)\n"


@pytest.mark.parametrize(
    ("profile", "tool", "arguments", "belongs_to"),
    [
        ("claude-code", "read", {"path": "a.txt"}, "toolpool"),
        ("toolpool", "Read", {"file_path": "a.txt"}, "claude-code"),
        ("codex", "Bash", {"command": "true"}, "claude-code"),
        ("claude-code", "shell", {"command": ["true"]}, "codex"),
    ],
)
def test_F12_a_call_to_another_profiles_tool_is_refused_at_P4_naming_its_profile(
    client: Client,
    workspace: Path,
    profile: str,
    tool: str,
    arguments: dict[str, Any],
    belongs_to: str,
) -> None:
    (workspace / "a.txt").write_text("a\n")
    with client.session(workspace, tool_profile=profile) as session:
        (result,) = session.submit([ToolCall("1", tool, arguments)]).results()
    assert result.error_code is ErrorCode.TOOL_NOT_FOUND
    assert f'tool profile, and this session uses "{profile}"' in result.text
    assert f'tool_profile="{belongs_to}"' in result.text


def test_F12_an_unknown_profile_is_refused_naming_the_profiles(
    client: Client, workspace: Path
) -> None:
    with pytest.raises(
        RequestFailed,
        match="session option tool_profile = 'cursor': expected one of 'toolpool', 'claude-code'",
    ):
        client.session(workspace, tool_profile="cursor")


def test_F12_the_daemons_tools_by_profile(client: Client) -> None:
    names = {d["name"] for d in client.tools("anthropic", profile="claude-code")}
    assert {"Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "Bash"} <= names
    assert not names & set(TOOLPOOL_NAMES)
    codex = [d["function"]["name"] for d in client.tools("openai", profile="codex")]
    # the profile's own, and the daemon's tools of no profile (this daemon's test tools)
    assert {"apply_patch", "shell"} <= set(codex)
    assert all(offers("codex", name) for name in codex) and "read" not in codex
    default = {d["name"] for d in client.tools()}  # the toolpool profile's: no adapter
    assert "read" in default and not default & set(ADAPTERS)


def test_F12_toolpool_tools_prints_a_profiles_definitions_without_a_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolpool.cli import main

    code = main(["tools", "--profile", "codex", "--format", "openai-responses",
                 "--runtime-dir", str(tmp_path / "none")])  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert sorted(d["name"] for d in printed) == ["apply_patch", "shell"]
    shell = next(d for d in printed if d["name"] == "shell")
    assert shell["parameters"]["properties"]["command"]["type"] == "array"


# -- the profile table ---------------------------------------------------------------------


def test_F12_every_built_in_is_in_the_toolpool_profile_and_every_adapter_in_its_own() -> None:
    assert {tool.name for tool in BUILTIN_TOOLS} <= set(TOOLPOOL_NAMES)
    for adapter in PROFILE_TOOLS:
        assert owners(adapter.name) == (adapter.profile,)
    assert offers("codex", "apply_patch") and offers("toolpool", "apply_patch")
    assert offers("claude-code", "word_count")  # a user's tool: every profile's


# -- argument translation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "given", "built_in"),
    [
        ("Read", {"file_path": "/w/a.py", "offset": 0, "limit": 5},
         {"path": "/w/a.py", "limit": 5}),
        ("Read", {"file_path": "a.py", "offset": 3}, {"path": "a.py", "offset": 3}),
        ("Bash", {"command": "make", "timeout": 1500}, {"command": "make", "timeout": 1.5}),
        ("Bash", {"command": "make", "timeout": 600000, "description": "Build"},
         {"command": "make", "timeout": 600.0, "description": "Build"}),
        ("Glob", {"pattern": "*.py", "path": "undefined"}, {"pattern": "*.py"}),
        ("Glob", {"pattern": "*.py", "path": "src"}, {"pattern": "*.py", "path": "src"}),
        ("Grep", {"pattern": "x", "-A": 2, "-B": 1, "-C": 3, "head_limit": 0, "-i": True},
         {"pattern": "x", "-A": 2, "-B": 1, "-C": 3, "-i": True}),
        ("Grep", {"pattern": "x", "head_limit": 7, "output_mode": "count", "path": "null"},
         {"pattern": "x", "head_limit": 7, "output_mode": "count"}),
        ("Edit", {"file_path": "a", "old_string": "o", "new_string": "n", "replace_all": True},
         {"path": "a", "old_string": "o", "new_string": "n", "replace_all": True}),
        ("BashOutput", {"bash_id": "ab12", "filter": "E"}, {"shell_id": "ab12", "filter": "E"}),
        ("KillShell", {"shell_id": "ab12"}, {"shell_id": "ab12"}),
        ("NotebookEdit", {"notebook_path": "n.ipynb", "new_source": "x", "cell_id": "c1"},
         {"path": "n.ipynb", "new_source": "x", "cell_id": "c1"}),
        ("shell", {"command": ["bash", "-lc", "ls -la"], "timeout_ms": 2500},
         {"command": "ls -la", "timeout": 2.5}),
        ("shell", {"command": ["ls", "a b"], "workdir": "/w/src", "timeout_ms": 9000000},
         {"command": "cd -- /w/src && ls 'a b'", "timeout": 600}),
    ],
)  # fmt: skip
def test_F12_arguments_are_translated_to_the_built_ins(
    tool: str, given: dict[str, Any], built_in: dict[str, Any]
) -> None:
    adapter = ADAPTERS[tool]
    assert adapter.arguments(given) == built_in
    assert adapter.target.checker.check(built_in).ok  # the built-in takes them as they are


def test_F12_capabilities_are_the_built_ins_for_the_translated_call() -> None:
    claude_bash, shell = ADAPTERS["Bash"], ADAPTERS["shell"]
    assert claude_bash.call_limits({"command": "x", "timeout": 300000}) == bash.call_limits(
        {"command": "x", "timeout": 300}
    )
    assert ADAPTERS["Read"].read_only({"file_path": "a"}) and not claude_bash.read_only({})
    assert shell.interrupt_behavior({"command": ["sleep", "9"]}) is InterruptBehavior.CANCEL
    # a patch through the shell is apply_patch's: it blocks, as apply_patch does
    patched = {"command": ["apply_patch", PATCH]}
    assert shell.interrupt_behavior(patched) is InterruptBehavior.BLOCK
    assert shell.call_limits(patched) == {} and shell.activity(
        patched
    ) == apply_patch_tool.activity({"input": PATCH})


@pytest.mark.parametrize(
    ("argv", "workdir", "patch"),
    [
        (["apply_patch", PATCH], None, PATCH),
        (["applypatch", PATCH], ".", PATCH),
        (["bash", "-lc", f"apply_patch <<'EOF'\n{PATCH}\nEOF\n"], None, PATCH),
        (["bash", "-lc", f'apply_patch <<"EOF"\n{PATCH}\nEOF'], None, PATCH),
        (["bash", "-lc", f"cd src && apply_patch <<'EOF'\n{PATCH}\nEOF\n"], None,
         PATCH.replace("new.txt", "src/new.txt")),
        (["apply_patch", PATCH], "/w/pkg", PATCH.replace("new.txt", "/w/pkg/new.txt")),
        (["bash", "-lc", f"echo hi && apply_patch <<'EOF'\n{PATCH}\nEOF\n"], None, None),
        (["bash", "-lc", f"apply_patch <<'EOF'\n{PATCH}\nEOF\necho done"], None, None),
        (["bash", "-lc", "git status"], None, None),
        (["cat", "apply_patch"], None, None),
    ],
)  # fmt: skip
def test_F12_the_shell_recognises_the_patches_codex_intercepts(
    argv: list[str], workdir: str | None, patch: str | None
) -> None:
    assert patch_of(argv, workdir) == patch


def test_F12_the_shells_command_line_and_codex_result() -> None:
    assert command_line(["bash", "-lc", "echo $HOME"]) == "echo $HOME"
    assert command_line(["sh", "-c", "true"]) == "true"
    assert command_line(["rg", "-n", "a b", "src"]) == "rg -n 'a b' src"
    assert split_exit_code("hi\nthere\nExit code: 1") == ("hi\nthere", 1)
    assert split_exit_code("(no output)\nExit code: 0") == ("", 0)
    assert split_exit_code("x\nExit code: 0\nFull output (9 characters): /s/1.log") == (
        "x\nFull output (9 characters): /s/1.log",
        0,
    )


# -- the refusals, in Claude Code's words --------------------------------------------------


_STALE = "File a.py has been modified since it was read, either by the user or by a linter."
_AT_WRITE = (
    "File a.py changed since it was read (by the user, a linter or another program); "
    "nothing was written."
)


@pytest.mark.parametrize(
    ("toolpool_says", "claude_code_says"),
    [
        (Refusal(f"{_STALE} Read it again before writing to it.", Reason.CHANGED),
         MODIFIED_READ_AGAIN),
        (Refusal(f"{_STALE}\n\nWhat changed since you read it:\n-x\n+y\n\nRead it again "
                 "before writing to it.", Reason.CHANGED,
                 explanation="\n\nWhat changed since you read it:\n-x\n+y"),
         f"{MODIFIED_READ_AGAIN}\n\nWhat changed since you read it:\n-x\n+y"),
        (Refusal(f"{_STALE}\n\nIt now reads (the whole file, 1 line):\n     1\ty\n\nThis "
                 "counts as a read.", Reason.CHANGED_SHOWN,
                 explanation="\n\nIt now reads (the whole file, 1 line):\n     1\ty\n\nThis "
                 "counts as a read."),
         f"{MODIFIED}\n\nIt now reads (the whole file, 1 line):\n     1\ty\n\n"
         "This counts as a read."),
        (Refusal(f"{_AT_WRITE} Read it again before writing to it.", Reason.CHANGED_BEFORE_WRITE,
                 explanation=" Read it again before writing to it."),
         f"{UNEXPECTEDLY_MODIFIED}\n\nRead it again before writing to it."),
        (Refusal("old_string and new_string are the same: the edit would change nothing.",
                 Reason.NO_CHANGE),
         "No changes to make: old_string and new_string are exactly the same."),
        (Refusal("File does not exist: b.py. edit changes existing files; to create one, use "
                 "write.", Reason.NO_FILE),
         "File does not exist.\n\nFile does not exist: b.py. edit changes existing files; to "
         "create one, use write."),
        (Refusal("The patch is not valid: line 1: ..."), "The patch is not valid: line 1: ..."),
        # The reason decides, never the English: a message that reads like a refusal
        # but has none is left as it is.
        (Refusal(f"{_STALE} Read it again before writing to it."),
         f"{_STALE} Read it again before writing to it."),
        (Refusal("old_string was not found in a.py."), "old_string was not found in a.py."),
    ],
)  # fmt: skip
def test_F12_read_before_write_refusals_in_claude_codes_words(
    toolpool_says: Refusal, claude_code_says: str
) -> None:
    assert refusal(toolpool_says, {}) == claude_code_says


def test_F12_an_edits_errors_quote_its_old_string_as_claude_code_does() -> None:
    args = {"old_string": "x = 1"}
    missing = Refusal("old_string was not found in a.py. Read the file again.", Reason.NOT_FOUND)
    assert refusal(missing, args) == (
        f"{NOT_FOUND}\nString: x = 1\n\nold_string was not found in a.py. Read the file again."
    )
    twice = Refusal(
        "old_string occurs 2 times in a.py (lines 1, 4). Add lines.",
        Reason.AMBIGUOUS,
        {"occurrences": 2},
    )
    found = refusal(twice, args)
    assert found.startswith(
        "Found 2 matches of the string to replace, but replace_all is false. To replace all "
        "occurrences, set replace_all to true. To replace only one occurrence, please provide "
        "more context to uniquely identify the instance.\nString: x = 1\n\nold_string occurs 2"
    )
    edits = {"edits": [{"old_string": "a"}, {"old_string": "b"}]}
    second = Refusal(
        "edits[1]: old_string was not found in a.py.", Reason.NOT_FOUND, {"edit_index": 1}
    )
    assert refusal(second, edits) == (
        f"edits[1]: {NOT_FOUND}\nString: b\n\nold_string was not found in a.py."
    )


def test_F12_the_built_ins_refusals_carry_the_reasons_the_profile_words(
    workspace: Path,
) -> None:
    # Given a file read whole, an edit of text it lacks, of text it has twice, of
    # nothing, and a file that does not exist.
    target = workspace / "a.py"
    target.write_text("x = 1\nx = 1\n")
    ctx = tool_context(workspace)
    read_whole(ctx, "a.py")
    edit_tool = next(t for t in BUILTIN_TOOLS if t.name == "edit")

    def error(**args: Any) -> ToolError:
        with pytest.raises(ToolError) as caught:
            edit_tool.execute({"path": "a.py", **args}, ctx)
        return caught.value

    # Then each error names its reason, and the facts its wording needs.
    assert error(old_string="y", new_string="z").reason == Reason.NOT_FOUND
    twice = error(old_string="x = 1", new_string="z")
    assert (twice.reason, twice.details["occurrences"]) == (Reason.AMBIGUOUS, 2)
    assert error(old_string="x", new_string="x").reason == Reason.NO_CHANGE
    missing = edit_tool.validate({"path": "b.py", "old_string": "a", "new_string": "b"}, ctx)
    assert missing.reason == Reason.NO_FILE
    # And once the file changed, the refusal's reason and explanation are what the
    # profile words it from.
    target.write_text("x = 2\nx = 1\n")
    stale = edit_tool.validate({"path": "a.py", "old_string": "x = 1", "new_string": "y"}, ctx)
    assert (stale.code, stale.reason) == (stamps.CODE_STALE, Reason.CHANGED_SHOWN)
    assert stale.explanation and stale.message.endswith(stale.explanation)


# -- no copy of behaviour: the adapter's effect is the built-in's ---------------------------


@pytest.mark.parametrize(
    ("tool", "claude_args", "built_in", "toolpool_args"),
    [
        ("Edit", {"file_path": "f.py", "old_string": "b = 2", "new_string": "b = 3"},
         "edit", {"path": "f.py", "old_string": "b = 2", "new_string": "b = 3"}),
        ("Edit", {"file_path": "f.py", "old_string": "= ", "new_string": "=", "replace_all": True},
         "edit", {"path": "f.py", "old_string": "= ", "new_string": "=", "replace_all": True}),
        ("MultiEdit", {"file_path": "f.py", "edits": [{"old_string": "a", "new_string": "c"},
                                                      {"old_string": "c = 1", "new_string": "d"}]},
         "multi_edit", {"path": "f.py", "edits": [{"old_string": "a", "new_string": "c"},
                                                  {"old_string": "c = 1", "new_string": "d"}]}),
        ("Write", {"file_path": "f.py", "content": "new\n"}, "write",
         {"path": "f.py", "content": "new\n"}),
    ],
)  # fmt: skip
async def test_F12_the_same_call_through_the_adapter_and_the_built_in_leaves_the_same_bytes(
    tmp_path: Path,
    tool: str,
    claude_args: dict[str, Any],
    built_in: str,
    toolpool_args: dict[str, Any],
) -> None:
    builtin = next(t for t in BUILTIN_TOOLS if t.name == built_in)
    outcomes = []
    for name, run in (("adapter", ADAPTERS[tool]), ("built-in", builtin)):
        root = tmp_path / name
        root.mkdir()
        (root / "f.py").write_text("a = 1\nb = 2\n")
        ctx = tool_context(root)
        read_whole(ctx, "f.py")
        args = claude_args if run is ADAPTERS[tool] else toolpool_args
        assert (await _validate(run, args, ctx)).ok
        output = text(run.execute(args, ctx))
        outcomes.append(((root / "f.py").read_bytes(), output))
    assert outcomes[0] == outcomes[1]


def test_F12_a_search_through_the_adapter_is_the_built_ins(tmp_path: Path) -> None:
    shutil.copytree(Path(__file__).parent / "fixtures" / "profiles", tmp_path / "fx")
    ctx = tool_context(tmp_path)
    grep = next(t for t in BUILTIN_TOOLS if t.name == "grep")
    glob = next(t for t in BUILTIN_TOOLS if t.name == "glob")
    for mode in ("content", "files_with_matches", "count"):
        claude = {"pattern": "Edit", "output_mode": mode, "-C": 1, "head_limit": 0, "path": "null"}
        ours = {"pattern": "Edit", "output_mode": mode, "-C": 1}
        assert text(ADAPTERS["Grep"].execute(claude, ctx)) == text(grep.execute(ours, ctx))
    assert text(ADAPTERS["Glob"].execute({"pattern": "*.json", "path": "fx"}, ctx)) == text(
        glob.execute({"pattern": "*.json", "path": "fx"}, ctx)
    )


async def _validate(tool: Any, args: dict[str, Any], ctx: Any) -> Any:
    verdict = tool.validate(args, ctx)
    return await verdict if hasattr(verdict, "__await__") else verdict
