"""SPEC D3: the sandbox profile, and commands confined by each layer."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolpool.sandbox import SandboxProfile, confined
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.mounts import hidden_from_sandbox
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import MECHANISMS, Mechanism

PROFILE = SandboxProfile.probe()


def only(*names: str) -> SandboxProfile:
    """The machine's profile with every other mechanism switched off."""
    return SandboxProfile(
        tuple(
            m if m.name in names or m.name == "rlimits" else Mechanism(m.name, False, "off")
            for m in PROFILE.mechanisms
        )
    )


def needs(*names: str) -> pytest.MarkDecorator:
    missing = [m for m in PROFILE.mechanisms if m.name in names and not m.active]
    reason = "; ".join(f"{m.name} unavailable: {m.detail}" for m in missing)
    return pytest.mark.skipif(bool(missing), reason=reason or "available")


def run(profile: SandboxProfile, script: str, workspace: Path, network: bool = False) -> str:
    with confined(["sh", "-c", script], workspace=workspace, network=network, profile=profile) as c:
        done = subprocess.run(
            c.argv, pass_fds=c.pass_fds, capture_output=True, text=True, cwd=workspace, check=False
        )
    return done.stdout + done.stderr


WRITES = "touch inside && echo inside-ok; touch /etc/toolpool-test 2>/dev/null && echo outside-ok"


@pytest.mark.spec("D3")
def test_D3_profile_names_every_mechanism_and_why_it_is_off() -> None:
    lines = PROFILE.describe()
    assert [line.split()[1] for line in lines] == list(MECHANISMS)
    assert all(line.startswith(("on ", "off")) for line in lines)
    assert PROFILE.active("rlimits")
    disabled = SandboxProfile.probe(disabled={"bwrap", "landlock"})
    assert not disabled.active("bwrap")
    assert "disabled by configuration" in disabled.describe()[MECHANISMS.index("bwrap")]
    assert SandboxProfile.from_dict(PROFILE.to_dict()) == PROFILE
    with pytest.raises(ValueError, match="unknown sandbox mechanisms"):
        SandboxProfile.probe(disabled={"magic"})


def test_doctor_prints_the_profile() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "doctor"], capture_output=True, text=True, check=True
    )
    for mechanism in MECHANISMS:
        assert mechanism in done.stdout


@pytest.mark.spec("D3")
@needs("bwrap")
def test_D3_bwrap_confines_writes_and_network(workspace: Path) -> None:
    interfaces = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
    out = run(only("bwrap"), f"{WRITES}; echo interfaces; {interfaces}", workspace)
    assert "inside-ok" in out
    assert "outside-ok" not in out
    assert not Path("/etc/toolpool-test").exists()
    assert out.split("interfaces")[-1].split() == ["lo"]  # a namespace of its own
    online = run(only("bwrap"), interfaces, workspace, network=True)
    assert len(online.split()) > 1  # the host's interfaces


@pytest.mark.spec("D3")
@needs("landlock")
def test_D3_landlock_alone_confines_writes(workspace: Path) -> None:
    out = run(only("landlock"), WRITES, workspace)
    assert "inside-ok" in out
    assert "outside-ok" not in out
    assert not Path("/etc/toolpool-test").exists()


@pytest.mark.spec("D3")
@needs("seccomp")
@pytest.mark.parametrize("with_bwrap", [False, True])
def test_D3_seccomp_denies_namespace_and_mount_calls(workspace: Path, with_bwrap: bool) -> None:
    if with_bwrap and not PROFILE.active("bwrap"):
        pytest.skip("bwrap unavailable")
    profile = only("seccomp", "bwrap") if with_bwrap else only("seccomp")
    libc = "ctypes.CDLL(None, use_errno=True)"
    code = f"import ctypes; libc = {libc}; print(libc.unshare(0x20000), ctypes.get_errno())"
    out = run(profile, f"{sys.executable} -I -S -c '{code}'", workspace)
    assert out.split()[:2] == ["-1", "1"]  # EPERM


@pytest.mark.spec("D3")
def test_D3_nothing_active_runs_the_command_as_is(workspace: Path) -> None:
    with confined(["true"], workspace=workspace, profile=only()) as c:
        if os.geteuid() == 0:
            # Root's capabilities are still dropped (X5): the exec wrapper does it.
            assert c.argv[-2:] == ["--", "true"]
            assert c.layers == ("no capabilities",)
        else:
            assert c.argv == ["true"]
            assert c.layers == ()


def test_limits_validate_and_merge() -> None:
    limits = Limits().merged({"memory_bytes": 10, "network": True})
    assert (limits.memory_bytes, limits.network) == (10, True)
    assert Limits.from_dict(limits.to_dict()) == limits
    with pytest.raises(ValueError, match="unknown limits"):
        Limits().merged({"cpu": 1})
    with pytest.raises(ValueError, match="wall_seconds = 0: expected a number more than 0"):
        Limits(wall_seconds=0)
    assert dataclasses.replace(limits, network=False).network is False


@pytest.mark.spec("V1")
def test_V1_a_socket_dir_under_a_mask_inside_the_workspace_is_hidden(tmp_path: Path) -> None:
    """The runtime dir may lie inside the workspace (a daemon run from its project): its
    mask is mounted over the root, so the sandboxes' sockets there are out of sight;
    elsewhere in the workspace they would be in sight, and are refused."""
    workspace = tmp_path / "ws"
    runtime = workspace / "rt"
    (runtime / "s").mkdir(parents=True)
    (workspace / "open").mkdir()
    policy = Policy(hidden=(str(runtime),))
    assert hidden_from_sandbox(runtime / "s", [workspace], policy)
    assert not hidden_from_sandbox(workspace / "open", [workspace], policy)
    assert hidden_from_sandbox(runtime / "s", [tmp_path / "elsewhere"], policy)
