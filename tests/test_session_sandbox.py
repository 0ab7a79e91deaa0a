"""SPEC V1–V4: one sandbox per session, each command in its own namespaces inside it.

Real bubblewrap, the real static helper, real cgroups and processes: every promise
of session_box.py and spawn.py, and the attacks on each.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from toolpool.sandbox.cgroups import CgroupTree
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.session_box import SandboxStartError, SessionSandbox
from toolpool.sandbox.spawn import (
    SpawnedCommand,
    SpawnError,
    current_rlimits,
    own_cgroup_procs,
    spawn,
)

from .shell_support import wait_until

pytestmark = pytest.mark.skipif(
    not SandboxProfile.probe().active("bwrap"), reason="needs bubblewrap (Debian bubblewrap)"
)
PATH = "/usr/local/bin:/usr/bin:/bin"
ENV = {"PATH": PATH, "LANG": "C.UTF-8"}


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short (a Unix socket's path has 107 bytes) and under the private /tmp's host side.
    directory = Path(tempfile.mkdtemp(prefix="tps-"))
    yield directory
    shutil.rmtree(directory)


@pytest.fixture
def box(workspace: Path, socket_dir: Path) -> Iterator[SessionSandbox]:
    sandbox = SessionSandbox.start(
        roots=[workspace], network=False, tmp_bytes=16 << 20, socket_dir=socket_dir
    )
    yield sandbox
    sandbox.close()


class Run:
    """A command's exit code and output, read once it has ended (and been closed)."""

    def __init__(self, code: int | None, out: str, err: str, command: SpawnedCommand) -> None:
        self.code, self.out, self.err, self.command = code, out, err, command


