"""``toolpool mcp serve`` driven by the MCP SDK's own stdio client: a real daemon, a
real ``toolpool mcp serve`` process, the MCP protocol in between."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, ImageContent, TextContent

from toolpool import AsyncClient
from toolpool.runtime import running_pid

from .daemon_support import (
    ROOT,
    Daemon,
    daemon_env,
    running,
    shared_daemon,
)
from .support import PNG_1X1


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("daemon")) as started:
        yield started


def serve_parameters(runtime: Path, workspace: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            *("-m", "toolpool", "mcp", "serve"),
            *("--runtime-dir", str(runtime), "--workspace", str(workspace)),
        ],
        cwd=str(ROOT),
        env=env,
    )


@asynccontextmanager
async def mcp_serve(runtime: Path, workspace: Path, **env: str) -> AsyncIterator[Client]:
    """An MCP client connected to ``toolpool mcp serve`` (one toolpool session)."""
    async with Client(serve_parameters(runtime, workspace, **env)) as client:
        yield client


def text(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


# --- tools/list ---------------------------------------------------------------------------


@pytest.mark.spec("D5")
async def test_D5_every_tool_is_listed_with_its_schema_and_annotations(
    daemon: Daemon, workspace: Path
) -> None:
    async with (
        mcp_serve(daemon.runtime, workspace) as mcp,
        AsyncClient(runtime_dir=daemon.runtime) as toolpool_client,
    ):
        listed = {t.name: t for t in (await mcp.list_tools()).tools}
        schemas = {t["name"]: t["schema"] for t in await toolpool_client.tools()}
    assert set(listed) == set(schemas)
    assert listed["read"].input_schema == schemas["read"]
    read, bash, edit = listed["read"], listed["bash"], listed["edit"]
    assert read.annotations is not None and read.annotations.read_only_hint is True
    for unsafe in (bash, edit):
        assert unsafe.annotations is not None
        assert unsafe.annotations.read_only_hint is False
        assert unsafe.annotations.destructive_hint is True
    assert read.meta == {"toolpool/concurrencySafe": True}
    assert bash.meta == {"toolpool/concurrencySafe": False}
    assert listed["lookup"].title == "Look Up"  # the tool's label


# --- tools/call -----------------------------------------------------------------------------


@pytest.mark.spec("M1", "F1")
async def test_M1_a_read_comes_back_as_text_and_an_image_as_an_image(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    (workspace / "pixel.png").write_bytes(PNG_1X1)
    async with mcp_serve(daemon.runtime, workspace) as mcp:
        notes = await mcp.call_tool("read", {"path": "notes.txt"})
        picture = await mcp.call_tool("read", {"path": "pixel.png"})
        missing = await mcp.call_tool("nope", {})
    assert not notes.is_error
    assert "alpha" in text(notes) and "beta" in text(notes)
    assert not picture.is_error
    images = [b for b in picture.content if isinstance(b, ImageContent)]
    assert len(images) == 1
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data) == PNG_1X1
    assert missing.is_error  # P4 through MCP: an error result, not a protocol error
    assert 'tool "nope" not found' in text(missing)


@pytest.mark.spec("F3", "F4")
async def test_F3_an_edit_is_refused_before_a_read_and_accepted_after(
    daemon: Daemon, workspace: Path
) -> None:
    (workspace / "app.py").write_text("print('hello')\n")
    edit = {"path": "app.py", "old_string": "hello", "new_string": "goodbye"}
    async with mcp_serve(daemon.runtime, workspace) as mcp:
        refused = await mcp.call_tool("edit", edit)
        unchanged = (workspace / "app.py").read_text()
        read = await mcp.call_tool("read", {"path": "app.py"})
        accepted = await mcp.call_tool("edit", edit)
    assert refused.is_error
    assert "read" in text(refused).lower()
    assert unchanged == "print('hello')\n"
    assert not read.is_error
    assert not accepted.is_error, text(accepted)
    assert (workspace / "app.py").read_text() == "print('goodbye')\n"


@pytest.mark.spec("P9")
async def test_P9_bash_output_arrives_as_progress_notifications(
    daemon: Daemon, workspace: Path
) -> None:
    reports: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, message))

    async with mcp_serve(daemon.runtime, workspace) as mcp:
        result = await mcp.call_tool(
            "bash", {"command": "echo first; sleep 0.3; echo second"}, progress_callback=on_progress
        )
        quiet = await mcp.call_tool("bash", {"command": "echo unasked"})
    assert not result.is_error
    assert "first" in text(result) and "second" in text(result)
    streamed = "".join(message or "" for _, message in reports)
    assert "first" in streamed and "second" in streamed
    numbers = [progress for progress, _ in reports]
    assert numbers == sorted(set(numbers))  # increasing, as MCP requires
    assert "unasked" in text(quiet)


@pytest.mark.spec("D4", "S2")
async def test_D4_an_mcp_cancellation_cancels_the_running_call(
    daemon: Daemon, workspace: Path
) -> None:
    started = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message and "started" in message:
            started.set()

    async with mcp_serve(daemon.runtime, workspace) as mcp:
        async with anyio.create_task_group() as tasks:

            async def long_call() -> None:
                # a sleep past the test's end: only the cancellation can stop it
                await mcp.call_tool(
                    "bash", {"command": "echo started; sleep 3600"}, progress_callback=on_progress
                )

            tasks.start_soon(long_call)
            with anyio.fail_after(20):
                await started.wait()
            tasks.cancel_scope.cancel()  # the SDK sends notifications/cancelled
        # bash is exclusive (S2): this call can only start once the sleep has stopped.
        began = time.monotonic()
        after = await mcp.call_tool("bash", {"command": "echo after"})
        waited = time.monotonic() - began
    assert not after.is_error
    assert "after" in text(after)
    assert waited < 30  # a hang guard: the sleep stops within a second or two


@pytest.mark.spec("S2")
async def test_S2_calls_arriving_together_follow_the_turn_rules(
    daemon: Daemon, workspace: Path
) -> None:
    busy: list[int] = []

    async def run_together(
        observer: AsyncClient, mcp: Client, *calls: Any, release: Path | None = None
    ) -> list[str]:
        """Send ``calls`` at once; record how many workers were busy meanwhile, and
        create ``release`` once two were busy at the same time."""
        texts: list[str] = []
        finished = anyio.Event()

        async def watch() -> None:
            while not finished.is_set():
                busy.append((await observer.status())["workers"].get("busy", 0))
                if release is not None and busy[-1] == 2:
                    release.touch()
                await anyio.sleep(0.02)

        async def one(name: str, arguments: dict[str, Any]) -> None:
            result = await mcp.call_tool(name, arguments)
            assert not result.is_error, text(result)
            texts.append(text(result))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            async with anyio.create_task_group() as callers:
                for name, arguments in calls:
                    callers.start_soon(one, name, arguments)
            finished.set()
        return texts

    async with (
        mcp_serve(daemon.runtime, workspace) as mcp,
        AsyncClient(runtime_dir=daemon.runtime) as observer,
    ):
        # Two read-only calls that each wait for a file the watcher creates only once
        # both run: run one after the other, they would time out (a hang guard)
        wait = ("wait_for", {"name": "both-ran", "timeout": 30})
        safe = await run_together(observer, mcp, wait, wait, release=workspace / "both-ran")
        side_by_side = max(busy)
        busy.clear()
        unsafe = await run_together(
            observer, mcp, ("bash", {"command": "sleep 0.8"}), ("nap", {"seconds": 0.8})
        )
    assert safe == ["both-ran appeared", "both-ran appeared"]
    assert side_by_side == 2  # two read-only calls ran side by side
    assert len(unsafe) == 2
    assert max(busy) == 1  # the command ran alone


# --- the daemon behind it -------------------------------------------------------------------


@pytest.mark.spec("D5")
async def test_D5_serve_starts_a_daemon_when_none_runs_and_stops_it_after(
    tmp_path: Path, workspace: Path
) -> None:
    runtime = tmp_path / "rt"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "TOOLPOOL_MIN_WORKERS": "1"}
    async with mcp_serve(runtime, workspace, **env) as mcp:
        pid = running_pid(runtime)
        result = await mcp.call_tool("bash", {"command": "echo from a fresh daemon"})
    assert pid is not None
    assert "from a fresh daemon" in text(result)
    deadline = time.monotonic() + 30  # a hang guard: the daemon stops within seconds
    while running(pid) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    assert not running(pid)
    assert running_pid(runtime) is None


def readme_mcp_blocks() -> list[Any]:
    """The JSON examples of the README's MCP section."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## MCP\n") :]
    section = section[: section.index("\n## ", 1)]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.DOTALL)]


