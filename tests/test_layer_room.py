"""The room of the layers a session lets go is free when it lets them go (SPEC B13),
through a real daemon run as root: a rewind's dropped layers, a merge's squashed ones,
a fork's when it closes, a session's tmpfs when it closes — whatever runs beside them.

The attacks: a process of another session (a background shell, in a sandbox and a
command namespace of its own) and a process on the host in a private mount namespace
(``unshare -m``), both started while the layers were mounted and outliving the rewind,
holding copies of those mounts; a background shell of the session itself that keeps a
file of a dropped layer open, with a grandchild that left its process group to linger;
a fork whose sandbox runs while its parent rewinds.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import Daemon, shared_daemon
from .shell_support import call, marked, marker, sleeping, start, wait_state, wait_until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not SandboxProfile.probe().active("session"),
        reason="layers need session sandboxes and a daemon run as root",
    ),
    pytest.mark.timeout(180),
]

MIB = 2**20
# What a session's tmpfs holds with nothing written: its directories (a few KiB).
EMPTY = 256 * 1024


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("room")) as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=120) as connected:
        yield connected


def sh(session: Any, command: str) -> str:
    result = call(session, "bash", command=command)
    assert not result.is_error and result.text.endswith("Exit code: 0"), result.text
    return result.text.rsplit("\nExit code:", 1)[0]


def used(client: Client, session: Any) -> int:
    environment = client.status()["sessions"][session.id]["environment"]
    return int(environment["layer_used_bytes"])


def layer_mounts(daemon: Daemon) -> set[tuple[str, str]]:
    """The sessions' tmpfs (device, mount point) in the daemon's mount namespace."""
    found = set()
    with open(f"/proc/{daemon.pid}/mountinfo") as table:
        for line in table:
            fields = line.split()
            source = fields[fields.index("-") + 2]
            if source == "toolpool-layer" and fields[4].startswith(str(daemon.runtime)):
                found.add((fields[2], fields[4]))
    return found


def holders(device: str, point: str) -> set[int]:
    """Every process on the host whose mount namespace holds a mount of the file
    system ``device`` at ``point`` (or a copy of it, at the same path)."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/mountinfo") as table:
                lines = table.read().splitlines()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if any(line.split()[2] == device and line.split()[4] == point for line in lines):
            found.add(int(entry.name))
    return found