def start(
    box: SessionSandbox,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str = "/",
    **kwargs: object,
) -> tuple[SpawnedCommand, int, int]:
    """Start argv with pipes for stdout and stderr; (command, stdout_r, stderr_r)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        command = spawn(
            box.socket_path,
            argv,
            env=ENV if env is None else env,
            cwd=cwd,
            stdin=os.open("/dev/null", os.O_RDONLY),
            stdout=out_w,
            stderr=err_w,
            **kwargs,  # type: ignore[arg-type]
        )
    finally:
        os.close(out_w)
        os.close(err_w)
    return command, out_r, err_r


def read_all(fd: int) -> str:
    with os.fdopen(fd, "rb") as f:
        return f.read().decode(errors="replace")


def run(box: SessionSandbox, argv: Sequence[str], **kwargs: object) -> Run:
    command, out_r, err_r = start(box, argv, **kwargs)  # type: ignore[arg-type]
    code = command.wait(30)
    command.close()  # whatever it left running ends: the pipes reach their end
    return Run(code, read_all(out_r), read_all(err_r), command)


def sh(box: SessionSandbox, script: str, **kwargs: object) -> Run:
    return run(box, ["sh", "-c", script], **kwargs)


def ended(pid: int) -> bool:
    """Whether ``pid`` runs no more: gone, or a zombie its parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def marked(mark: str) -> list[int]:
    """Host pids of every process whose command line carries ``mark``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(mark in part for part in process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def sleep_mark() -> str:
    """A `sleep` argument no other process has: 1000.<random digits>."""
    return f"1000.{secrets.randbelow(10**9)}"


# -- V2: what a command gets -------------------------------------------------------------


@pytest.mark.spec("V2")
def test_exit_codes_and_signal_deaths_in_shell_convention(box: SessionSandbox) -> None:
    assert sh(box, "exit 7").code == 7
    assert sh(box, "true").code == 0
    assert sh(box, "kill -TERM $$").code == 128 + signal.SIGTERM
    assert sh(box, "kill -KILL $$").code == 128 + signal.SIGKILL


@pytest.mark.spec("V2")
def test_stdout_stderr_cwd_and_the_environment_exactly_as_given(
    box: SessionSandbox, workspace: Path
) -> None:
    done = sh(box, "echo out; echo err >&2; pwd", cwd=str(workspace))
    assert (done.code, done.out, done.err) == (0, f"out\n{workspace}\n", "err\n")
    env = {"PATH": PATH, "ONLY": "this", "EMPTY": ""}
    assert run(box, ["env"], env=env).out.splitlines() == ["PATH=" + PATH, "ONLY=this", "EMPTY="]
    # Not even PATH when none is given (the program is found on the default PATH).
    assert run(box, ["env"], env={"ALONE": "1"}).out == "ALONE=1\n"


@pytest.mark.spec("V2")
def test_a_command_that_cannot_start_is_a_failure_before_it_never_a_run(
    box: SessionSandbox, workspace: Path
) -> None:
    command, out_r, err_r = start(box, ["no-such-program-here"])
    assert command.wait_ready(30) is False
    assert "no-such-program-here" in (command.failure or "")
    assert command.wait(30) == 127
    command.close()
    read_all(out_r), read_all(err_r)
    marker = workspace / "ran"
    command, out_r, err_r = start(box, ["touch", str(marker)], cwd=str(workspace / "missing"))
    assert command.wait_ready(30) is False
    assert "missing" in (command.failure or "")
    command.close()
    read_all(out_r), read_all(err_r)
    assert not marker.exists()
    command, out_r, err_r = start(box, ["true"])
    assert command.wait_ready(30) is True and command.failure is None
    assert command.wait(30) == 0
    command.close()
    read_all(out_r), read_all(err_r)


@pytest.mark.spec("V2")
def test_rlimits_are_applied(box: SessionSandbox) -> None:
    limits = current_rlimits()
    limits[resource.RLIMIT_NOFILE] = (100, 200)
    limits[resource.RLIMIT_CORE] = (0, 0)
    done = sh(box, "ulimit -n; ulimit -Hn; ulimit -c", rlimits=limits)
    assert done.out.split() == ["100", "200", "0"], done.err
    # What the caller had is what the command has, limit by limit.
    mine = sh(box, "ulimit -Hn; ulimit -s", rlimits=current_rlimits()).out.split()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    assert mine == [str(hard), "unlimited" if stack < 0 else str(stack // 1024)]


@pytest.mark.spec("V2")
def test_the_command_joins_the_cgroups_passed_before_it_starts(box: SessionSandbox) -> None:
    tree = CgroupTree.probe() if SandboxProfile.probe().active("cgroups") else None
    if tree is None:
        pytest.skip("no writable cgroup hierarchy here")
    group = tree.create(f"sbx-{secrets.token_hex(4)}")
    fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in group.procs_files()]
    try:
        # The command reads its own cgroups, then stays while we read the group's.
        script = f"cat /proc/self/cgroup; echo; sleep {sleep_mark()}"
        command, out_r, err_r = start(box, ["sh", "-c", script], cgroup_procs=fds)
        assert command.wait_ready(30) is True
        assert command.pid is not None
        seen = b""
        while not seen.endswith(b"\n\n"):
            chunk = os.read(out_r, 4096)
            assert chunk, seen
            seen += chunk
        members = {int(p) for f in group.procs_files() for p in f.read_text().split()}
        # Its init and everything under it are in the group.
        children = {c.pid for c in psutil.Process(command.pid).children(recursive=True)}
        assert command.pid in members and children and children <= members
        command.close()
        read_all(out_r), read_all(err_r)
    finally:
        for fd in fds:
            os.close(fd)
        group.kill_all()
        for _ in range(100):
            group.remove()
            if not any(d.exists() for d in group.dirs.values()):
                break
            threading.Event().wait(0.05)
        tree.close()
    # In every hierarchy (one line of /proc/self/cgroup each).
    lines = seen.decode().splitlines()
    assert len([ln for ln in lines if ln.endswith("/" + group.name)]) == len(group.dirs), lines


@pytest.mark.spec("V2")
def test_own_cgroup_procs_are_what_our_children_would_join(box: SessionSandbox) -> None:
    fds = own_cgroup_procs()
    try:
        done = sh(box, "cat /proc/self/cgroup", cgroup_procs=fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert done.code == 0, done.err
    assert sorted(done.out.splitlines()) == sorted(
        Path("/proc/self/cgroup").read_text().splitlines()
    )


@pytest.mark.spec("V2")
def test_a_command_sees_and_signals_only_its_own_processes(box: SessionSandbox) -> None:
    # Given a command already running in the same session sandbox.
    mark = sleep_mark()
    other, out_r, err_r = start(box, ["sleep", mark])
    assert other.wait_ready(30) is True and other.pid is not None
    # When another lists /proc, and signals everything it can name.
    script = (
        "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; "
        # (the mark in two halves: this script's own command line has not all of it)
        f'm={mark[:5]}; grep -l "${{m}}{mark[5:]}" /proc/[0-9]*/cmdline; echo found=$?; '
        f"kill -0 {box.pid} 2>/dev/null; echo holder=$?; "
        f"kill -0 {other.pid} 2>/dev/null; echo other=$?; "
        "readlink /proc/1/fd/0 >/dev/null 2>&1; echo init_fds=$?; "
        "cat /proc/1/environ >/dev/null 2>&1; echo init_environ=$?; "
        "kill -KILL -1; echo killed_all=$?"
    )
    done = sh(box, script)
    lines = done.out.splitlines()
    pids = lines[0].split()
    # Then it saw its init (1), its shell and its pipeline, and nothing of the other.
    assert "1" in pids and len(pids) <= 5, lines
    assert int(max(pids, key=int)) < 100, lines
    assert lines[1:] == [
        "found=1",
        "holder=1",
        "other=1",
        "init_fds=1",
        "init_environ=1",
        "killed_all=1",  # ESRCH: nothing else it may signal (its init is spared)
    ], done.out
    # And the other command still runs.
    assert other.poll() is None
    assert marked(mark)
    other.close()
    read_all(out_r), read_all(err_r)
    assert marked(mark) == []


@pytest.mark.spec("V2")
def test_signal_reaches_every_process_and_kill_ends_the_command(box: SessionSandbox) -> None:
    mark = sleep_mark()
    command, out_r, err_r = start(box, ["sh", "-c", f"sleep {mark} & sleep {mark}"])
    assert command.wait_ready(30) is True
    for _ in range(200):
        if len(marked(mark)) == 2:
            break
        threading.Event().wait(0.02)
    command.signal(signal.SIGTERM)
    assert command.wait(30) == 128 + signal.SIGTERM
    # The background sleep got it too: gone before the command's call ends.
    for _ in range(200):
        if not marked(mark):
            break
        threading.Event().wait(0.02)
    assert marked(mark) == []
    command.close()
    read_all(out_r), read_all(err_r)
    command, out_r, err_r = start(box, ["sleep", mark])
    assert command.wait_ready(30) is True
    command.kill()
    assert command.wait(30) == 128 + signal.SIGKILL
    command.close()
    read_all(out_r), read_all(err_r)
    assert marked(mark) == []


@pytest.mark.spec("V2")
@pytest.mark.parametrize("end", ["close", "kill"])
def test_everything_a_command_started_ends_with_it(box: SessionSandbox, end: str) -> None:
    # Given a command whose children escaped its process group and its session.
    mark = sleep_mark()
    script = (
        f"setsid sleep {mark} & nohup sleep {mark} >/dev/null 2>&1 & "
        f"(sh -c 'sleep {mark} &' &) ; sleep 0.01; echo started"
    )
    command, out_r, err_r = start(box, ["sh", "-c", script])
    assert command.wait(30) == 0
    for _ in range(200):
        if len(marked(mark)) == 3:
            break
        threading.Event().wait(0.02)
    assert len(marked(mark)) == 3  # they outlived the shell
    # When its call ends.
    if end == "kill":
        command.kill()
    command.close()
    # Then none of them is left.
    assert marked(mark) == []
    assert read_all(out_r) == "started\n"
    read_all(err_r)


@pytest.mark.spec("V2")
def test_the_client_closing_the_connection_ends_the_command(box: SessionSandbox) -> None:
    mark = sleep_mark()
    command, out_r, err_r = start(box, ["sleep", mark])
    assert command.wait_ready(30) is True and command.pid is not None
    init = command.pid
    assert psutil.pid_exists(init) and marked(mark)
    command.close()
    # close() returns once the init has ended; the helper reaps it a moment later.
    assert marked(mark) == [] and ended(init)
    read_all(out_r), read_all(err_r)


# -- V4: the machinery is out of reach ---------------------------------------------------


@pytest.mark.spec("V4", "X5")
def test_a_command_has_no_capability_no_new_privs_and_the_seccomp_filter(
    box: SessionSandbox,
) -> None:
    done = sh(box, "grep -E '^(Cap(Inh|Eff|Prm|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status")
    seen = dict(line.split(":\t") for line in done.out.splitlines())
    assert seen == {
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }, done.out
    # And it may make no namespace, mount nothing, no user namespace.
    tries = "unshare -U true; echo $?; unshare -m true; echo $?; mount -t tmpfs x /mnt; echo $?"
    assert sh(box, tries + " 2>/dev/null").out.split() == ["1", "1", "32"]


_FDS = r"""
import json, os
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[name] = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
        pass
