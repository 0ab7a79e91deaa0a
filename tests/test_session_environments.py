"""A session's commands in the session's sandbox, through a real daemon (SPEC V1, V2):
one sandbox per session whichever worker runs its commands (every call here runs on
a new worker), its /tmp the session's, another session's out of sight, everything
of it gone when the session closes, and each command still ended with its call."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from toolpool import Client, ErrorCode, ToolCall, ToolResult
from toolpool.engine import Coordinator
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.sandbox.profile import SandboxProfile
from toolpool.tools.bash import bash

from .daemon_support import Daemon, running, shared_daemon
from .shell_support import call, marked, marker, sleeping, wait_until
from .support import until

pytestmark = pytest.mark.skipif(
    not SandboxProfile.probe().active("session"), reason="no session sandboxes here"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("environments")
    with shared_daemon(tmp, "--max-calls-per-worker", "1") as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=60) as connected:
        yield connected


def output(result: ToolResult) -> str:
    return result.text.rsplit("\nExit code:", 1)[0]


@pytest.mark.spec("V1")
def test_V1_one_sandbox_per_session_whichever_worker_runs_its_commands(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    other_workspace = tmp_path / "other"
    other_workspace.mkdir()
    with client.session(workspace) as one, client.session(other_workspace) as two:
        # Given a file the session's first command leaves in its /tmp
        call(one, "bash", command="echo mine > /tmp/left")
        # Then the session's next command, on another worker, finds it; the other
        # session's does not
        assert output(call(one, "bash", command="cat /tmp/left")) == "mine"
        assert "No such file" in output(call(two, "bash", command="cat /tmp/left"))
        # and status lists one running sandbox for each, with its holder's pid
        sessions = client.status()["sessions"]
        (first,) = sessions[one.id]["sandboxes"]
        (second,) = sessions[two.id]["sandboxes"]
        assert first["state"] == second["state"] == "running"
        holders = [int(first["pid"]), int(second["pid"])]
        assert holders[0] != holders[1] and all(running(pid) for pid in holders)
    # When the first session closes: its sandbox and everything in it are gone
    wait_until(lambda: not running(holders[0]), "the closed session's sandbox ended")
    assert not running(holders[1])  # the second closed as well, with its block


@pytest.mark.spec("V2")
def test_V2_a_command_sees_only_its_own_processes_and_its_escapees_end_with_it(
    client: Client, workspace: Path
) -> None:
    mark = marker()
    with client.session(workspace) as session:
        # Given a background shell of the session, running in the same sandbox
        started = call(session, "bash", command=f"sleep {mark}", run_in_background=True)
        assert not started.is_error, started.text
        wait_until(lambda: sleeping(mark) == 1, "the background sleep runs")
        # When a foreground command lists the processes it can see and leaves a
        # setsid, a nohup and a double-forked sleep behind
        listed = call(session, "bash", command="ls /proc | grep -c '^[0-9]'")
        leave = (
            f"setsid sleep {mark} & nohup sleep {mark} >/dev/null & (sleep {mark} &) ; echo left"
        )
        assert output(call(session, "bash", command=leave)) == "left"
        # Then it saw only its own few (its init, its shell, ls and grep)
        assert int(output(listed)) <= 4
        # and what it left ended with its call: only the background shell's sleep runs
        assert sleeping(mark) == 1
        holder = int(client.status()["sessions"][session.id]["sandboxes"][0]["pid"])
        assert psutil.Process(holder).is_running()


@pytest.mark.spec("X2", "V1")
async def test_X2_V1_a_command_in_a_session_sandbox_counts_as_confined(workspace: Path) -> None:
    """The daemon refuses local connections from what it confines: a command started
    by a session sandbox's helper is no worker's child, and counts all the same."""
    mark = marker()
    config = PoolConfig(min_workers=1, max_workers=1, tool_modules=("toolpool.tools.bash",))
    async with WorkerPool(config) as pool:
        coordinator = Coordinator([bash], executor=PoolExecutor(pool))
        try:
            session = coordinator.open_session(workspace)
            call = ToolCall("b", "bash", {"command": f"sleep {mark}"})
            turn = coordinator.submit(session, [call])
            await until(lambda: bool(marked(mark, sleeps_only=True)))
            (sleeping_pid,) = marked(mark, sleeps_only=True)
            assert pool.confines(sleeping_pid)
            # by its sandbox alone too (here also by the worker's cgroups it joined,
            # which a machine without cgroups does not have)
            assert pool.shells.sandboxes.confines(sleeping_pid)
            assert not pool.confines(os.getpid())  # the test itself is not confined
            turn.interrupt()
            (result,) = await turn
            assert result.error_code is ErrorCode.INTERRUPTED
        finally:
            coordinator.close()