def _namespace(pid: int) -> str:
    """The mount namespace of ``pid`` ("" once it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def bystander(client: Client, workspace: Path) -> tuple[Any, str, str]:
    """Another session of the daemon, with a background shell that runs until it is
    stopped: its sandbox and its command's namespace, made now, copy every mount the
    host has, the layers of the sessions under test among them."""
    other = client.session(workspace.parent / "ws-other")
    mark = marker()
    shell_id, _ = start(other, f"sleep {mark}")
    wait_until(lambda: sleeping(mark) == 1, "the bystander's shell running")
    return other, shell_id, mark


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "ws-other").mkdir()
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.mark.spec("B13")
def test_B13_namespaces_made_meanwhile_keep_none_of_a_rewinds_room(
    daemon: Daemon, client: Client, workspace: Path
) -> None:
    options: dict[str, Any] = {"workspace_mode": "overlay", "layer_bytes": 6 * MIB}
    before = layer_mounts(daemon)
    with client.session(workspace, **options) as session:
        start_id = session.checkpoints()[0].id
        # Given 2 MiB frozen at a checkpoint, then two mount namespaces made while it is
        # mounted — another session's background shell (its sandbox, its command's
        # namespace) and a process on the host that ran `unshare -m` with private
        # mounts — then 2 MiB more written through that very overlay, and the first
        # file read through it
        sh(session, "head -c 2097152 /dev/zero > a")
        ((device, point),) = layer_mounts(daemon) - before
        other, shell_id, mark = bystander(client, workspace)
        host_mark = marker()
        unshared = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sleep", host_mark]
        )
        try:
            (sleeper,) = marked(mark, sleeps_only=True)
            ours = os.readlink("/proc/self/ns/mnt")
            wait_until(
                lambda: (
                    _namespace(unshared.pid) not in ("", ours)
                    and unshared.pid in holders(device, point)
                ),
                "the host's copy made",
            )
            assert sleeper in holders(device, point)  # the copies are there
            sh(session, "cat a > /dev/null; head -c 2097152 /dev/zero > b")
            session.checkpoints()  # the turn's checkpoint is done: both frozen
            assert used(client, session) >= 4 * MIB
            # When the session rewinds to its start while both still run
            rewound = session.rewind(start_id)
            # Then the room of all it dropped is free as the rewind answers: the
            # status says so, and a write of 5 MiB of the 6 fits at once
            assert used(client, session) < EMPTY
            assert rewound.shells_stopped == ()
            assert sleeping(mark) == 1 and unshared.poll() is None  # both ran all along
            # and neither lost its copy: nothing is taken from another namespace
            assert {sleeper, unshared.pid} <= holders(device, point)
            assert sh(session, "head -c 5242880 /dev/zero > c; ls") == "c"
        finally:
            unshared.kill()
            unshared.wait()
            call(other, "kill_shell", shell_id=shell_id)
            other.close()


@pytest.mark.spec("B13")
def test_B13_the_sessions_own_shell_holding_a_dropped_file_open_keeps_nothing(
    client: Client, workspace: Path
) -> None:
    options: dict[str, Any] = {"workspace_mode": "overlay", "layer_bytes": 6 * MIB}
    with client.session(workspace, **options) as session:
        start_id = session.checkpoints()[0].id
        sh(session, "head -c 3145728 /dev/urandom > held")
        # Given a background shell of the session that holds the frozen file open, and
        # a grandchild that left its process group and session to hold it too
        mark = marker()
        shell_id, _ = start(
            session,
            f"exec 3<held; setsid sh -c 'exec 4<held; exec sleep {mark}' & exec sleep {mark}",
        )
        wait_until(lambda: sleeping(mark) == 2, "both holders running")
        # When the session rewinds past the file's checkpoint
        rewound = session.rewind(start_id)
        # Then the shell was stopped, none of its processes is left, and the file's
        # room is free as the rewind answers
        assert rewound.shells_stopped == (shell_id,)
        assert sleeping(mark) == 0
        assert used(client, session) < EMPTY
        assert sh(session, "ls -A") == "(no output)"
        wait_state(client, session, shell_id, "killed")


@pytest.mark.spec("B13", "B5")
def test_B13_a_merge_frees_what_its_squashed_layers_held_beside_another_session(
    client: Client, workspace: Path
) -> None:
    options: dict[str, Any] = {"workspace_mode": "overlay", "max_checkpoints": 2}
    options["layer_bytes"] = 8 * MIB
    with client.session(workspace, **options) as session:
        # Given 3 MiB frozen, another session's shell started while it was mounted,
        # and a turn that reads the file and then replaces its content with a line
        sh(session, "head -c 3145728 /dev/zero > big")
        other, shell_id, mark = bystander(client, workspace)
        try:
            sh(session, "cat big > /dev/null; echo small > big")
            # When that turn's checkpoint passes max_checkpoints, squashing the two
            # layers into one that holds the line
            listed = session.checkpoints()
            assert len(listed) == 2 and listed[-1].merged
            # Then the 3 MiB's room is free when the checkpoint is done
            assert used(client, session) < EMPTY
            assert sh(session, "cat big") == "small"
            assert sleeping(mark) == 1
        finally:
            call(other, "kill_shell", shell_id=shell_id)
            other.close()


@pytest.mark.spec("B13", "B11")
def test_B13_a_forks_running_sandbox_keeps_only_the_layers_it_stacks(
    daemon: Daemon, client: Client, workspace: Path
) -> None:
    with client.session(workspace, workspace_mode="overlay") as parent:
        start_id = parent.checkpoints()[0].id
        # Given a parent with 2 MiB frozen, forked there, the fork's sandbox running a
        # shell that holds the file open, and 2 MiB more frozen by the parent after
        sh(parent, "head -c 2097152 /dev/zero > shared")
        before = layer_mounts(daemon)
        (fork,) = parent.fork()
        (fork_tmpfs,) = layer_mounts(daemon) - before
        mark = marker()
        try:
            shell_id, _ = start(fork, f"exec 3<shared; exec sleep {mark}")
            wait_until(lambda: sleeping(mark) == 1, "the fork's shell running")
            sh(parent, "cat shared > /dev/null; head -c 2097152 /dev/zero > own")
            parent.checkpoints()
            # When the parent rewinds to its start
            parent.rewind(start_id)
            # Then what the parent alone held is free as the rewind answers; the layer
            # the fork stacks stays (B11), and the fork still reads it
            assert 2 * MIB <= used(client, parent) < 2 * MIB + EMPTY
            assert sleeping(mark) == 1
            assert sh(fork, "wc -c < shared") == "2097152"
            call(fork, "kill_shell", shell_id=shell_id)
        finally:
            fork.close()
        # And when the fork's layers go (its close ends them after it answers), the
        # last user of the parent's frozen layer went first: that room is free too
        wait_until(lambda: fork_tmpfs not in layer_mounts(daemon), "the fork's tmpfs removed")
        assert used(client, parent) < EMPTY


@pytest.mark.spec("B13")
def test_B13_a_closed_sessions_tmpfs_is_left_in_no_namespace(
    daemon: Daemon, client: Client, workspace: Path
) -> None:
    before = layer_mounts(daemon)
    with client.session(workspace, workspace_mode="overlay") as session:
        sh(session, "head -c 2097152 /dev/zero > a")
        ((device, point),) = layer_mounts(daemon) - before
        # Given another session's shell started while the session's tmpfs was
        # mounted: its namespaces hold a copy of it
        other, shell_id, mark = bystander(client, workspace)
        try:
            (sleeper,) = marked(mark, sleeps_only=True)
            assert sleeper in holders(device, point)
            # When the session closes, and its layers go (after its close answered)
            session.close()
            wait_until(lambda: (device, point) not in layer_mounts(daemon), "the tmpfs gone")
            # Then no process on the host holds the tmpfs any more: the copy went too
            assert holders(device, point) == set()
            assert sleeping(mark) == 1
        finally:
            call(other, "kill_shell", shell_id=shell_id)
            other.close()
