"""A daemon not run as root (SPEC V17): its sessions' layers — an overlay workspace,
an overlay root, an image root — live in a user namespace of its own. The daemon runs
as a throw-away uid (``setpriv --reuid``) from a venv made with ``/usr/bin/python3``
in a directory that uid can read, installed from the wheel E5 builds; real mounts,
real images, real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from toolpool.sandbox.profile import SandboxProfile

from .image_builders import bash_layer, busybox_layers, write_oci
from .wheel_support import build_wheel, install

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
SCENARIO = Path(__file__).with_name("unprivileged_scenario.py")

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0
        or shutil.which("setpriv") is None
        or not os.path.exists(SYSTEM_PYTHON)
        or not SandboxProfile.probe().active("session"),
        reason="needs root (to become a throw-away uid), setpriv, Debian's python3 and "
        "session sandboxes",
    ),
    pytest.mark.timeout(300),  # the wheel's build and install count against the first test
]


def _as_nobody(base: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(base / "home"), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env["LANG"] = "C.UTF-8"
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        cwd=base / "home",
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _holders() -> list[int]:
    """The throw-away uid's layer holders still running."""
    found = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        uids, cmdline = process.info["uids"], process.info["cmdline"] or []
        if uids and uids.real == NOBODY and any("layer_holder" in part for part in cmdline):
            found.append(process.pid)
    return found


@pytest.fixture(scope="module")
def mine() -> Iterator[Path]:
    """A host directory the uid owns, outside /tmp (private in a sandbox)."""
    place = Path(tempfile.mkdtemp(prefix="toolpool-v17-", dir="/var/tmp"))
    os.chown(place, NOBODY, NOBODY)
    yield place
    shutil.rmtree(place, ignore_errors=True)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    place = Path(tempfile.mkdtemp(prefix="toolpool-v17-", dir="/tmp"))
    try:
        place.chmod(0o755)
        wheel = build_wheel(place / "build")
        install(wheel, place / "venv", SYSTEM_PYTHON)
        for name in ("home", "ws", "images"):
            (place / name).mkdir()
        write_oci(place / "images" / "oci", [*busybox_layers(), bash_layer()])
        # The checkout may lie where the uid cannot read (under /root): a copy it can
        shutil.copy(SCENARIO, place / SCENARIO.name)
        (place / "ws" / "kept.txt").write_text("host\n")
        for path in [place / "home", place / "ws", place / "ws" / "kept.txt"]:
            os.chown(path, NOBODY, NOBODY)
        yield place
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.fixture(scope="module")
def seen(base: Path, mine: Path) -> dict[str, Any]:
    image = str(base / "images" / "oci")
    python = str(base / "venv" / "bin" / "python")
    done = _as_nobody(base, python, str(base / SCENARIO.name), str(base), image, str(mine))
    log = base / "home" / "daemon.log"
    assert done.returncode == 0, done.stderr + (log.read_text() if log.exists() else "")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def ok(result: dict[str, Any]) -> str:
    assert result["error"] is None, result["text"]
    return str(result["text"])


@pytest.mark.spec("V17")
def test_V17_the_doctor_of_an_unprivileged_user_mounts_layers_in_a_namespace(base: Path) -> None:
    done = _as_nobody(base, str(base / "venv" / "bin" / "toolpool"), "doctor")
    assert "session layers" in done.stdout, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("session layers"))
    assert "works" in line and "user namespace" in line, line
    assert "only what this user may write" in line


@pytest.mark.spec("V17")
def test_V17_an_overlay_workspace_works_for_an_unprivileged_daemon(
    seen: dict[str, Any], base: Path
) -> None:
    assert seen["uid"] == NOBODY
    ok(seen["write"])
    assert ok(seen["command"]).startswith("tool\n")
    assert ok(seen["pwd"]).splitlines()[0] == str(base / "ws" / "sub")
    assert "changed" in ok(seen["read"]) and "kept.txt" in ok(seen["grep"])
    environment = seen["environment"]
    assert environment["workspace_mode"] == "overlay"
    assert environment["layers_in"] == "user namespace"
    # The host's directory never changed, during the session or after
    assert seen["host_during"] == seen["host_after"] == ["kept.txt"]
    assert (base / "ws" / "kept.txt").read_text() == "host\n"


@pytest.mark.spec("V17")
def test_V17_an_unprivileged_overlay_root_writes_only_where_its_user_may(
    seen: dict[str, Any],
) -> None:
    lines = ok(seen["root"]).splitlines()
    # /usr/local is root's on the host: not writable; nor is /var/tmp, root's too (its
    # mode lets anyone write, but a copy-up cannot give root's files to an unmapped uid)
    assert "usr_local=1" in lines and "var_tmp=1" in lines
    assert not os.path.exists("/var/tmp/toolpool-probe")
    # And so is a directory the uid owns below a directory root owns: overlayfs copies
    # the directories above a write up with their owner, which the namespace cannot map
    assert "mine=1" in lines
    # apt's sandbox setting is in the session's /etc, the host's /etc untouched
    assert any('APT::Sandbox::User "root";' in line for line in lines)
    assert not os.path.exists("/etc/apt/apt.conf.d/99toolpool-sandbox")
    # Root's own files stay out of reach of the session
    assert "root_home=0" not in lines and "pid1_root=0" not in lines
    assert seen["root_environment"]["root_writable"].startswith("only what the daemon's user")


@pytest.mark.spec("V17")
def test_V17_an_unprivileged_image_root_shows_its_files_as_roots(seen: dict[str, Any]) -> None:
    kept, greeting, listing = ok(seen["image"]).splitlines()[:3]
    assert (kept, greeting) == ("kept", "hello")
    assert listing.split()[2:4] == ["0", "0"]  # unpacked by the uid, root's inside
    assert ok(seen["image_again"]).startswith("mine")
    assert "No such file" in ok(seen["image_other"])  # another session's, not this one's


@pytest.mark.spec("V17")
@pytest.mark.spec("B3")
def test_V17_B3_an_unprivileged_daemons_sessions_fork_and_rewind(seen: dict[str, Any]) -> None:
    # The fork at the mark has the workspace and the image root of then
    assert ok(seen["fork_at_mark"]).splitlines()[:2] == ["one", "img"]
    # What it writes is its own, the parent's is the parent's
    assert ok(seen["parent_after_fork"]).startswith("two")
    assert ok(seen["fork_after_rewind"]).splitlines()[:2] == ["fork", "fork"]
    # Parent and fork share one holder: its layers are stacked on the parent's
    assert seen["holders_of_family"] == 1
    # A rewind puts both trees back, the root's deletion undone
    assert seen["rewound"] is True
    assert ok(seen["after_rewind"]).splitlines()[:2] == ["one", "img"]
    assert "+one" in seen["diff"] and "branch.txt" in seen["diff"]


@pytest.mark.spec("V17", "B13")
def test_V17_B13_a_rewind_frees_its_room_beside_a_forks_sandbox_in_the_same_holder(
    seen: dict[str, Any],
) -> None:
    # The parent read its 2 MiB through overlays the fork's running sandbox had copied
    # (one holder's namespaces for both); the rewind that dropped them freed the room
    # by the time it answered
    assert seen["used_after_rewind"] < 2**20


@pytest.mark.spec("V17")
def test_V17_an_unprivileged_daemon_leaves_no_holder_and_no_layer(
    seen: dict[str, Any], mine: Path
) -> None:
    assert seen["daemon_exit"] == 0
    assert seen["layers_left"] == []
    assert _holders() == []
    assert os.listdir(mine) == []  # what the session wrote there was its own