print(json.dumps(fds))
"""


@pytest.mark.spec("V4")
def test_a_command_holds_only_the_fds_it_was_given(box: SessionSandbox) -> None:
    extra_r, extra_w = os.pipe()
    try:
        done = run(box, [sys.executable, "-I", "-S", "-c", _FDS], extra_fds=[extra_w])
    finally:
        os.close(extra_w)
    state = os.read(extra_r, 10)
    os.close(extra_r)
    fds = json.loads(done.out)
    assert sorted(fds) == ["0", "1", "2", "3"], fds
    assert not any(t.startswith("socket:") for t in fds.values()), fds
    assert fds["0"] == "/dev/null" and fds["3"].startswith("pipe:")
    assert state == b""  # fd 3 is the pipe we passed: it closed when the command ended


_ATTACK = r"""
import os, socket, struct, sys
from toolpool.sandbox.spawn import spawn
marker, socket_path = sys.argv[1], sys.argv[2]
worked = []
argv = ["touch", marker]
def attempt(label, connect):
    try:
        command = connect()
    except Exception:
        return
    worked.append(label)
# 1. the host socket's path
attempt("path", lambda: spawn(socket_path, argv, env={}, cwd="/", stdin=0, stdout=1, stderr=2))
# 2. every fd this process has, used as the request connection
for fd in range(3, 1024):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    try:
        s.send(b"x")
        worked.append(f"fd {fd}")
    except OSError:
        pass
    s.close()