async def test_the_readme_client_configuration_works_as_written(
    daemon: Daemon, workspace: Path
) -> None:
    entry = readme_mcp_blocks()[0]["mcpServers"]["toolpool"]
    (workspace / "README.md").write_text("# a project\n")
    # As an MCP client starts it: in the project, with toolpool on its PATH.
    parameters = StdioServerParameters(
        command=entry["command"],
        args=entry["args"],
        cwd=str(workspace),
        env={
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "TOOLPOOL_RUNTIME_DIR": str(daemon.runtime),
        },
    )
    async with Client(parameters) as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
        result = await mcp.call_tool("read", {"path": "README.md"})
    assert {"read", "edit", "bash"} <= names
    assert "# a project" in text(result)


def test_serve_without_the_sdk_names_the_extra_to_install(tmp_path: Path) -> None:
    # A None in sys.modules makes an import fail, as if the package were missing.
    hide_sdk = (
        "import sys; sys.modules['mcp'] = None; from toolpool.cli import main; "
        "sys.exit(main(['mcp', 'serve']))"
    )
    finished = subprocess.run(
        [sys.executable, "-c", hide_sdk],
        cwd=ROOT,
        env=daemon_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert finished.returncode == 2
    assert finished.stdout == ""  # stdout belongs to the protocol
    assert "pip install 'toolpool[mcp]'" in finished.stderr


# --- session options (SPEC A4) ------------------------------------------------------------


def serve_with(runtime: Path, workspace: Path, *flags: str, **kwargs: Any) -> Client:
    parameters = serve_parameters(runtime, workspace)
    parameters = StdioServerParameters(
        command=parameters.command, args=[*parameters.args, *flags], cwd=parameters.cwd
    )
    return Client(parameters, **kwargs)


@pytest.mark.spec("A4", "P8")
async def test_A4_the_gate_asks_the_mcp_clients_user_by_elicitation(
    daemon: Daemon, workspace: Path
) -> None:
    """gate=ask: a call that is not read-only is put to the user through the MCP
    client's elicitation; accepted, it runs; declined, the model reads the reason;
    a read-only call is not asked."""
    from mcp_types import ElicitResult

    asked: list[str] = []

    async def answer(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        if "yes" in params.message:
            return ElicitResult(action="accept", content={})
        return ElicitResult(action="decline", content={"reason": "not in my repo"})

    # The protocol before 2026-07-28, whose servers may ask their clients (elicitation).
    mcp = serve_with(
        daemon.runtime, workspace, "--gate", "ask", elicitation_callback=answer, mode="legacy"
    )
    async with mcp:
        allowed = await mcp.call_tool("bash", {"command": "echo yes"})
        refused = await mcp.call_tool("bash", {"command": "echo no > made.txt"})
        listed = await mcp.call_tool("ls", {})
    assert not allowed.is_error and "yes" in text(allowed)
    assert refused.is_error and "not in my repo" in text(refused)
    assert not (workspace / "made.txt").exists()
    assert not listed.is_error
    assert len(asked) == 2 and "echo yes" in asked[0] and "made.txt" in asked[1]


@pytest.mark.spec("A4")
@pytest.mark.parametrize(
    ("callback", "why"),
    [
        (False, "cannot be asked: it does not support elicitation"),
        # The 2026-07-28 protocol: no server-initiated request, so no question either.
        (True, "lets the server ask only through input_required results"),
    ],
)
async def test_A4_a_client_that_cannot_be_asked_is_not_the_call_is_denied(
    daemon: Daemon, workspace: Path, callback: bool, why: str
) -> None:
    from mcp_types import ElicitResult

    async def accept(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="accept", content={})

    kwargs: dict[str, Any] = {"elicitation_callback": accept} if callback else {}
    async with serve_with(daemon.runtime, workspace, "--gate", "ask", **kwargs) as mcp:
        refused = await mcp.call_tool("bash", {"command": "echo hi > made.txt"})
    assert refused.is_error
    assert why in text(refused)
    assert not (workspace / "made.txt").exists()


@pytest.mark.spec("A4", "F12")
async def test_A4_profile_and_limits_of_the_session(daemon: Daemon, workspace: Path) -> None:
    flags = ("--tool-profile", "claude-code", "--limit", "wall_seconds=1")
    async with serve_with(daemon.runtime, workspace, *flags) as mcp:
        names = {tool.name for tool in (await mcp.list_tools()).tools}
        slow = await mcp.call_tool("Bash", {"command": "sleep 30"})
    assert {"Read", "Edit", "Bash"} <= names and "read" not in names
    assert slow.is_error and "wall time limit of 1 s" in text(slow)


@pytest.mark.spec("A4", "E6")
def test_A4_a_bad_session_option_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "mcp", "serve", "--limit", "wall_seconds=-3",
         "--runtime-dir", str(tmp_path / "rt")],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, timeout=60,
        check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2
    assert "toolpool: error: mcp serve: session option limits" in done.stderr
    assert done.stdout == ""
