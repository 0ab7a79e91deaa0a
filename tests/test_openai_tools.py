"""OpenAI's own client tools through a real daemon: ``apply_patch_call`` (F15),
``shell_call`` and ``local_shell_call`` (F16), from the ``openai`` SDK's own objects.

Each model output is built with the SDK's classes (``Response``,
``ResponseApplyPatchToolCall``, ``ResponseFunctionShellToolCall``, ``LocalShellCall``),
submitted as it is, and the turn's ``results_as("openai-responses")`` is checked
strictly against the SDK's input item types for the next request
(``ApplyPatchCallOutput``, ``ShellCallOutput``, ``LocalShellCallOutput``). No request
leaves the machine. Every operation is tried for what it does, for the errors its
provider documents, and against a path outside the session's roots.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import (
    Response,
    ResponseApplyPatchToolCall,
    ResponseFunctionShellToolCall,
    ResponseReasoningItem,
)
from openai.types.responses.response_apply_patch_tool_call import (
    OperationCreateFile,
    OperationDeleteFile,
    OperationUpdateFile,
)
from openai.types.responses.response_container_reference import ResponseContainerReference
from openai.types.responses.response_function_shell_tool_call import Action
from openai.types.responses.response_input_param import (
    ApplyPatchCallOutput,
    LocalShellCallOutput,
    ShellCallOutput,
)
from openai.types.responses.response_output_item import LocalShellCall, LocalShellCallAction

from toolpool import Client, ToolResult
from toolpool.client import ApprovalRequested
from toolpool.providers import parse_tool_calls

from .daemon_support import Daemon, shared_daemon
from .test_providers_sdk import valid

spec = pytest.mark.spec


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit") / "audit.log"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, audit: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("openai")
    config = tmp / "toolpool.toml"
    config.write_text(f'audit_log = "{audit}"\n')
    with shared_daemon(tmp, "--config", str(config)) as started:
        yield started


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as connected:
        yield connected


@pytest.fixture
def arena(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace (with ``a.py``, a directory ``sub`` and a symlink ``out`` to a
    directory outside) and that outside directory (with ``secret.txt``)."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "a.py").write_text("def f():\n    return 1\n")
    (workspace / "sub").mkdir()
    (workspace / "out").symlink_to(outside)
    (outside / "secret.txt").write_text("secret\n")
    return workspace, outside


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b""
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


# --- the model's output, in the SDK's own types --------------------------------------------


def response(*items: Any) -> Response:
    return Response(
        id="resp_1",
        object="response",
        created_at=1_764_000_000,
        model="gpt-5.1",
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        output=[ResponseReasoningItem(type="reasoning", id="rs_1", summary=[]), *items],
    )


def patch(
    call_id: str, kind: str, path: str, diff: str | None = None
) -> ResponseApplyPatchToolCall:
    operation: Any
    if kind == "create_file":
        operation = OperationCreateFile(type="create_file", path=path, diff=diff or "")
    elif kind == "update_file":
        operation = OperationUpdateFile(type="update_file", path=path, diff=diff or "")
    else:
        operation = OperationDeleteFile(type="delete_file", path=path)
    return ResponseApplyPatchToolCall(
        type="apply_patch_call", id=f"apc_{call_id}", call_id=call_id, status="completed",
        operation=operation,
    )  # fmt: skip


def shell(call_id: str, *commands: str, **action: Any) -> ResponseFunctionShellToolCall:
    return ResponseFunctionShellToolCall(
        type="shell_call", id=f"sh_{call_id}", call_id=call_id, status="completed",
        action=Action(commands=list(commands), **action),
    )  # fmt: skip


def local_shell(call_id: str, command: list[str], **action: Any) -> LocalShellCall:
    return LocalShellCall(
        type="local_shell_call", id=f"lsh_{call_id}", call_id=call_id, status="completed",
        action=LocalShellCallAction(type="exec", command=command, env=action.pop("env", {}),
                                    **action),
    )  # fmt: skip


def run(client: Client, workspace: Path, reply: Any, **options: Any) -> tuple[
    tuple[ToolResult, ...], list[dict[str, Any]]
]:  # fmt: skip
    """The reply submitted as the SDK gave it; its results, and as Responses input items."""
    with client.session(workspace, **options) as session:
        turn = session.submit(reply)
        results = turn.results(timeout=60)
        return results, turn.results_as("openai-responses", timeout=60)


def patch_outputs(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    checked = [valid(ApplyPatchCallOutput, item) for item in items]
    assert all(item["type"] == "apply_patch_call_output" for item in checked)
    return {item["call_id"]: item for item in checked}


# --- F15: apply_patch_call ----------------------------------------------------------------


@spec("F15", "E10")
def test_F15_create_update_delete_round_trip_with_the_sdk_types(
    client: Client, arena: tuple[Path, Path]
) -> None:
    # Given a workspace and a GPT-5.1 reply of three apply_patch_call items
    workspace, _ = arena
    (workspace / "gone.txt").write_text("bye\n")
    reply = response(
        patch("c1", "create_file", "sub/new.py", "+def g():\n+    return 2\n"),
        patch("c2", "update_file", "a.py", "@@ def f():\n-    return 1\n+    return 3\n"),
        patch("c3", "delete_file", "gone.txt"),
    )
    # When it is submitted as the SDK gave it, in the openai profile's session
    results, items = run(client, workspace, reply, tool_profile="openai")
    # Then each call ran as OpenAI's apply_patch, answered in its own item type
    assert [r.tool_name for r in results] == ["openai_apply_patch"] * 3
    outputs = patch_outputs(items)
    assert outputs == {
        "c1": {"type": "apply_patch_call_output", "call_id": "c1", "status": "completed",
               "output": "Created sub/new.py"},
        "c2": {"type": "apply_patch_call_output", "call_id": "c2", "status": "completed",
               "output": "Updated a.py"},
        "c3": {"type": "apply_patch_call_output", "call_id": "c3", "status": "completed",
               "output": "Deleted gone.txt"},
    }  # fmt: skip
    assert (workspace / "sub" / "new.py").read_text() == "def g():\n    return 2\n"
    assert (workspace / "a.py").read_text() == "def f():\n    return 3\n"
    assert not (workspace / "gone.txt").exists()


@spec("F15")
def test_F15_where_the_session_has_a_read_tool_what_a_diff_does_not_show_needs_a_read(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    # Given a toolpool session (it has read) and a file the model never read
    with client.session(workspace) as session:
        # When the model deletes it, and creates a file over it, unseen
        first = session.submit(response(
            patch("d", "delete_file", "a.py"),
            patch("c", "create_file", "a.py", "+x\n"),
        ))  # fmt: skip
        refused = patch_outputs(first.results_as("openai-responses", timeout=60))
        # Then both are refused, naming the read that lifts the refusal (F3, F14)
        assert {item["status"] for item in refused.values()} == {"failed"}
        assert 'read(path="a.py")' in refused["d"]["output"]
        assert (workspace / "a.py").read_text() == "def f():\n    return 1\n"
        # And once it was read, the delete goes through
        session.submit([{"id": "r", "name": "read", "arguments": {"path": "a.py"}}]).results()
        again = patch_outputs(
            session.submit(response(patch("d2", "delete_file", "a.py"))).results_as(
                "openai-responses", timeout=60
            )
        )
    assert again["d2"]["status"] == "completed"
    assert not (workspace / "a.py").exists()


@spec("F15")
@pytest.mark.parametrize(
    ("operation", "says"),
    [
        # an update whose context is not in the file: the hunk, by its line in the diff
        (("update_file", "a.py", "@@ def f():\n-    return 9\n+    return 3\n"),
         "update_file a.py: hunk 1 of 1 (line 1 of the diff) does not match the file"),
        (("update_file", "missing.py", "@@\n-x\n+y\n"), "missing.py"),
        (("delete_file", "missing.py", None), "missing.py"),
        (("create_file", "b.py", "+one\ntwo\n"),
         "line 2 of the diff does not start with '+'"),
        # a line the patch format keeps for itself would add an operation
        (("update_file", "a.py", "@@ def f():\n-    return 1\n+    return 3\n"
                                 "*** Delete File: a.py"), "keeps for its own markers"),
        (("create_file", "b.py\n*** Delete File: a.py", "+x\n"), "line break"),
        (("update_file", "a.py", "*** Move to: moved.py\n@@ def f():\n-    return 1\n"
                                 "+    return 3\n"), "keeps for its own markers"),
    ],
)  # fmt: skip
def test_F15_the_documented_errors_are_failed_outputs_and_change_nothing(
    client: Client, arena: tuple[Path, Path], operation: tuple[str, str, str | None], says: str
) -> None:
    workspace, _ = arena
    before = tree(workspace)
    _, items = run(client, workspace, response(patch("c", *operation)), tool_profile="openai")
    (item,) = patch_outputs(items).values()
    assert item["status"] == "failed"
    assert says in item["output"]
    assert tree(workspace) == before


@spec("F15", "X4")
@pytest.mark.parametrize(
    ("kind", "path"),
    [("create_file", "../outside/new.txt"), ("create_file", "{outside}/new.txt"),
     ("create_file", "out/new.txt"), ("update_file", "out/secret.txt"),
     ("update_file", "{outside}/secret.txt"), ("delete_file", "out/secret.txt"),
     ("delete_file", "../outside/secret.txt")],
)  # fmt: skip
def test_F15_a_path_outside_the_roots_is_refused_for_every_operation(
    client: Client, arena: tuple[Path, Path], kind: str, path: str
) -> None:
    workspace, outside = arena
    before = tree(outside)
    diff = "@@\n-secret\n+owned\n" if kind == "update_file" else "+owned\n"
    call = patch("c", kind, path.format(outside=outside), diff)
    _, items = run(client, workspace, response(call), tool_profile="openai")
    (item,) = patch_outputs(items).values()
    assert item["status"] == "failed"
    assert "Access denied" in item["output"]
    assert tree(outside) == before


@spec("F15", "P7", "P8")
def test_F15_the_gate_sees_the_diff_and_a_denial_is_a_failed_output(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    asked: list[ApprovalRequested] = []

    def deny(request: ApprovalRequested) -> Any:
        asked.append(request)
        return False, "not this one"

    reply = response(patch("c", "create_file", "new.txt", "+hello\n"))
    _, items = run(client, workspace, reply, gate="ask", on_approval=deny)
    (request,) = asked
    assert request.call.name == "openai_apply_patch" and request.label == "ApplyPatch"
    assert request.preview.startswith("--- /dev/null") and "+hello" in request.preview
    assert patch_outputs(items)["c"] == {
        "type": "apply_patch_call_output", "call_id": "c", "status": "failed",
        "output": "not this one",
    }  # fmt: skip
    assert not (workspace / "new.txt").exists()


# --- F16: shell_call ------------------------------------------------------------------------


def shell_outputs(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    checked = [valid(ShellCallOutput, item) for item in items]
    assert all(item["type"] == "shell_call_output" for item in checked)
    return {item["call_id"]: item for item in checked}


def exited(code: int) -> dict[str, Any]:
    return {"type": "exit", "exit_code": code}


@spec("F16", "E10")
def test_F16_each_command_answers_with_its_stdout_stderr_and_outcome(
    client: Client, arena: tuple[Path, Path]
) -> None:
    # Given a reply of one shell_call of four commands, in a session of another profile
    workspace, _ = arena
    reply = response(shell(
        "s", "echo out; echo err >&2", "cd sub && pwd", "pwd; exit 3", "printf 0123456789",
        max_output_length=30,
    ))  # fmt: skip
    results, items = run(client, workspace, reply, tool_profile="anthropic")
    assert [r.tool_name for r in results] == ["openai_shell"]
    output = shell_outputs(items)["s"]
    # Then stdout and stderr come apart, the directory carries to the next command,
    # an exit code is an outcome (not an error), and the output is cut at
    # max_output_length characters in all, which goes back with it
    sub = f"{workspace.resolve()}/sub\n"
    assert output["max_output_length"] == 30
    assert [o["outcome"] for o in output["output"]] == [exited(0), exited(0), exited(3), exited(0)]
    assert output["output"][0] == {"stdout": "out\n", "stderr": "err\n", "outcome": exited(0)}
    kept = "".join(o["stdout"] + o["stderr"] for o in output["output"])
    assert kept == ("out\nerr\n" + sub + sub)[:30]
    assert not results[0].is_error


@spec("F16")
def test_F16_a_command_that_times_out_ends_the_call(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    reply = response(shell("s", "echo before", "sleep 60", "touch never", timeout_ms=1500))
    _, items = run(client, workspace, reply)
    outcomes = [o["outcome"] for o in shell_outputs(items)["s"]["output"]]
    assert outcomes == [exited(0), {"type": "timeout"}]  # the third never ran
    assert not (workspace / "never").exists()


@spec("F16", "X1")
def test_F16_commands_are_confined_to_the_session_sandbox(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, outside = arena
    before = tree(outside)
    reply = response(shell(
        "s", f"echo owned > {outside}/secret.txt", f"touch {outside}/new.txt",
        "echo owned > out/secret.txt", "touch inside.txt",
    ))  # fmt: skip
    _, items = run(client, workspace, reply)
    outputs = shell_outputs(items)["s"]["output"]
    assert [o["outcome"] == exited(0) for o in outputs] == [False, False, False, True]
    assert tree(outside) == before  # nothing outside was written
    assert (workspace / "inside.txt").exists()


@spec("F16")
def test_F16_a_refused_call_is_still_answered_as_a_shell_call_output(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    malformed = {"type": "shell_call", "id": "sh", "call_id": "bad", "status": "completed",
                 "action": {"commands": []}}  # fmt: skip
    _, items = run(client, workspace, [malformed])
    (entry,) = shell_outputs(items)["bad"]["output"]
    assert entry["stdout"] == "" and entry["outcome"] == exited(1)
    assert "action.commands" in entry["stderr"]


@spec("F16")
def test_F16_a_shell_call_openai_runs_in_its_container_is_not_run_here() -> None:
    hosted = shell("h", "touch x")
    hosted.environment = ResponseContainerReference(type="container_reference", container_id="c")
    assert parse_tool_calls(response(hosted)) == []
    assert [c.name for c in parse_tool_calls(response(shell("l", "true")))] == ["openai_shell"]


@spec("F16", "L1")
def test_F16_commands_run_under_the_calls_limits(client: Client, arena: tuple[Path, Path]) -> None:
    workspace, _ = arena
    reply = response(shell("s", "head -c 5000 /dev/zero > big.bin", "echo still here"))
    _, items = run(client, workspace, reply, limits={"file_size_bytes": 1000})
    first, second = shell_outputs(items)["s"]["output"]
    assert first["outcome"]["type"] == "exit" and first["outcome"]["exit_code"] != 0
    assert (workspace / "big.bin").stat().st_size <= 1000
    assert second == {"stdout": "still here\n", "stderr": "", "outcome": exited(0)}


# --- F16: local_shell_call ------------------------------------------------------------------


def local_outputs(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    checked = [valid(LocalShellCallOutput, item) for item in items]
    assert all(item["type"] == "local_shell_call_output" for item in checked)
    return {item["id"]: item for item in checked}


@spec("F16")
def test_F16_local_shell_runs_its_argv_in_its_directory_with_its_environment(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, _ = arena
    reply = response(
        local_shell("l1", ["bash", "-lc", "echo $GREETING from $(basename $PWD)"],
                    env={"GREETING": "hello"}, working_directory="sub", timeout_ms=30_000),
        local_shell("l2", ["ls"], env={"X": "$(touch pwned)"}),
        local_shell("l3", ["false"]),
    )  # fmt: skip
    results, items = run(client, workspace, reply)
    assert [r.tool_name for r in results] == ["openai_local_shell"] * 3
    outputs = {k: json.loads(v["output"]) for k, v in local_outputs(items).items()}
    assert outputs["l1"]["output"] == "hello from sub"
    assert outputs["l1"]["metadata"]["exit_code"] == 0
    assert "a.py" in outputs["l2"]["output"] and not (workspace / "pwned").exists()
    assert outputs["l3"]["metadata"]["exit_code"] == 1


@spec("F16", "X1")
def test_F16_local_shell_is_confined_and_refuses_a_variable_name_that_is_shell_text(
    client: Client, arena: tuple[Path, Path]
) -> None:
    workspace, outside = arena
    before = tree(outside)
    reply = response(
        local_shell("l1", ["touch", f"{outside}/new.txt"]),
        local_shell("l2", ["bash", "-lc", "echo owned > secret.txt"],
                    working_directory=str(outside)),
        local_shell("l3", ["true"], env={"X=1; touch pwned; Y": "1"}),
    )  # fmt: skip
    results, items = run(client, workspace, reply)
    assert tree(outside) == before
    assert results[2].is_error and "no variable names" in local_outputs(items)["l3"]["output"]
    assert not (workspace / "pwned").exists()


# --- every call on the record --------------------------------------------------------------


@spec("F15", "F16", "R1")
def test_F15_F16_the_calls_are_in_the_audit_log_by_their_tools(
    client: Client, arena: tuple[Path, Path], audit: Path
) -> None:
    workspace, _ = arena
    reply = response(shell("audited-s", "true"), patch("audited-p", "create_file", "n.txt", "+n\n"))
    run(client, workspace, reply)
    expected = {"audited-s": "openai_shell", "audited-p": "openai_apply_patch"}
    deadline = time.monotonic() + 30  # a hang guard: the log is written in batches
    while (tools := _audited(audit)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tools == expected


def _audited(audit: Path) -> dict[str, str]:
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    return {r["call"]: r["tool"] for r in records if r["call"].startswith("audited-")}