# 3. any fd of any process it can see, opened again through /proc
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:") and pid != str(os.getpid()):
            worked.append(f"socket of {pid}: {target}")
# 4. the init's root, where the helper's mount namespace starts
try:
    os.listdir("/proc/1/root/")
    worked.append("init root")
except OSError:
    pass
print(" ".join(worked) or "nothing")
"""


@pytest.mark.spec("V4")
def test_a_command_cannot_reach_the_spawner_to_start_another(
    box: SessionSandbox, workspace: Path
) -> None:
    marker = workspace / "escaped"
    argv = [sys.executable, "-I", "-c", _ATTACK, str(marker), str(box.socket_path)]
    done = run(box, argv, cwd=str(workspace))
    assert done.out.strip() == "nothing", (done.out, done.err)
    assert not marker.exists()
    # The path exists on the host, and works from here: only the sandbox cannot see it.
    assert box.socket_path.exists()
    assert sh(box, f"test -e {box.socket_path}; echo $?").out == "1\n"


# -- V1: one sandbox per session ---------------------------------------------------------


@pytest.mark.spec("V1")
def test_tmp_lives_as_long_as_the_session_and_is_its_own(
    box: SessionSandbox, workspace: Path, socket_dir: Path
) -> None:
    assert sh(box, "echo kept > /tmp/note").code == 0
    assert sh(box, "cat /tmp/note").out == "kept\n"
    with SessionSandbox.start(
        roots=[workspace], network=False, tmp_bytes=16 << 20, socket_dir=socket_dir
    ) as other:
        assert "note" not in sh(other, "ls -A /tmp").out.split()
        assert sh(other, "echo other > /tmp/note").code == 0
    assert sh(box, "cat /tmp/note").out == "kept\n"
    assert not Path("/tmp/note").exists() or Path("/tmp/note").read_text() != "kept\n"
    # The workspace is the host's own, read-write; the rest of the root read-only.
    assert (
        sh(box, "echo w > w.txt; touch /usr/x 2>/dev/null; echo $?", cwd=str(workspace)).out
        == "1\n"
    )
    assert (workspace / "w.txt").read_text() == "w\n"


@pytest.mark.spec("V1")
def test_close_leaves_no_process_and_no_socket(workspace: Path, socket_dir: Path) -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    box = SessionSandbox.start(
        roots=[workspace], network=False, tmp_bytes=16 << 20, socket_dir=socket_dir
    )
    mark = sleep_mark()
    command, out_r, err_r = start(box, ["sleep", mark])
    assert command.wait_ready(30) is True
    assert box.alive() and psutil.pid_exists(box.pid) and marked(mark)
    started = {p.pid for p in me.children(recursive=True)} - before
    assert box.pid in started
    box.close()
    box.close()  # idempotent
    assert not box.alive()
    assert marked(mark) == []
    assert {p.pid for p in me.children(recursive=True)} - before == set()
    for pid in started:
        assert not psutil.pid_exists(pid)  # reaped too: no zombie
    assert not box.socket_path.exists()
    assert command.wait(30) == 128 + signal.SIGKILL
    command.close()
    read_all(out_r), read_all(err_r)


@pytest.mark.spec("V1")
def test_a_socket_dir_the_sandbox_would_see_is_refused(workspace: Path) -> None:
    with pytest.raises(SandboxStartError, match="visible inside the sandbox"):
        SessionSandbox.start(
            roots=[workspace], network=False, tmp_bytes=1 << 20, socket_dir=workspace
        )


@pytest.mark.spec("V3")
@pytest.mark.parametrize("cc", ["/bin/false", "no-such-compiler"])
def test_the_sandbox_fails_clearly_when_its_helper_cannot_be_built(
    workspace: Path, socket_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cc: str
) -> None:
    monkeypatch.setenv("TOOLPOOL_HELPER_DIR", str(tmp_path / "helpers"))
    monkeypatch.setenv("CC", cc)
    with pytest.raises(SandboxStartError, match="gcc libc6-dev") as caught:
        SessionSandbox.start(
            roots=[workspace], network=False, tmp_bytes=1 << 20, socket_dir=socket_dir
        )
    assert caught.value.code == "sandbox_failed"
    assert list(socket_dir.iterdir()) == []


@pytest.mark.spec("V3")
def test_the_helper_is_static_and_comes_from_the_host(box: SessionSandbox) -> None:
    from toolpool.sandbox.helper_binary import spawner_binary

    binary = spawner_binary()
    assert b"ld-linux" not in binary.read_bytes()[:4096]  # no interpreter: static
    # The holder runs it, but nothing of it is a path inside the sandbox.
    exe = os.readlink(f"/proc/{box.pid}/exe")
    assert exe == str(binary)
    assert sh(box, f"test -e {binary}; echo $?").out == "1\n" or not str(binary).startswith("/tmp")


# -- the network, once per session (V1, X3) ---------------------------------------------


def _pastas() -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error, IndexError):
            if Path(process.cmdline()[0]).name == "pasta":
                found.append(process)
    return found


_DIAL = r"""
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), 3)
    print("connected")
