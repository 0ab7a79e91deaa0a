"""Confinement of the commands bash starts, tried as a hostile model would (X1, X2,
X5, X6, X9, X11): every test runs the escape from inside a real confined command."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolpool.errors import ToolError
from toolpool.sandbox import command as command_module
from toolpool.sandbox import mounts, selfcheck
from toolpool.sandbox.command import confined
from toolpool.sandbox.policy import Policy, default_deny_read
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.selfcheck import self_check
from toolpool.tools.bash import bash

from .tool_support import tool_context

PROFILE = SandboxProfile.probe()
needs_bwrap = pytest.mark.skipif(not PROFILE.active("bwrap"), reason="bubblewrap is off here")


def run(workspace: Path, command: str, tmp_path: Path) -> str:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    ctx = tool_context(workspace, scratch_dir=scratch)
    return bash.execute({"command": command}, ctx)


def run_confined(
    argv: list[str], workspace: Path, policy: Policy
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` confined under ``policy``; the sandbox itself must have started."""
    with confined(argv, workspace=workspace, policy=policy) as box:
        done = subprocess.run(
            box.argv, cwd=workspace, capture_output=True, text=True, pass_fds=box.pass_fds,
            env=box.env, check=False, timeout=60,
        )  # fmt: skip
        box.started()
    assert box.failure(done.returncode, done.stdout + done.stderr) is None, done.stderr
    return done


# x86_64 system call numbers of everything X5 denies.
X86_64 = {
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "sethostname": 170,
    "setdomainname": 171,
    "kexec_load": 246,
    "bpf": 321,
    "perf_event_open": 298,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "userfaultfd": 323,
    "ptrace": 101,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}

PROBE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    if result == 0 and number == 56:  # a clone that went through: the child leaves
        os._exit(0)
    return errno.errorcode.get(ctypes.get_errno(), "OK") if result < 0 else "OK"
numbers = NUMBERS
for name, number in numbers.items():
    args = {"sethostname": (0, 0), "setdomainname": (0, 0), "mount_setattr": (-1, 0, 0, 0, 0)}
    print(name, call(number, *args.get(name, (0, 0, 0, 0, 0))))
print("unshare_newuser", call(272, 0x10000000))
print("clone_newuser", call(56, 0x10000000 | 17, 0, 0, 0, 0))
print("clone3", call(435, 0, 0))
for line in open("/proc/self/status"):
    if line.startswith(("Cap", "NoNewPrivs")):
        print(line.split(":")[0], line.split()[1])
