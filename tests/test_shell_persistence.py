"""What a session's bash keeps between commands (SPEC V10, V11): the working
directory always, the shell's state with ``shell = "persistent"`` — each command its
own process tree all the same, and nothing kept from a command a limit ended."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import ToolCall, ToolResult
from toolpool.engine import Coordinator, Session
from toolpool.pool import PoolConfig, PoolExecutor, WorkerPool
from toolpool.profiles import profile_tools
from toolpool.session_options import Shell
from toolpool.tools.bash import bash

Sessioned = tuple[Coordinator, Session]
Opener = Callable[..., Sessioned]


@pytest.fixture
def coordinator() -> Iterator[Coordinator]:
    coordinator = Coordinator([bash])
    try:
        yield coordinator
    finally:
        coordinator.close()  # every session's scratch directory with it


@pytest.fixture
def sessions(coordinator: Coordinator) -> Opener:
    def open_one(workspace: Path, shell: Shell = Shell.FRESH, **options: Any) -> Sessioned:
        return coordinator, coordinator.open_session(workspace, shell=shell.value, **options)

    return open_one


async def run(session: Sessioned, command: str, **args: object) -> ToolResult:
    coordinator, sess = session
    (result,) = await coordinator.run_turn(
        sess, [ToolCall("b", "bash", {"command": command, **args})]
    )
    return result


def output(result: ToolResult) -> str:
    """The command's own output: the result without its closing lines."""
    return result.text.rsplit("\nExit code:", 1)[0]


@pytest.mark.spec("V10")
async def test_V10_the_working_directory_carries_over(sessions: Opener, workspace: Path) -> None:
    session = sessions(workspace)
    assert "Exit code: 0" in (await run(session, "mkdir -p a/b && cd a/b")).text
    assert output(await run(session, "pwd")) == str(workspace / "a" / "b")
    assert output(await run(session, "cd .. && pwd")) == str(workspace / "a")
    assert output(await run(session, "pwd")) == str(workspace / "a")


@pytest.mark.spec("V10")
async def test_V10_a_command_that_ends_outside_the_roots_sends_the_next_one_home(
    sessions: Opener, workspace: Path
) -> None:
    elsewhere = "/usr"  # seen by every command (a private /tmp hides the test's own)
    session = sessions(workspace)
    left = await run(session, f"cd {elsewhere} && pwd")
    assert output(left).startswith(str(elsewhere))  # it ran there: the command's own choice
    assert f"Shell cwd was reset to {workspace}" in left.text
    assert output(await run(session, "pwd")) == str(workspace)


@pytest.mark.spec("V10")
async def test_V10_a_directory_removed_under_the_shell_sends_the_next_one_home(
    sessions: Opener,
    workspace: Path,
) -> None:
    session = sessions(workspace)
    await run(session, "mkdir gone && cd gone")
    removed = await run(session, 'rmdir "$PWD"')  # from within: it must be empty
    assert f"Shell cwd was reset to {workspace}" in removed.text
    assert output(await run(session, "pwd")) == str(workspace)


@pytest.mark.spec("V10")
async def test_V10_an_extra_root_is_inside_the_roots(
    sessions: Opener, workspace: Path, tmp_path: Path
) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    session = sessions(workspace, extra_roots=(str(extra),))
    assert "reset" not in (await run(session, f"cd {extra}")).text
    assert output(await run(session, "pwd")) == str(extra)


@pytest.mark.spec("V11")
async def test_V11_a_fresh_shell_keeps_nothing_but_the_directory(
    sessions: Opener, workspace: Path
) -> None:
    session = sessions(workspace)
    await run(session, "X=1; export Y=2; f() { echo fn; }; set -o pipefail")
    result = await run(
        session, 'echo "[$X][$Y]"; type f >/dev/null 2>&1 || echo nof; set -o | grep pipefail'
    )
    assert output(result).split("\n") == ["[][]", "nof", "pipefail       \toff"]