except OSError as exc:
    print("refused", exc)
"""


@pytest.mark.spec("V1", "X3")
@pytest.mark.skipif(shutil.which("pasta") is None, reason="needs pasta (Debian passt)")
def test_a_network_allowed_session_has_one_pasta_and_no_host_loopback(
    workspace: Path, socket_dir: Path
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        box = SessionSandbox.start(
            roots=[workspace], network=True, tmp_bytes=16 << 20, socket_dir=socket_dir
        )
        try:
            # (pasta forks into the background: its first process may still be ending)
            wait_until(lambda: len(_pastas()) == 1, "one pasta for the session")
            for _ in range(2):
                done = run(box, [sys.executable, "-I", "-S", "-c", _DIAL, str(port)])
                assert done.out.startswith("refused"), done.out + done.err
            routes = sh(box, "cat /proc/net/route").out
            assert len(_pastas()) == 1  # still the one of the session
        finally:
            box.close()
    assert any(line.split()[1] == "00000000" for line in routes.splitlines()[1:]), routes
    assert _pastas() == []


@pytest.mark.spec("V1")
def test_an_offline_session_has_an_empty_network_namespace(box: SessionSandbox) -> None:
    done = sh(
        box, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; cat /proc/net/route | wc -l"
    )
    assert done.out.split() == ["lo", "1"], done.out


# -- the doctor ----------------------------------------------------------------------------


@pytest.mark.spec("V1", "X1")
def test_the_doctor_starts_a_session_sandbox_and_says_why_when_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolpool.sandbox.selfcheck import session_self_check

    ok, detail = session_self_check()
    assert ok, detail
    assert "own PID namespace" in detail
    monkeypatch.setenv("TOOLPOOL_HELPER_DIR", str(tmp_path / "helpers"))
    monkeypatch.setenv("CC", "no-such-compiler")
    ok, detail = session_self_check()
    assert not ok and "no C compiler" in detail and "libc6-dev" in detail


@pytest.mark.spec("V4", "X5")
def test_no_user_namespace_even_without_the_seccomp_filter(
    workspace: Path, socket_dir: Path
) -> None:
    profile = SandboxProfile.probe(disabled={"seccomp"})
    with SessionSandbox.start(
        roots=[workspace], network=False, tmp_bytes=1 << 20, socket_dir=socket_dir, profile=profile
    ) as box:
        done = sh(box, "grep Seccomp: /proc/self/status; unshare -U true; echo $?")
    assert done.out.split() == ["Seccomp:", "0", "1"], done.out + done.err
    assert "No space left" in done.err  # max_user_namespaces is 0 in the sandbox


_STARTER = """
import sys, threading
from pathlib import Path
from toolpool.sandbox.session_box import SessionSandbox
base = Path(sys.argv[1])
def starts(n):  # sandboxes starting one after another, as sessions open
    for i in range(1000):
        ws = base / f"ws{n}-{i}"
        ws.mkdir()
        SessionSandbox.start(roots=[ws], network=False, tmp_bytes=1 << 20, socket_dir=base / "s")
        print(i, flush=True)
