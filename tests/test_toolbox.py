"""The session as a framework's tools (SPEC A2): ``AsyncToolbox`` and ``Toolbox``
against a real daemon — one session and one open turn across calls, progress and
approvals routed to their call, a cancelled caller's call stopped in the daemon."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import AsyncClient, Client
from toolpool.client.core import ApprovalRequested
from toolpool.client.toolbox import NOBODY_ASKED, AsyncToolbox, Toolbox

from .daemon_support import Daemon, shared_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("toolbox")) as running:
        yield running


@pytest.mark.spec("A2", "F3")
async def test_A2_one_session_across_calls_read_then_edit(daemon: Daemon, workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello world\n")
    edit = {"path": "a.txt", "old_string": "world", "new_string": "there"}
    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        names = {d.name for d in await toolbox.definitions()}
        refused = await toolbox.call("edit", edit)
        read = await toolbox.call("read", {"path": "a.txt"})
        edited = await toolbox.call("edit", edit)
        sessions = (await client.status())["sessions"]
    assert {"read", "edit", "bash"} <= names
    assert refused.is_error and "read" in refused.text.lower()  # F3: read it first
    assert not read.is_error and not edited.is_error
    assert (workspace / "a.txt").read_text() == "hello there\n"
    assert len(sessions) == 1  # one session for every call


@pytest.mark.spec("A2", "P8")
async def test_A2_approvals_go_to_the_calls_own_handler_else_the_toolboxs(
    daemon: Daemon, workspace: Path
) -> None:
    asked: list[tuple[str, str]] = []

    def toolbox_wide(request: ApprovalRequested) -> tuple[bool, str]:
        asked.append(("toolbox", request.call.id))
        return False, "the toolbox says no"

    async def own(request: ApprovalRequested) -> bool:
        asked.append(("own", request.call.id))
        return True

    async with AsyncClient(runtime_dir=daemon.runtime) as client:
        async with AsyncToolbox(client, workspace, gate="ask", on_approval=toolbox_wide) as box:
            allowed = await box.call("bash", {"command": "echo hi"}, call_id="c1", on_approval=own)
            denied = await box.call("bash", {"command": "echo no"}, call_id="c2")
            listed = await box.call("ls", {}, call_id="c3")  # read-only: not asked
        async with AsyncToolbox(client, workspace, gate="ask") as nobody:
            unasked = await nobody.call("bash", {"command": "echo x"})
    assert not allowed.is_error and allowed.text.startswith("hi\n")
    assert denied.is_error and denied.text == "the toolbox says no"
    assert not listed.is_error
    assert asked == [("own", "c1"), ("toolbox", "c2")]
    assert unasked.is_error and unasked.text == NOBODY_ASKED


@pytest.mark.spec("A2", "P9", "D4")
async def test_A2_progress_reaches_its_call_and_a_cancelled_caller_stops_the_call(
    daemon: Daemon, workspace: Path
) -> None:
    started = asyncio.Event()
    reports: list[Any] = []

    def progress(data: Any) -> None:
        reports.append(data)
        if "started" in str(data):
            started.set()

    client = AsyncClient(runtime_dir=daemon.runtime)
    async with client, AsyncToolbox(client, workspace) as toolbox:
        # a sleep past the test's end: only the cancellation can stop it
        long = asyncio.ensure_future(
            toolbox.call("bash", {"command": "echo started; sleep 3600"}, on_progress=progress)
        )
        await asyncio.wait_for(started.wait(), 30)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        # bash is exclusive (S2): this call runs only once the sleep has stopped.
        after = await toolbox.call("bash", {"command": "echo after"})
    assert any("started" in str(r) for r in reports)
    assert not after.is_error and after.text.startswith("after\n")


@pytest.mark.spec("A2", "A1")
def test_A2_the_blocking_toolbox_takes_calls_from_threads(daemon: Daemon, workspace: Path) -> None:
    (workspace / "b.txt").write_text("one\n")
    texts: dict[int, str] = {}

    def read(number: int, toolbox: Toolbox) -> None:
        texts[number] = toolbox.call("read", {"path": "b.txt"}, timeout=30).text

    with Client(runtime_dir=daemon.runtime) as client, Toolbox(client, workspace) as toolbox:
        threads = [threading.Thread(target=read, args=(n, toolbox)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        edited = toolbox.call("edit", {"path": "b.txt", "old_string": "one", "new_string": "two"})
    assert sorted(texts) == list(range(6))
    assert all("one" in text for text in texts.values())
    assert not edited.is_error  # the threads' reads stamped the file for the session
    assert (workspace / "b.txt").read_text() == "two\n"
