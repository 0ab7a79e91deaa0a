"""toolpool.ray on a real Ray cluster of two nodes, both on this machine: one daemon
per node, sessions placed on them, workspaces prepared there, a node's loss.

Every Ray process binds the loopback address. Ray turns a loopback address given to
``ray.init`` into the machine's own IP unless it believes it runs without a
cluster (``ENABLE_RAY_CLUSTER``): the fixture says so for the driver, so that no
process of this module looks beyond 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
import ray._private.ray_constants
import zmq
from ray.cluster_utils import Cluster

from toolpool import ErrorCode, ToolCall, ToolStart
from toolpool.ray import (
    ClusterSession,
    GitSource,
    NodeLoad,
    NodeLost,
    NodeState,
    ToolpoolCluster,
    WorkspaceError,
    choose_node,
    pack,
)
from toolpool.ray.node import ROOT_PREFIX, remove_stale_roots, to_toml

from .conftest import SHARED_ROOTS, _descendants, assert_none_left

# The module starts one Ray cluster (some 15 s on 2 cores) and one daemon per node.
pytestmark = pytest.mark.timeout(180)

SETTINGS = {"min_workers": 1, "max_workers": 2}
HOST = "127.0.0.1"


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """A hang guard, not a timing: what is waited for happens in seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def roots() -> set[Path]:
    """The directories the node actors keep (on this machine: every node's)."""
    return set(Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*"))


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[Cluster]:
    """A head node and a worker node, each of one CPU, on the loopback address."""
    before = _descendants()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "node_ip_address": HOST, "include_dashboard": False},
        )
        try:
            cluster.add_node(num_cpus=1, node_ip_address=HOST)
            ray.init(address=cluster.address, _node_ip_address=HOST, log_to_driver=False)
            cluster.wait_for_nodes()
            ray_processes = _descendants() - before
            SHARED_ROOTS.update(ray_processes)  # Ray's own, and what they start
            try:
                yield cluster
            finally:
                SHARED_ROOTS.difference_update(ray_processes)
        finally:
            ray.shutdown()
            cluster.shutdown()
    assert_none_left(before)


@pytest.fixture(scope="module")
def pool(ray_nodes: Cluster) -> Iterator[ToolpoolCluster]:
    cluster = ToolpoolCluster(settings=SETTINGS)
    try:
        yield cluster
    finally:
        daemons = [n["daemon_pid"] for n in cluster.status()["nodes"].values()]
        cluster.shutdown()
        wait_until(lambda: not any(running(p) for p in daemons if p), "the daemons stopped")
        assert roots() == set()


def node_ids(ray_nodes: Cluster) -> list[str]:
    """The head node's id, then the worker node's."""
    (worker,) = ray_nodes.worker_nodes
    return [ray_nodes.head_node.node_id, worker.node_id]


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, name, arguments)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\nbeta\n")
    (root / "notes.txt").write_text("draft one\n")
    (root / "src" / "main.py").write_text("print('hello')\n")
    return root


# --- decisions, without Ray -----------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "pinned", "chosen"),
    [
        # the least loaded ready node: open sessions, queued calls, placed since the poll
        ([NodeLoad("a", NodeState.READY, 2), NodeLoad("b", NodeState.READY, 1)], None, "b"),
        (
            [NodeLoad("a", NodeState.READY, 1), NodeLoad("b", NodeState.READY, 0, 3)],
            None,
            "a",
        ),
        (
            [NodeLoad("a", NodeState.READY, 0, 0, 2), NodeLoad("b", NodeState.READY, 1)],
            None,
            "b",
        ),
        # a tie goes to the lowest id; nodes not ready take nothing
        ([NodeLoad("b", NodeState.READY), NodeLoad("a", NodeState.READY)], None, "a"),
        ([NodeLoad("a", NodeState.LOST), NodeLoad("b", NodeState.READY, 9)], None, "b"),
        ([NodeLoad("a", NodeState.STARTING), NodeLoad("b", NodeState.READY, 9)], None, "b"),
        # the caller's node, however loaded
        ([NodeLoad("a", NodeState.READY, 9), NodeLoad("b", NodeState.READY)], "a", "a"),
    ],
)
@pytest.mark.spec("R4")
def test_a_session_goes_to_the_least_loaded_ready_node(
    nodes: list[NodeLoad], pinned: str | None, chosen: str
) -> None:
    assert choose_node(nodes, pinned) == chosen