threads = [threading.Thread(target=starts, args=(n,)) for n in range(2)]
for t in threads: t.start()
for t in threads: t.join()
"""


def _of(base: Path) -> list[psutil.Process]:
    """Live processes whose command line names ``base`` (bubblewrap's, the helper's)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(str(base) in a for a in cmdline):
            found.append(process)
    return found


@pytest.mark.spec("V1")
@pytest.mark.parametrize("moment", range(8))
def test_V1_a_starter_killed_while_sandboxes_start_leaves_none(tmp_path: Path, moment: int) -> None:
    """A daemon that dies while its sandboxes start: every sandbox it made or was making
    ends with it, from any moment of a start — bubblewrap too, which once died of
    SIGPIPE writing its --info-fd to the dead daemon, leaving the sandbox's half-made
    pid 1 waiting for it forever."""
    base = tmp_path / "b"
    (base / "s").mkdir(parents=True, mode=0o700)
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(base)], stdout=subprocess.PIPE, text=True
    )
    assert starter.stdout is not None
    for _ in range(2 + moment):  # some started, others starting
        assert starter.stdout.readline(), "the starter ended"
    starter.kill()  # as a daemon dies: at once, mid-start, no clean-up of its own
    starter.wait()
    starter.stdout.close()
    deadline = time.monotonic() + 10  # a hang guard, not a measure
    while _of(base) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _of(base)
    found = [" ".join(p.cmdline())[:80] for p in left]
    for process in left:  # not to leave them to the rest of the suite
        process.kill()
    assert found == []


@pytest.mark.spec("V2")
def test_a_command_starts_and_ends_when_its_descriptors_are_numbered_past_1024(
    box: SessionSandbox,
) -> None:
    # Given a process with over a thousand descriptors open (a daemon with many
    # shells and sandboxes): select() could not wait on the ones past 1024

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: no descriptor past 1024 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    ballast = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        # When a command is started and waited for, its socket and pidfd past 1024
        command, out_r, err_r = start(box, ["echo", "high"])
        assert command.wait_ready(30) is True
        assert command.wait(30) == 0
        command.close()
        assert read_all(out_r) == "high\n"
        read_all(err_r)
    finally:
        for fd in ballast:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.spec("V1", "X12")
def test_a_command_asked_of_a_sandbox_that_died_is_refused_at_once(box: SessionSandbox) -> None:
    # Given a sandbox whose holder died (the helper holds its listening socket alone)
    os.kill(box.pid, signal.SIGKILL)
    wait_until(lambda: not box.alive(), "the sandbox ended")
    # When a command is asked of it, then the request is refused — no connection waits
    # for a ready byte that will never come — and the caller can start another sandbox
    with pytest.raises(SpawnError):
        start(box, ["true"])
