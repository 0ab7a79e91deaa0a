"""A session branches (SPEC B1–B11) through a real daemon run as root: real layers,
real commands, real tools — checkpoints at every turn's end, rewinds byte for byte,
forks that each end with exactly their own changes, the changes out, and the attacks
the issue lists (a fork reaching its parent's layers, another session's or a guessed
checkpoint, the bounds under a command that writes every turn)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import AsyncClient, Client, ToolCall, ToolResult
from toolpool.client import CommitConflict, RequestFailed
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import Daemon, running_daemon, shared_daemon, start_daemon
from .shell_support import call, start, wait_until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not SandboxProfile.probe().active("session"),
        reason="branches need a workspace overlay: session sandboxes, a daemon run as root",
    ),
    pytest.mark.timeout(180),
]

# The state of a tree as a command sees it: every entry's type, mode, name and link
# target, and every file's hash, sorted: equal listings are equal trees, byte for byte.
LISTING = (
    "(cd {where} && find . -mindepth 1 -printf '%y %m %p %l\\n' | LC_ALL=C sort && "
    "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    place = tmp_path_factory.mktemp("branching")
    flags = ("--audit-log", str(place / "audit.log"), "--max-sessions-per-client", "40")
    with shared_daemon(place, *flags) as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=120) as connected:
        yield connected


def out(result: ToolResult) -> str:
    assert not result.is_error and result.text.endswith("Exit code: 0"), result.text
    return result.text.rsplit("\nExit code:", 1)[0]


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.text
    return result.text


def sh(session: Any, command: str) -> str:
    return out(call(session, "bash", command=command))


def listing(session: Any, where: str = ".") -> str:
    return sh(session, LISTING.format(where=where))


def host_listing(workspace: Path) -> str:
    done = subprocess.run(
        ["bash", "-c", LISTING.format(where=workspace)], capture_output=True, text=True, check=True
    )
    return done.stdout.rstrip("\n")


@pytest.mark.spec("B1")
def test_B1_every_turns_end_is_a_checkpoint_listed_oldest_first(
    client: Client, workspace: Path
) -> None:
    (workspace / "kept.txt").write_text("host\n")
    with client.session(workspace, workspace_mode="overlay", root="overlay") as session:
        # Given two turns, one by a tool, one by a command writing the root as well
        first = session.submit([ToolCall("w", "write", {"path": "a.txt", "content": "a\n"})])
        first.results()
        sh(
            session,
            "echo b > b.txt; mkdir -p /usr/local/b1; echo x > /usr/local/b1/x",
        )
        third = session.submit([ToolCall("r", "read", {"path": "a.txt"})])
        third.results()
        labelled = session.checkpoint("before the fix")
        # Then the list holds the start, each turn's end (the read's changed nothing)
        # and the one asked for, oldest first, each with what its layers changed
        listed = session.checkpoints()
        assert [c.label for c in listed] == ["start", None, None, None, "before the fix"]
        assert listed[0].turn_id is None and listed[1].turn_id == first.id
        assert listed[3].turn_id == third.id and listed[3].paths == ()
        assert listed[1].paths == (str(workspace / "a.txt"),)
        assert set(listed[2].paths) == {str(workspace / "b.txt"), "/usr/local/b1/x"}
        assert not any(c.paths_truncated for c in listed)  # past 1000 paths, it would say
        assert listed[-1] == labelled and listed.max_checkpoints == 50
        assert listed[-1].time >= listed[0].time
        assert len({c.id for c in listed}) == len(listed)


@pytest.mark.spec("B1")
@pytest.mark.spec("V1")
def test_B1_a_running_background_shell_skips_the_turns_checkpoint_and_tmp_carries_over(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace, workspace_mode="overlay") as session:
        # /tmp outlives the sandbox a checkpoint starts again
        sh(session, "echo kept > /tmp/b1-tmp; echo w > w.txt")
        assert sh(session, "cat /tmp/b1-tmp") == "kept"
        # Given a background shell that runs past its turn
        shell_id, _ = start(session, "sleep 300")
        turn = session.submit([ToolCall("w", "write", {"path": "during.txt", "content": "x\n"})])
        turn.results()
        # Then that turn's end (and the shell's own turn's) made no checkpoint, and
        # the list says which shell ran
        listed = session.checkpoints()
        assert listed.skipped[-1].turn_id == turn.id and len(listed.skipped) == 2
        assert all(s.shells == (shell_id,) for s in listed.skipped)
        assert all(c.turn_id != turn.id for c in listed)
        # And one asked for is refused while it runs, and so is a fork of now; a fork at
        # a checkpoint copies no process: it has no background shell
        with pytest.raises(RequestFailed, match=shell_id):
            session.checkpoint()
        with pytest.raises(RequestFailed, match=shell_id):
            session.fork()
        (fork,) = session.fork(at=listed[-1].id)
        assert client.status()["sessions"][fork.id]["shells"] == []
        assert sh(fork, "cat /tmp/b1-tmp 2>&1; true").startswith("cat:")  # nor /tmp
        fork.close()
        # Once it ended, the next turn's end is a checkpoint of everything since
        ok(call(session, "kill_shell", shell_id=shell_id))
        assert str(workspace / "during.txt") in session.checkpoints()[-1].paths
        assert session.checkpoint("asked").label == "asked"


@pytest.mark.spec("B2")
def test_B2_a_rewind_restores_workspace_and_root_byte_for_byte(
    client: Client, workspace: Path
) -> None:
    # Given a session with files, a mode, a symlink, a directory and a root change
    (workspace / "base.txt").write_text("base\n")
    (workspace / "gone.txt").write_text("to be deleted\n")
    with client.session(workspace, workspace_mode="overlay", root="overlay") as session:
        ok(call(session, "write", path="tool.txt", content="by a tool\n"))
        sh(session, "mkdir d; echo cmd > d/cmd.txt; chmod 750 d/cmd.txt; ln -s base.txt link;"
           " mkdir -p /usr/local/lib/b2; echo pkg > /usr/local/lib/b2/mod.py")  # fmt: skip
        mark = session.checkpoints()[-1]
        before, root_before = listing(session), listing(session, "/usr/local/lib/b2")
        # When tools and commands change everything that can change
        ok(call(session, "write", path="tool.txt", content="rewritten\n"))
        sh(session, "rm gone.txt d/cmd.txt; chmod 600 base.txt; echo more >> base.txt;"
           " rm link; ln -s /etc/passwd link; mv d e; dd if=/dev/urandom of=bin bs=1k count=8"
           " 2>/dev/null; rm -rf /usr/local/lib/b2; echo o > /usr/local/lib/b2-other")  # fmt: skip
        later = session.checkpoint("later")
        shell_id, _ = start(session, "sleep 300; echo late > late.txt")
        # And the session rewinds to the mark
        rewound = session.rewind(mark.id)
        assert [c.id for c in session.checkpoints()][-1] == mark.id
        # Then both trees are as they were, byte for byte, modes and deletions too
        assert listing(session) == before
        assert listing(session, "/usr/local/lib/b2") == root_before
        assert "No such file" in call(session, "bash", command="cat /usr/local/lib/b2-other").text
        # Later checkpoints are forgotten, the background shell was stopped and said
        assert rewound.checkpoint == mark.id and later.id in rewound.forgot
        assert rewound.shells_stopped == (shell_id,)
        with pytest.raises(RequestFailed) as refused:
            session.rewind(later.id)
        assert refused.value.code == "unknown_checkpoint"
        # The host never changed
        assert (workspace / "gone.txt").exists() and not (workspace / "tool.txt").exists()


@pytest.mark.spec("B2")
def test_B2_after_a_rewind_reads_are_judged_by_content(client: Client, workspace: Path) -> None:
    (workspace / "same.txt").write_text("same\n")
    (workspace / "moved.txt").write_text("first\n")
    with client.session(workspace, workspace_mode="overlay") as session:
        sh(session, "touch start-marker")
        mark = session.checkpoints()[-1]
        # Given moved.txt changed after the mark and read since (its stamp is "second"),
        # and same.txt read, unchanged
        sh(session, "echo second > moved.txt")
        ok(call(session, "read", path="moved.txt"))
        ok(call(session, "read", path="same.txt"))
        # When the session rewinds: moved.txt is "first" again
        session.rewind(mark.id)
        # Then an edit of moved.txt is refused as stale, of same.txt allowed
        stale = call(session, "edit", path="moved.txt", old_string="first", new_string="x")
        assert stale.is_error and "modified since it was read" in stale.text
        ok(call(session, "edit", path="same.txt", old_string="same", new_string="edited"))


def _random_work(rng: random.Random, name: str, steps: int) -> list[tuple[str, dict[str, Any]]]:
    """Random writes for one fork: by tools and by commands, appends in place, renames,
    deletes, modes, installs into the root."""
    work: list[tuple[str, dict[str, Any]]] = []

    def bash(command: str) -> None:
        work.append(("bash", {"command": command}))

    for step in range(steps):
        path = f"f{rng.randint(0, 5)}.txt"
        match rng.choice(["write", "append", "rename", "delete", "chmod", "install", "edit"]):
            case "write":
                work.append(("write", {"path": path, "content": f"{name} {step}\n"}))
            case "append":
                bash(f"echo {name}{step} >> {path}")
            case "rename":
                bash(f"mv -f {path} r{step}-{name}.txt 2>/dev/null; true")
            case "delete":
                bash(f"rm -f {path}")
            case "chmod":
                bash(f"touch {path}; chmod 7{rng.randint(0, 7)}0 {path}")
            case "install":
                bash(f"mkdir -p /usr/local/b4; echo {name}{step} > /usr/local/b4/{name}")
            case "edit":
                bash(f"echo {name} > {path}")
                work.append(("read", {"path": path}))
                edit = {"path": path, "old_string": name, "new_string": f"{name}-edited"}
                work.append(("edit", edit))
    return work


@pytest.mark.spec("B3")
@pytest.mark.spec("B4")
def test_B4_forks_running_random_writes_end_with_exactly_their_own_changes(
    client: Client, workspace: Path
) -> None:
    rng = random.Random(4)
    for n in range(6):
        (workspace / f"f{n}.txt").write_text(f"host {n}\n")
    with client.session(workspace, workspace_mode="overlay", root="overlay") as parent:
        sh(
            parent,
            "echo parent > f0.txt; mkdir -p /usr/local/b4; echo p > /usr/local/b4/parent",
        )
        forks = parent.fork(3)
        # Reference: each fork replays its work in a session of its own on a copy of
        # the tree at the fork — what it must end with, exactly.
        copy = workspace.parent / "copy"
        shutil.copytree(workspace, copy)
        (copy / "f0.txt").write_text("parent\n")
        everyone = [parent, *forks]
        work = {s.id: _random_work(rng, f"s{i}", 14) for i, s in enumerate(everyone)}
        # When they run their work interleaved, step by step
        for step in range(max(len(w) for w in work.values())):
            for session in everyone:
                if step < len(work[session.id]):
                    tool, arguments = work[session.id][step]
                    call(session, tool, **arguments)
        try:
            for i, session in enumerate(everyone):
                with client.session(copy, workspace_mode="overlay", root="overlay") as alone:
                    sh(alone, "mkdir -p /usr/local/b4; echo p > /usr/local/b4/parent")
                    for tool, arguments in work[session.id]:
                        call(alone, tool, **arguments)
                    # Then each tree, workspace and root, is what its own work made
                    assert listing(session) == listing(alone), f"session {i}"
                    assert listing(session, "/usr/local/b4") == listing(alone, "/usr/local/b4")
        finally:
            shutil.rmtree(copy)
            for fork in forks:
                fork.close()
    assert (workspace / "f0.txt").read_text() == "host 0\n"  # the host never changed


@pytest.mark.spec("B3")
def test_B3_a_fork_at_a_checkpoint_is_a_session_with_its_parents_read_register(
    client: Client, workspace: Path, daemon: Daemon
) -> None:
    (workspace / "notes.txt").write_text("one\n")
    with client.session(workspace, workspace_mode="overlay", shell="persistent") as parent:
        ok(call(parent, "read", path="notes.txt"))
        sh(parent, "mkdir sub; cd sub; export CARRIED=yes")
        mark = parent.checkpoints()[-1]
        sh(parent, "echo later > later.txt")
        # When it forks at the mark, with an option of its own, and the fork forks again
        (fork,) = parent.fork(at=mark.id, max_tool_errors=7)
        (grandchild,) = fork.fork()
        try:
            for session in (fork, grandchild):
                # Then it has the tree of the mark, not what came after
                assert "No such file" in call(session, "bash", command="cat ../later.txt").text
                # its shell's directory and state, and the parent's read register: an
                # edit of what the parent read goes on without a read
                assert sh(session, "pwd; echo $CARRIED") == f"{workspace}/sub\nyes"
                ok(call(session, "edit", path="notes.txt", old_string="one", new_string="two"))
            status = client.status()["sessions"]
            assert status[grandchild.id]["environment"]["forked_from"] == fork.id
            assert status[fork.id]["environment"]["checkpoints"] >= 1
            shown = subprocess.run(
                [sys.executable, "-m", "toolpool", "status", "--runtime-dir", str(daemon.runtime)],
                capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "300"},
            ).stdout  # fmt: skip
            assert f"forked from {fork.id}" in shown
            # Options it may not change are refused, saying why
            with pytest.raises(RequestFailed, match="keeps its parent's root"):
                parent.fork(root="host")
            with pytest.raises(RequestFailed, match="unknown session option"):
                parent.fork(colour="blue")
        finally:
            grandchild.close()
            fork.close()
    # Its audit records say where it came from
    audit = daemon.log.parent / "audit.log"

    def records() -> dict[str, dict[str, Any]]:
        return {r["session"]: r for r in map(json.loads, audit.read_text().splitlines())}

    wait_until(lambda: grandchild.id in records(), "the audit log's writer wrote them")
    by_session = records()
    assert by_session[fork.id]["forked_from"] == parent.id
    assert by_session[grandchild.id]["forked_from"] == fork.id
    assert "forked_from" not in by_session[parent.id]


@pytest.mark.spec("B3")
def test_B3_forks_count_against_the_clients_sessions(client: Client, workspace: Path) -> None:
    with client.session(workspace, workspace_mode="overlay") as parent:
        with pytest.raises(RequestFailed, match="max_sessions_per_client"):
            parent.fork(40)
        assert len(client.status()["sessions"]) == 1  # none was left open


@pytest.mark.spec("B3", "A6")
def test_B3_a_session_with_shipped_tools_is_not_forked(client: Client, workspace: Path) -> None:
    # Given a session whose own tools run on workers bound to it alone (A6)
    def twice(n: int) -> int:
        """Double it."""
        return 2 * n

    with client.session(workspace, workspace_mode="overlay", tools=[twice]) as parent:
        # When it is forked, Then the fork is refused, saying why, and nothing is opened
        with pytest.raises(RequestFailed, match=r"shipped tools .* cannot be forked"):
            parent.fork(1)
        assert len(client.status()["sessions"]) == 1
        (result,) = parent.submit([ToolCall("t", "twice", {"n": 21})]).results()
        assert ok(result) == "42"  # the parent goes on


@pytest.mark.spec("B6")
def test_B6_branches_wait_for_no_turn_and_turns_wait_for_them(
    client: Client, workspace: Path
) -> None:
    with client.session(workspace, workspace_mode="overlay") as session:
        # Given a turn that runs (open: it ends when closed)
        turn = session.submit([ToolCall("s", "bash", {"command": "echo running"})], open=True)
        for action in (session.checkpoint, session.checkpoints, session.fork, session.diff):
            with pytest.raises(RequestFailed) as refused:
                action()
            assert refused.value.code == "busy"
        turn.close()
        turn.results()
        assert len(session.checkpoints()) == 2


async def _ran(session: Any, tool: str, **arguments: Any) -> ToolResult:
    (result,) = await (await session.submit([ToolCall("c", tool, arguments)])).results()
    return result


@pytest.mark.spec("B6")
async def test_B6_a_turn_submitted_after_a_fork_waits_for_it(
    daemon: Daemon, workspace: Path
) -> None:
    async with (
        AsyncClient(runtime_dir=daemon.runtime, timeout=120) as client,
        client.session(workspace, workspace_mode="overlay") as session,
    ):
        await _ran(session, "write", path="a", content="a")
        # When a fork and a turn are sent back to back, the fork first
        forking = asyncio.ensure_future(session.fork(2))
        await asyncio.sleep(0)  # its frame leaves first
        turn = await session.submit([ToolCall("b", "bash", {"command": "echo b > b"})])
        forks = await forking
        await turn.results()
        # Then the forks were made before the turn ran: they have a, not b
        for fork in forks:
            listed = await _ran(fork, "bash", command="ls")
            assert listed.text.startswith("a\nExit code: 0"), listed.text
            await fork.close()
        assert (await _ran(session, "bash", command="ls")).text.startswith("a\nb\n")
        # And the async client has every branch request
        assert (await session.checkpoints())[0].label == "start"
        assert [c.path for c in await session.changes()] == ["a", "b"]


@pytest.mark.spec("B7")
def test_B7_another_sessions_or_a_guessed_checkpoint_is_unknown(
    client: Client, workspace: Path
) -> None:
    with (
        client.session(workspace, workspace_mode="overlay") as one,
        client.session(workspace, workspace_mode="overlay") as other,
    ):
        theirs = other.checkpoints()[0].id
        for wrong in (theirs, "cp-0000000000000000", one.checkpoints()[0].id[:-1], "../x"):
            attempts = [
                functools.partial(one.rewind, wrong),
                functools.partial(one.fork, at=wrong),
                functools.partial(one.diff, since=wrong),
            ]
            for attempt in attempts:
                with pytest.raises(RequestFailed) as refused:
                    attempt()
                assert refused.value.code == "unknown_checkpoint", wrong
    with client.session(workspace) as direct, pytest.raises(RequestFailed, match="overlay"):
        direct.checkpoints()


@pytest.mark.spec("B7")
def test_B7_a_fork_cannot_reach_its_parents_or_a_siblings_layers(
    client: Client, workspace: Path, daemon: Daemon
) -> None:
    with client.session(workspace, workspace_mode="overlay", root="overlay") as parent:
        sh(parent, "echo parent-secret > secret.txt; echo root-secret > /etc/b7-secret")
        first, second = parent.fork(2)
        try:
            sh(first, "echo first-secret > first.txt")
            layers = daemon.runtime / f"workers-{daemon.pid}" / "s"
            assert any(layers.glob("*.l/w"))  # the layers the test tries to reach
            probe = (
                f"ls {layers} 2>&1; cat {layers}/*/w/*/first.txt 2>&1; "
                "cat /proc/*/root/*/first.txt 2>&1; "
                "echo parent-changed > secret.txt; echo sibling > /etc/b7-secret; true"
            )
            assert "first-secret" not in sh(second, probe)
            assert sh(second, "find / -xdev -name first.txt 2>/dev/null; true") == "(no output)"
            # The frozen layers below are read-only to it: its writes stayed its own
            assert sh(parent, "cat secret.txt /etc/b7-secret") == "parent-secret\nroot-secret"
            assert sh(first, "cat secret.txt /etc/b7-secret") == "parent-secret\nroot-secret"
        finally:
            first.close()
            second.close()


@pytest.mark.spec("B5", "B11", "B13")
def test_B5_B11_a_command_that_writes_every_turn_stays_within_both_bounds(
    client: Client, workspace: Path
) -> None:
    options = {"workspace_mode": "overlay", "max_checkpoints": 3, "layer_bytes": 6 * 2**20}
    options["max_tool_errors"] = 0  # its failures past the bound open no breaker
    with client.session(workspace, **options) as session:
        # Given a command that writes a new MiB at every turn
        results = []
        for turn in range(8):
            results.append(call(session, "bash", command=(
                f"head -c 1048576 /dev/zero > mb{turn}; echo turn {turn}"
            )))  # fmt: skip
            listed = session.checkpoints()
            # Then at most 3 checkpoints stay, the ones merged away said
            assert len(listed) <= 3
        merged = [m for c in listed for m in c.merged]
        assert len(merged) + len(listed) == 1 + 8  # the start and 8 turns: none lost
        # And the frozen layers count against layer_bytes: past it a write is refused,
        # the call says which bound, and the layer never holds more than its bytes
        assert any(r.error_code and r.error_code.value == "limit_exceeded" for r in results)
        refused = next(r for r in results if r.is_error)
        assert "layer_bytes" in refused.text
        used = client.status()["sessions"][session.id]["environment"]["layer_used_bytes"]
        assert used <= 6 * 2**20
        # And a rewind to the start lets every frozen layer go: the room is back when
        # the rewind answers (B13), whatever else runs on the machine
        session.rewind(listed[0].id)
        assert client.status()["sessions"][session.id]["environment"]["layer_used_bytes"] < 2**20
        assert sh(session, "ls; head -c 5242880 /dev/zero > again") == "(no output)"


@pytest.mark.spec("B11")
def test_B11_a_forks_layer_holds_its_own_changes_only(client: Client, workspace: Path) -> None:
    # Given a parent that froze 3 MiB, and a fork whose layer_bytes is 2 MiB
    with client.session(workspace, workspace_mode="overlay") as parent:
        sh(parent, "head -c 3145728 /dev/urandom > big.bin")
        (fork,) = parent.fork(layer_bytes=2 * 2**20)
        try:
            # Then the fork reads the parent's 3 MiB and writes a MiB of its own
            sh(fork, "cat big.bin > /dev/null; head -c 1048576 /dev/zero > own.bin")
            status = client.status()["sessions"]
            assert status[fork.id]["environment"]["layer_used_bytes"] < 2 * 2**20
            assert status[parent.id]["environment"]["layer_used_bytes"] >= 3 * 2**20
        finally:
            fork.close()


@pytest.mark.spec("B8")
def test_B8_the_sessions_diff_applied_to_a_copy_of_the_base_gives_its_tree(
    client: Client, workspace: Path
) -> None:
    (workspace / "text.txt").write_text("one\ntwo\nthree\n")
    (workspace / "gone.txt").write_text("gone\n")
    (workspace / "tool.bin").write_bytes(bytes(range(256)))
    with client.session(workspace, workspace_mode="overlay") as session:
        ok(call(session, "read", path="text.txt"))
        ok(call(session, "edit", path="text.txt", old_string="two", new_string="2"))
        mark = session.checkpoints()[-1]
        sh(session, "rm gone.txt; printf 'no newline' > new.txt; chmod +x new.txt;"
           " head -c 5000 /dev/urandom > tool.bin; ln -s text.txt link; mkdir -p a/b;"
           " printf 'x\\033[31m\\n' > $'a/b/\\033[31mred'")  # fmt: skip
        # The base of diff() is the host directory; of diff(since=mark) the tree at the
        # mark, which a fork there exports
        base, at_mark = workspace.parent / "base", workspace.parent / "at-mark"
        shutil.copytree(workspace, base, symlinks=True)
        (fork,) = session.fork(at=mark.id)
        fork.export(at_mark)
        fork.close()
        for copy, patch in ((base, session.diff()), (at_mark, session.diff(since=mark.id))):
            # When the patch is applied by git to its base
            subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=copy, check=True)
            # Then the copy is the session's tree, byte for byte
            assert host_listing(copy) == listing(session)
            headers = [line for line in patch.splitlines() if line.startswith("diff")]
            assert "\x1b" not in "".join(headers) and '"a/a/b/\\033[31mred"' in patch
        changes = {c.path: (c.kind, c.type) for c in session.changes()}
        assert changes["gone.txt"] == ("deleted", "file")
        assert changes["link"] == ("added", "symlink")
        assert changes["text.txt"] == ("modified", "file")
        assert changes["tool.bin"] == ("modified", "file")
        assert {c.path for c in session.changes(since=mark.id)} == set(changes) - {"text.txt"}


@pytest.mark.spec("B9")
def test_B9_an_export_writes_the_sessions_tree_and_refuses_what_it_must_not(
    client: Client, workspace: Path, daemon: Daemon
) -> None:
    (workspace / "host.txt").write_text("host\n")
    with client.session(workspace, workspace_mode="overlay") as session:
        sh(session, "echo new > new.txt; rm host.txt; ln -s /etc out; mkdir d; chmod 700 d")
        assert session.export(workspace.parent / "exported") == 3
        assert session.export(workspace.parent / "exported.tgz") == 3
        assert host_listing(workspace.parent / "exported") == listing(session)
        with tarfile.open(workspace.parent / "exported.tgz") as tar:
            assert sorted(tar.getnames()) == ["d", "new.txt", "out"]
        for where, why in (
            (workspace.parent / "exported", "exists"),
            (daemon.runtime / "x", "nothing there"),
            (workspace.parent / "missing" / "x", "not a directory"),
        ):
            with pytest.raises(RequestFailed, match=why):
                session.export(where)


@pytest.mark.spec("B10")
def test_B10_a_commit_applies_the_changes_and_refuses_host_changes(
    client: Client, workspace: Path
) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        (workspace / name).write_text(f"{name}\n")
    # (What the host changed just before a session's start counts as changed after it:
    # the session's mark of its start is a little before it, on the safe side.)
    time.sleep(0.2)
    with client.session(workspace, workspace_mode="overlay") as session:
        sh(session, "echo A > a.txt; echo B > b.txt; rm c.txt; mkdir -p n; echo N > n/new.txt")
        # When the host changed b.txt since the session started
        (workspace / "b.txt").write_text("the user's b\n")
        with pytest.raises(CommitConflict) as refused:
            session.commit()
        # Then nothing was written, and it says which
        assert refused.value.paths == ["b.txt"]
        assert (workspace / "a.txt").read_text() == "a.txt\n"
        # When the session takes the host's b.txt back (a rewind-free fix: its own copy)
        sh(session, 'echo "the user\'s b" > b.txt')
        (workspace / "b.txt").write_text("the user's b\n")
    with client.session(workspace, workspace_mode="overlay") as session:
        sh(session, "echo A > a.txt; rm c.txt; mkdir -p n; echo N > n/new.txt")
        written = session.commit()
        assert sorted(written) == ["a.txt", "c.txt", "n", "n/new.txt"]
        assert host_listing(workspace) == listing(session)
        assert session.changes() == []


SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.mark.spec("B2")
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="needs Debian's python3")
def test_B2_a_rewind_uninstalls_a_package_a_fork_never_had(client: Client, workspace: Path) -> None:
    package = f"tpbranch{os.getpid()}"
    (workspace / package).mkdir()
    (workspace / package / "__init__.py").write_text("ANSWER = 42\n")
    setup = f"setup(name={package!r}, version='1', packages=[{package!r}])"
    (workspace / "setup.py").write_text(f"from setuptools import setup\n{setup}\n")
    install = (
        f"{SYSTEM_PYTHON} -m pip install --no-index --no-build-isolation "
        "--break-system-packages --no-cache-dir -q ."
    )
    # -I: not from the workspace (the current directory), only from site-packages
    show = f"{SYSTEM_PYTHON} -I -c 'import {package}; print({package}.ANSWER)'"
    with client.session(workspace, workspace_mode="overlay", root="overlay") as session:
        sh(session, "true")
        before = session.checkpoints()[-1]
        (fork,) = session.fork()
        try:
            # Given the package installed into the session's system site-packages
            installed = call(session, "bash", command=install, timeout=300)
            assert installed.text.endswith("Exit code: 0"), installed.text
            assert sh(session, show) == "42"
            # Then the fork made before never has it, and a rewind takes it away
            assert "No module named" in call(fork, "bash", command=show).text
            session.rewind(before.id)
            assert "No module named" in call(session, "bash", command=show).text
        finally:
            fork.close()


@pytest.mark.spec("B11")
def test_B11_a_dead_daemons_checkpoints_and_forks_are_removed_and_said(
    tmp_path: Path, workspace: Path
) -> None:
    runtime = tmp_path / "rt"
    first = start_daemon(tmp_path, runtime=runtime)
    try:
        with (
            Client(runtime_dir=runtime, timeout=60) as crashing,
            crashing.session(workspace, workspace_mode="overlay") as session,
        ):
            sh(session, "echo x > frozen.txt")
            session.fork(2)
            assert len(list(runtime.glob(f"workers-{first.pid}/s/*.l"))) == 3
            first.process.kill()  # a crash: its layers stay mounted
            first.process.wait()
    finally:
        if first.process.poll() is None:
            first.process.kill()
            first.process.wait()
    with running_daemon(tmp_path, runtime=runtime) as second:
        assert not (runtime / f"workers-{first.pid}").exists()
        said = [line["msg"] for line in second.log_lines() if line["level"] == "warning"]
        assert any("layers of 3 sessions" in msg and "checkpoints" in msg for msg in said)