def test_no_ready_node_is_no_choice() -> None:
    from toolpool.ray.placement import NoNode

    with pytest.raises(NoNode, match="no node"):
        choose_node([NodeLoad("a", NodeState.FAILED)])
    with pytest.raises(NoNode, match="not ready"):
        choose_node([NodeLoad("a", NodeState.LOST), NodeLoad("b", NodeState.READY)], "a")


def test_the_daemon_settings_file_is_what_tomllib_reads() -> None:
    settings = {
        "min_workers": 1,
        "cancel_grace": 0.5,
        "private_run": False,
        "log_file": Path('/tmp/a "b"\n'),
        "tool_modules": ["toolpool.tools", "ünïcode"],
        "sandbox_disabled": frozenset({"seccomp", "landlock"}),
        "limits": {"wall_seconds": 30.0},
        "tool_limits": {"bash": {"memory_bytes": 2**30}, "my tool": {"processes": 4}},
    }
    assert tomllib.loads(to_toml(settings)) == {
        **settings,
        "log_file": '/tmp/a "b"\n',
        "sandbox_disabled": ["landlock", "seccomp"],
    }


# --- the cluster --------------------------------------------------------------------------


@pytest.mark.spec("R4")
def test_every_node_gets_a_daemon_of_its_own(ray_nodes: Cluster, pool: ToolpoolCluster) -> None:
    status = pool.status()
    nodes = status["nodes"]
    assert sorted(nodes) == sorted(node_ids(ray_nodes))
    assert {n["state"] for n in nodes.values()} == {"ready"}
    assert status["ready_nodes"] == 2
    assert len({n["daemon_pid"] for n in nodes.values()}) == 2
    assert len({n["actor_pid"] for n in nodes.values()}) == 2
    for node in nodes.values():
        assert node["endpoint"].startswith(f"tcp://{HOST}:")
        assert node["daemon"]["pid"] == node["daemon_pid"]
        assert psutil.Process(node["daemon_pid"]).ppid() == node["actor_pid"]
    assert "2 ready" in repr(pool)


@pytest.mark.spec("R4")
def test_a_daemon_answers_only_the_driver(pool: ToolpoolCluster) -> None:
    from toolpool import Client, DaemonUnavailable

    node = next(iter(pool.status()["nodes"].values()))
    # Given the daemon's endpoint and even its public key, a client without the
    # driver's key pair is refused (CURVE); without CURVE, too.
    server_key = node["server_public_key"].encode()
    stranger_public, stranger_secret = zmq.curve_keypair()
    with pytest.raises(DaemonUnavailable):
        Client(
            node["endpoint"],
            curve=(server_key, stranger_public, stranger_secret),
            connect_timeout=1,
        ).connect()
    with pytest.raises(DaemonUnavailable):
        Client(node["endpoint"], connect_timeout=1).connect()