"""


@needs_bwrap
@pytest.mark.spec("X5")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers for x86_64")
def test_X5_commands_have_no_privileges_and_no_way_to_regain_them(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "probe.py").write_text(PROBE.replace("NUMBERS", repr(X86_64)))
    out = run(workspace, f"{sys.executable} -I -S probe.py", tmp_path)
    seen = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    for name in X86_64:
        assert seen[name] == "EPERM", (name, out)
    assert seen["unshare_newuser"] == "EPERM"
    assert seen["clone_newuser"] == "EPERM"
    assert seen["clone3"] == "ENOSYS"
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert seen[capability_set] == "0000000000000000", out
    assert seen["NoNewPrivs"] == "1"


@needs_bwrap
@pytest.mark.spec("X5")
def test_X5_commands_have_their_own_host_name_and_cannot_remount(
    workspace: Path, tmp_path: Path
) -> None:
    out = run(
        workspace,
        "hostname toolpool-escape 2>&1; mount -o remount,rw / 2>&1; "
        "touch /toolpool-escape 2>&1; echo done",
        tmp_path,
    )
    assert "done" in out
    assert not Path("/toolpool-escape").exists()
    assert os.uname().nodename != "toolpool-escape"


@needs_bwrap
@pytest.mark.spec("X9")
def test_X9_commands_get_an_allowlisted_environment(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLPOOL_TEST_API_KEY", "sk-secret-value")
    monkeypatch.setenv("LC_TOOLPOOL_TEST", "kept")
    out = run(workspace, "env", tmp_path)
    assert "sk-secret-value" not in out
    assert "LC_TOOLPOOL_TEST=kept" in out
    assert "HOME=/tmp/home" in out
    policy = Policy(env_passthrough=("TOOLPOOL_TEST_API_KEY",))
    assert policy.environment()["TOOLPOOL_TEST_API_KEY"] == "sk-secret-value"


@needs_bwrap
@pytest.mark.spec("X9")
def test_X9_hidden_paths_are_absent_inside_commands(tmp_path: Path) -> None:
    # Given a home outside /tmp (the private /tmp would hide it anyway) with secrets.
    home = Path("/var/tmp") / f"toolpool-home-{os.getpid()}"
    try:
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
        (home / ".netrc").write_text("machine x password hunter2")
        workspace = home / "project"  # a workspace inside a hidden path stays visible
        workspace.mkdir()
        (workspace / "mine.txt").write_text("visible")
        policy = Policy(hidden=default_deny_read(home))
        script = f"cat {home}/.ssh/id_ed25519 {home}/.netrc; ls -A {home}/.ssh; cat mine.txt"
        done = run_confined(["bash", "-c", script], workspace, policy)
        assert "PRIVATE KEY" not in done.stdout and "hunter2" not in done.stdout
        assert done.stdout.strip() == "visible"
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_bwrap
@pytest.mark.spec("X6")
@pytest.mark.skipif(os.geteuid() != 0, reason="root's files matter only when running as root")
def test_X6_root_secrets_are_hidden_from_commands(workspace: Path, tmp_path: Path) -> None:
    assert {"/etc/shadow", "/root"} <= set(default_deny_read())
    out = run(workspace, "cat /etc/shadow /etc/gshadow; ls -A /root; echo end", tmp_path)
    assert "root:" not in out  # neither file can be read
    listed = out.splitlines()[-2]
    # /root is an empty tmpfs but for the mount points of what must stay visible.
    visible = {
        Path(p).relative_to("/root").parts[0]
        for p in mounts.interpreter_paths()
        if Path(p).is_relative_to("/root")
    }
    assert set(listed.split()) <= visible | {"end"}


@needs_bwrap
@pytest.mark.spec("X2")
def test_X2_run_is_private_but_names_still_resolve(workspace: Path, tmp_path: Path) -> None:
    out = run(workspace, "ls -A /run | wc -l; test -r /etc/resolv.conf && echo resolv", tmp_path)
    assert out.splitlines()[:2] == ["0", "resolv"]


@needs_bwrap
@pytest.mark.spec("X1")
def test_X1_the_interpreter_stays_visible_under_whatever_is_masked(
    workspace: Path, tmp_path: Path
) -> None:
    # Given an install whose every path is hidden (as /tmp hides an install under /tmp).
    masked = list(mounts.interpreter_paths())
    policy = Policy(hidden=tuple(masked))
    code = "import sys; print('python runs', sys.version_info[0])"
    done = run_confined([sys.executable, "-I", "-S", "-c", code], workspace, policy)
    assert done.stdout.strip() == "python runs 3"


@needs_bwrap
@pytest.mark.spec("X1")
def test_X1_a_sandbox_that_cannot_start_is_sandbox_failed(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a bubblewrap that cannot build its namespaces.
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: nope' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(command_module.shutil, "which", lambda name: str(fake))
    with pytest.raises(ToolError) as failed:
        run(workspace, "echo hello", tmp_path)
    assert failed.value.code == "sandbox_failed"
    assert "bubblewrap failed" in failed.value.message
    assert "Creating new namespace failed" in failed.value.message
    assert "toolpool doctor" in failed.value.message
    # And the doctor's own check says so plainly.
    ok, detail = self_check()
    assert not ok and "bubblewrap failed" in detail


@pytest.mark.spec("X1")
def test_X1_doctor_runs_a_real_confined_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "doctor"], capture_output=True, text=True, check=False
    )
    assert "confined command" in done.stdout
    if PROFILE.active("bwrap"):
        assert done.returncode == 0, done.stdout + done.stderr
        assert "works" in done.stdout and "bwrap" in done.stdout
    if os.geteuid() == 0:
        assert "dedicated unprivileged user" in done.stdout


@needs_bwrap
@pytest.mark.spec("X8")
def test_X8_seccomp_programs_are_never_files(workspace: Path, tmp_path: Path) -> None:
    before = set(Path("/tmp").glob("toolpool-seccomp-*"))
    out = run(workspace, "ls -l /proc/self/fd/ | grep -c seccomp || true", tmp_path)
    assert set(Path("/tmp").glob("toolpool-seccomp-*")) == before
    assert out.splitlines()[0] == "0"  # and no descriptor of it reaches the command


def test_self_check_script_is_plain_sh() -> None:
    # The doctor's probe must run under any POSIX sh (dash on Debian).
    done = subprocess.run(["sh", "-n", "-c", textwrap.dedent(selfcheck._SELF_CHECK)], check=False)
    assert done.returncode == 0


@needs_bwrap
@pytest.mark.spec("X9")
def test_X9_a_hidden_path_inside_the_workspace_is_masked_there_too(workspace: Path) -> None:
    secrets = workspace.resolve() / ".aws"
    secrets.mkdir()
    (secrets / "credentials").write_text("aws_secret_access_key = AKIA-SECRET")
    (workspace / "code.py").write_text("print('hi')")
    policy = Policy(hidden=(str(secrets),))
    script = "cat .aws/credentials 2>&1; ls -A .aws | wc -l; touch .aws/x 2>&1; cat code.py"
    done = run_confined(["bash", "-c", script], workspace, policy)
    assert "AKIA-SECRET" not in done.stdout
    assert "print('hi')" in done.stdout
    assert not (secrets / "x").exists()


@needs_bwrap
@pytest.mark.spec("X5")
def test_X5_a_command_sees_and_signals_no_process_outside(workspace: Path, tmp_path: Path) -> None:
    me = os.getpid()
    out = run(
        workspace,
        f"kill -0 {me} 2>&1 && echo SIGNALLED; test -e /proc/{me}/environ && echo SEEN; "
        "echo procs=$(ls /proc | grep -c '^[0-9]')",
        tmp_path,
    )
    assert "SIGNALLED" not in out and "SEEN" not in out
    procs = next(line for line in out.splitlines() if line.startswith("procs="))
    assert int(procs.removeprefix("procs=")) <= 5  # bwrap's init, the shell, its pipeline
