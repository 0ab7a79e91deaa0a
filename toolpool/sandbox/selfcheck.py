"""The doctor's check that confinement works here: one real confined command (X1).

    ok, detail = self_check(profile)   # (ok, what it saw or why it failed)

The command reports its capabilities, whether the private /tmp is in place, and
whether it can write outside the workspace; any of those wrong is a failure.
"""

from __future__ import annotations

from pathlib import Path

from toolpool.sandbox.command import confined
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import SandboxProfile

# A command that reports what a confined process sees: its capabilities, whether the
# private /tmp and /run are in place, and whether it can write outside the workspace.
_SELF_CHECK = r"""
caps=$(grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status | awk '{print $2}' | sort -u | tr '\n' ' ')
echo "caps=$caps"
echo "tmp=$(ls -A /tmp | tr '\n' ' ')"
touch /toolpool-doctor-probe 2>/dev/null && echo "root=writable" || echo "root=readonly"
echo ok > probe && echo "workspace=writable"
"""


def self_check(
    profile: SandboxProfile | None = None, policy: Policy | None = None
) -> tuple[bool, str]:
    """Run one real confined command and say whether it ran confined (X1): the
    ``doctor`` and the daemon's start-up check. (ok, what it saw or why it failed)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toolpool-doctor-") as directory:
        workspace = Path(directory)
        with confined(
            ["sh", "-c", _SELF_CHECK], workspace=workspace, profile=profile, policy=policy
        ) as box:
            try:
                process = subprocess.Popen(
                    box.argv,
                    cwd=workspace,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    pass_fds=box.pass_fds,
                    env=box.env,
                )
            except OSError as exc:
                return False, f"cannot start {box.argv[0]}: {exc}"
            box.started()
            try:
                out, _ = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                return False, "the confined command did not finish within 30 s"
        text = out.decode(errors="replace")
        failure = box.failure(process.returncode, text)
        if failure is not None:
            return False, failure
        seen = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        layers = ", ".join(box.layers) or "no layer"
        problems = []
        if seen.get("workspace") != "writable":
            problems.append("the workspace was not writable")
        confined_writes = "bwrap" in box.layers or "landlock" in box.layers
        if confined_writes and seen.get("root") != "readonly":
            problems.append("a path outside the workspace was writable")
        if seen.get("caps", "").split() != ["0000000000000000"] and (
            "bwrap" in box.layers or "no capabilities" in box.layers
        ):
            problems.append(f"capabilities left: {seen.get('caps', '?').strip()}")
        if process.returncode != 0:
            problems.append(f"it exited with status {process.returncode}: {text.strip()[-200:]}")
        if problems:
            return False, "; ".join(problems)
        return True, f"a confined command ran ({layers})"


# What a command of a session sandbox sees: its capability sets, no_new_privs and
# seccomp, the processes it can see, and the session's private /tmp.
_SESSION_CHECK = r"""
grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\t'
echo "pids=$(ls /proc | grep -cE '^[0-9]+$')"
echo "tmp=$(ls -A /tmp | tr '\n' ' ')"
"""
_SESSION_WANTED = {
    "CapEff": "0000000000000000",
    "CapPrm": "0000000000000000",
    "CapBnd": "0000000000000000",
    "CapAmb": "0000000000000000",
    "NoNewPrivs": "1",
}


def session_self_check(
    profile: SandboxProfile | None = None, policy: Policy | None = None
) -> tuple[bool, str]:
    """Start a session sandbox (SPEC V1) and run one command in it: (ok, what it
    saw, or why it could not)."""
    import os
    import shutil
    import tempfile

    from toolpool.sandbox.session_box import SandboxStartError, SessionSandbox
    from toolpool.sandbox.spawn import SpawnError, spawn

    base = Path(tempfile.mkdtemp(prefix="toolpool-doctor-"))
    try:
        (base / "ws").mkdir()
        try:
            box = SessionSandbox.start(
                roots=[base / "ws"],
                network=False,
                tmp_bytes=1 << 20,
                socket_dir=base,
                policy=policy,
                profile=profile,
            )
        except SandboxStartError as exc:
            return False, exc.message
        read, write = os.pipe()
        try:
            with box:
                try:
                    command = spawn(
                        box.socket_path,
                        ["sh", "-c", _SESSION_CHECK],
                        env={"PATH": "/usr/bin:/bin"},
                        cwd=str(base / "ws"),
                        stdin=read,
                        stdout=write,
                        stderr=write,
                    )
                except SpawnError as exc:
                    return False, str(exc)
                os.close(write)
                write = -1
                with command:
                    if command.wait_ready(30) is not True:
                        return False, f"the command did not start: {command.failure}"
                    code = command.wait(30)
                with os.fdopen(read, "rb") as f:
                    read = -1
                    text = f.read().decode(errors="replace")
        finally:
            for fd in (read, write):
                if fd >= 0:
                    os.close(fd)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    seen: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":" if ":" in line else "=")
        seen[key] = value
    problems = [
        f"{k} is {seen.get(k, '?')}" for k, v in _SESSION_WANTED.items() if seen.get(k) != v
    ]
    if seen.get("pids", "?") not in ("3", "4", "5"):
        problems.append(f"it saw {seen.get('pids', '?')} processes, not only its own")
    if code != 0:
        problems.append(f"it exited with status {code}: {text.strip()[-200:]}")
    if problems:
        return False, "; ".join(problems)
    seccomp = "seccomp" if seen.get("Seccomp") == "2" else "no seccomp"
    return (
        True,
        f"a command ran in a session sandbox (own PID namespace, no capabilities, {seccomp})",
    )