def conformance(session: ClusterSession, root: Path) -> None:
    """The same turns as on one machine: reads, an edit that needs its read first,
    bash, an interrupt, results in call order, a provider's format."""
    assert Path(session.workspace) == root.resolve()
    (read,) = session.submit([call("r", "read", path="a.txt")]).results(timeout=30)
    assert "alpha" in read.text and not read.is_error

    edit = call("e", "edit", path="notes.txt", old_string="draft one", new_string="final")
    (refused,) = session.submit([edit]).results(timeout=30)
    assert refused.is_error and "read" in refused.text
    assert (root / "notes.txt").read_text() == "draft one\n"
    session.submit([call("rn", "read", path="notes.txt")]).results(timeout=30)
    (edited,) = session.submit([edit]).results(timeout=30)
    assert not edited.is_error, edited.text
    assert (root / "notes.txt").read_text() == "final\n"

    calls = [
        call("1", "ls"),
        call("2", "bash", command="echo from-$((6 * 7))"),
        call("3", "glob", pattern="**/*.py"),
        call("4", "read", path="src/main.py"),
    ]
    results = session.submit(calls).results(timeout=30)
    assert [r.call_id for r in results] == ["1", "2", "3", "4"]
    assert "from-42" in results[1].text
    assert "main.py" in results[2].text

    turn = session.submit([call("long", "bash", command="sleep 60"), call("after", "ls")])
    for event in turn:
        if isinstance(event, ToolStart) and event.call_id == "long":
            break
    session.interrupt()
    long, after = turn.results(timeout=30)
    assert long.error_code is ErrorCode.INTERRUPTED
    assert after.error_code is ErrorCode.SKIPPED

    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "read", "arguments": json.dumps({"path": "a.txt"})},
            }
        ],
    }
    (answer,) = session.submit(message).results_as("openai", timeout=30)
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_a"
    assert "beta" in answer["content"]


@pytest.mark.parametrize("which", ["head", "worker"])
@pytest.mark.spec("R4")
def test_a_session_on_each_node_behaves_as_on_one_machine(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path, which: str
) -> None:
    node = node_ids(ray_nodes)[which == "worker"]
    with pool.session(project, node=node) as session:
        assert session.node_id == node
        conformance(session, project)
    assert session.closed and project.is_dir()  # a path on the node is the caller's


@pytest.mark.spec("R4")
def test_a_workspace_from_a_tarball_as_bytes_or_as_a_shared_object(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path
) -> None:
    worker = node_ids(ray_nodes)[1]
    tarball = pack(project)
    with pool.session(tarball, node=worker) as session:
        made = Path(session.workspace)
        assert made.parent.name == "workspaces" and made.parent.parent in roots()
        assert (made / "src" / "main.py").read_text() == "print('hello')\n"
        (ls,) = session.submit([call("l", "ls")]).results(timeout=30)
        assert "a.txt" in ls.text and "main.py" in ls.text
    assert not made.exists()  # removed as the session closed

    shared = ray.put(tarball)  # put once, for many sessions
    with pool.session(shared, node=worker) as one, pool.session(shared, node=worker) as two:
        assert one.workspace != two.workspace
        one.submit([call("w", "write", path="mine.txt", content="one")]).results(timeout=30)
        assert (Path(one.workspace) / "mine.txt").exists()
        assert not (Path(two.workspace) / "mine.txt").exists()