@pytest.mark.spec("V11")
async def test_V11_a_persistent_shell_keeps_its_state(sessions: Opener, workspace: Path) -> None:
    session = sessions(workspace, Shell.PERSISTENT)
    await run(
        session,
        "mkdir -p sub; cd sub; X='two words'; export Y=$'line\\nbreak'; readonly R=5; "
        'declare -a A=(1 2 3); f() { echo "fn $1"; }; set -o pipefail; shopt -s extglob; '
        "alias ll='ls -l'; umask 027",
    )
    result = await run(
        session,
        'pwd; echo "$X"; printf "%s|" "$Y"; echo; echo "$R ${A[2]}"; f a; '
        "set -o | grep pipefail; shopt extglob; alias ll; env | grep -c '^Y='",
    )
    assert output(result).split("\n") == [
        str(workspace / "sub"),
        "two words",
        "line",
        "break|",
        "5 3",
        "fn a",
        "pipefail       \ton",
        "extglob        \ton",
        "alias ll='ls -l'",
        "1",  # still exported
    ]


@pytest.mark.spec("V11")
async def test_V11_the_machinery_stays_out_of_the_command(
    sessions: Opener, workspace: Path
) -> None:
    """BASH_ENV is gone before the command runs, and a script it starts reads no
    prelude and sets no trap: only the session's own shell saves state."""
    session = sessions(workspace, Shell.PERSISTENT)
    result = await run(session, "echo \"[${BASH_ENV-unset}]\"; bash -c 'trap -p EXIT; echo ok'")
    assert output(result) == "[unset]\nok"


@pytest.mark.spec("V11")
async def test_V11_a_command_a_limit_or_a_timeout_ended_keeps_the_state_before_it(
    sessions: Opener,
    workspace: Path,
) -> None:
    session = sessions(workspace, Shell.PERSISTENT)
    await run(session, "X=kept; mkdir -p d")
    killed = await run(session, "X=lost; cd d; sh -c 'kill -9 $$'")  # as the OOM killer does
    assert "Exit code: 137" in killed.text
    timed_out = await run(session, "X=late; cd d; sleep 30", timeout=0.5)
    assert timed_out.is_error and "timed out" in timed_out.text
    assert output(await run(session, 'echo "$X"; pwd')) == f"kept\n{workspace}"


@pytest.mark.spec("V11")
async def test_V11_an_exit_saves_like_an_end(sessions: Opener, workspace: Path) -> None:
    session = sessions(workspace, Shell.PERSISTENT)
    exited = await run(session, "X=set; exit 3")
    assert "Exit code: 3" in exited.text
    assert output(await run(session, 'echo "$X"')) == "set"


@pytest.mark.spec("V11")
async def test_V11_two_sessions_keep_their_own(sessions: Opener, workspace: Path) -> None:
    one, two = sessions(workspace, Shell.PERSISTENT), sessions(workspace, Shell.PERSISTENT)
    await run(one, "X=one; mkdir -p o && cd o")
    await run(two, "X=two")
    assert output(await run(one, 'echo "$X"; pwd')) == f"one\n{workspace / 'o'}"
    assert output(await run(two, 'echo "$X"; pwd')) == f"two\n{workspace}"


@pytest.fixture
async def two_workers() -> AsyncIterator[WorkerPool]:
    pool = WorkerPool(
        PoolConfig(min_workers=2, max_workers=2, tool_modules=("toolpool.tools.bash",))
    )
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.spec("V10", "V11")
async def test_V10_V11_state_follows_the_session_from_worker_to_worker(
    two_workers: WorkerPool, workspace: Path
) -> None:
    coordinator = Coordinator([bash], executor=PoolExecutor(two_workers))
    session = coordinator, coordinator.open_session(workspace, shell="persistent")
    try:
        await run(session, "mkdir -p w && cd w && X=0")
        for n in range(1, 7):  # whichever worker runs each: the pool's choice
            assert output(await run(session, f'echo "$X"; X={n}')) == str(n - 1)
        assert output(await run(session, "pwd")) == str(workspace / "w")
    finally:
        coordinator.close()


@pytest.mark.spec("V10")
async def test_V10_codex_shell_starts_in_its_workdir_or_the_workspace(
    workspace: Path,
) -> None:
    coordinator = Coordinator([bash, *profile_tools([bash])])
    session = coordinator, coordinator.open_session(workspace, tool_profile="codex")

    async def shell(script: str, **args: object) -> str:
        argv = ["bash", "-lc", script]
        (result,) = await coordinator.run_turn(
            session[1], [ToolCall("s", "shell", {"command": argv, **args})]
        )
        return str(json.loads(result.text)["output"]).strip()

    try:
        await shell("mkdir -p d/e && cd d")
        assert await shell("pwd") == str(workspace)
        assert await shell("pwd", workdir="d/e") == str(workspace / "d" / "e")
        assert await shell("pwd") == str(workspace)
    finally:
        coordinator.close()