def git(cwd: Path, *argv: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.spec("R4")
def test_a_workspace_from_a_git_revision(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path
) -> None:
    git(project, "init", "--quiet")
    git(project, "add", ".")
    git(project, "commit", "--quiet", "-m", "first")
    first = git(project, "rev-parse", "HEAD")
    (project / "a.txt").write_text("changed later\n")
    git(project, "commit", "--quiet", "-am", "second")
    source = GitSource(project.as_uri(), first)
    with pool.session(source, node=node_ids(ray_nodes)[0]) as session:
        checkout = Path(session.workspace)
        assert git(checkout, "rev-parse", "HEAD") == first
        (read,) = session.submit([call("r", "read", path="a.txt")]).results(timeout=30)
        assert "alpha" in read.text and "changed" not in read.text
    assert not checkout.exists()


@pytest.mark.spec("R4")
def test_a_workspace_that_cannot_be_made_is_a_workspace_error(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path, tmp_path: Path
) -> None:
    worker = node_ids(ray_nodes)[1]
    before = {p for root in roots() for p in (root / "workspaces").glob("*")}
    with pytest.raises(WorkspaceError, match="no directory"):
        pool.session(tmp_path / "nowhere", node=worker)
    with pytest.raises(WorkspaceError, match="does not unpack"):
        pool.session(b"not a tarball", node=worker)
    git(project, "init", "--quiet")
    git(project, "add", ".")
    git(project, "commit", "--quiet", "-m", "first")
    with pytest.raises(WorkspaceError, match=r"git checkout .* failed: .*no-such-revision"):
        pool.session(GitSource(project.as_uri(), "no-such-revision"), node=worker)
    with pytest.raises(WorkspaceError, match=r"git clone .* failed: .*no-repo"):
        pool.session(GitSource((tmp_path / "no-repo").as_uri()), node=worker)
    escaping = io.BytesIO()
    with tarfile.open(fileobj=escaping, mode="w") as tar:
        member = tarfile.TarInfo("../escaped.txt")
        tar.addfile(member, io.BytesIO(b""))
    with pytest.raises(WorkspaceError, match="does not unpack"):
        pool.session(escaping.getvalue(), node=worker)
    assert {p for root in roots() for p in (root / "workspaces").glob("*")} == before
    assert pool.status()["cluster_sessions"] == 0
    with pytest.raises(ValueError, match="revision"):
        GitSource(project.as_uri(), "--upload-pack=evil")


@pytest.mark.spec("R4")
def test_sessions_spread_over_the_nodes_and_status_adds_them_up(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path
) -> None:
    with pool.session(project) as one, pool.session(project) as two:
        assert {one.node_id, two.node_id} == set(node_ids(ray_nodes))
        status = pool.status()
        assert status["cluster_sessions"] == 2
        assert status["sessions"] == 2
        assert [n["sessions"] for n in status["nodes"].values()] == [1, 1]
        for placed in (one, two):
            daemon = status["nodes"][placed.node_id]["daemon"]
            assert placed.id in daemon["sessions"]
    status = pool.status()
    assert status["sessions"] == status["cluster_sessions"] == 0


@pytest.mark.spec("B12")
@pytest.mark.skipif(os.geteuid() != 0, reason="a workspace overlay needs a daemon run as root")
def test_B12_forks_of_a_cluster_session_are_on_its_node_and_keep_its_workspace(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path
) -> None:
    worker = node_ids(ray_nodes)[1]
    # Given a session on the worker node, on a workspace the cluster made there
    parent = pool.session(pack(project), node=worker, workspace_mode="overlay")
    parent.submit([call("w", "write", path="parent.txt", content="p")]).results(timeout=30)
    # When it forks
    first, second = parent.fork(2)
    # Then the forks are sessions of the same node's daemon, on the same workspace
    assert first.node_id == second.node_id == worker
    assert first.workspace == parent.workspace
    daemon = pool.status()["nodes"][worker]["daemon"]
    assert {parent.id, first.id, second.id} <= daemon["sessions"].keys()
    (read,) = first.submit([call("r", "read", path="parent.txt")]).results(timeout=30)
    assert "p" in read.text
    # And the workspace the cluster made stays until the last of them closes
    made = Path(parent.workspace)
    parent.close()
    first.close()
    assert made.is_dir()
    (again,) = second.submit([call("l", "ls")]).results(timeout=30)
    assert "parent.txt" in again.text
    second.close()
    wait_until(lambda: not made.exists(), "the workspace is removed with the last fork")
    assert pool.status()["cluster_sessions"] == 0


@pytest.mark.spec("R5")
def test_a_tethered_process_dies_with_its_parent() -> None:
    # Given a parent that started a command through the tether (as a node's actor
    # starts its daemon), and the command has become what it runs
    program = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-m', 'toolpool.ray.tether',"
        " str(os.getpid()), '--', '/bin/sleep', '60'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE) as parent:
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            wait_until(lambda: psutil.Process(child).cmdline()[:1] == ["/bin/sleep"], "exec")
            # When the parent is killed, with no chance to clean up
            parent.kill()
            parent.wait()
            # Then the kernel ends the command too
            wait_until(lambda: not running(child), "the tethered command ended")
        finally:
            parent.kill()


def test_the_tether_does_not_start_an_orphan() -> None:
    # The parent named is not the parent: it died before the death signal was set
    done = subprocess.run(
        [sys.executable, "-m", "toolpool.ray.tether", "1", "--", "/bin/true"], check=False
    )
    assert done.returncode == 1


def test_what_dead_actors_left_is_removed_and_only_that(tmp_path: Path) -> None:
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    alive = os.getppid()
    left = tmp_path / f"{ROOT_PREFIX}{dead.pid}-abc"
    kept = tmp_path / f"{ROOT_PREFIX}{alive}-def"
    mine = tmp_path / f"{ROOT_PREFIX}{os.getpid()}-ghi"
    other = tmp_path / f"{ROOT_PREFIX}x-jkl"
    for directory in (left, kept, mine, other):
        (directory / "workspaces").mkdir(parents=True)
    assert remove_stale_roots(tmp_path) == [left.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (kept, mine, other))


@pytest.mark.spec("R5")
def test_a_lost_node_fails_its_sessions_and_the_rest_go_on(
    ray_nodes: Cluster, pool: ToolpoolCluster, project: Path
) -> None:
    # Given a third node that joins: the cluster gives it a daemon of its own
    head = node_ids(ray_nodes)[0]
    third = ray_nodes.add_node(num_cpus=1, node_ip_address=HOST)
    try:
        doomed = pool.session(project, node=third.node_id)
    except BaseException:
        ray_nodes.remove_node(third)
        raise
    kept = pool.session(project, node=head)
    daemon = pool.status()["nodes"][third.node_id]["daemon_pid"]
    tree = {daemon} | {p.pid for p in psutil.Process(daemon).children(recursive=True)}
    assert len(tree) >= 3  # the daemon, its zygote, a worker
    idle = pool.session(project, node=third.node_id)
    running_turn = doomed.submit([call("long", "bash", command="sleep 60")])
    for event in running_turn:
        if isinstance(event, ToolStart):
            break
    # When the node is removed from the Ray cluster
    ray_nodes.remove_node(third)
    # Then the turn that ran there fails with NodeLost, so does the idle session's
    # next submit once the cluster has seen the node go, and the daemon is gone
    with pytest.raises(NodeLost) as lost:
        running_turn.results(timeout=60)
    assert lost.value.node_id == third.node_id
    wait_until(lambda: pool.status()["nodes"][third.node_id]["state"] == "lost", "node lost")
    with pytest.raises(NodeLost, match="left the Ray cluster"):
        idle.submit([call("l", "ls")])
    # (its actor was killed with the node: the daemon's whole tree ended with it)
    wait_until(lambda: not any(running(p) for p in tree), "the lost node's daemon ended")
    # … while the session on the head node goes on, a new session goes to a node
    # that is there, and a session asked of the lost node is refused
    (ls,) = kept.submit([call("l", "ls")]).results(timeout=30)
    assert "a.txt" in ls.text
    with pool.session(project) as fresh:
        assert fresh.node_id != third.node_id
    with pytest.raises(NodeLost):
        pool.session(project, node=third.node_id)
    for session in (doomed, idle, kept):
        session.close()
    assert pool.status()["cluster_sessions"] == 0


@pytest.mark.spec("R5")
def test_shutdown_stops_every_daemon_actor_and_workspace(ray_nodes: Cluster, project: Path) -> None:
    head = node_ids(ray_nodes)[0]
    cluster = ToolpoolCluster(settings=SETTINGS, node_filter=lambda n: n["NodeID"] == head)
    before_roots = roots()
    status = cluster.status()
    assert list(status["nodes"]) == [head]
    (node,) = status["nodes"].values()
    session = cluster.session(pack(project))
    made = Path(session.workspace)
    assert made.is_dir()
    daemon_tree = {node["daemon_pid"]} | {
        p.pid for p in psutil.Process(node["daemon_pid"]).children(recursive=True)
    }
    cluster.shutdown()
    cluster.shutdown()  # idempotent
    assert session.closed and not made.exists()
    wait_until(lambda: not any(running(p) for p in daemon_tree), "the daemon's tree ended")
    wait_until(lambda: not running(node["actor_pid"]), "the actor's process ended")
    assert roots() == before_roots - {made.parent.parent}
    with pytest.raises(Exception, match="shut down"):
        cluster.session(project)
