"""Image roots (SPEC V13): ``root = {"image": path}`` runs a session's commands on an
image's root file system, copy-on-write for that session — through a real daemon,
real images (busybox and the host's bash, packed by the tests), real mounts."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpool import Client, ToolResult
from toolpool.client import RequestFailed
from toolpool.models import ErrorCode
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import Daemon, shared_daemon
from .image_builders import (
    Member,
    bash_layer,
    busybox_layers,
    layer_tar,
    tar_of,
    write_docker,
    write_oci,
    write_rootfs,
)
from .shell_support import call, read_until, wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not SandboxProfile.probe().active("session"),
    reason="image roots need session sandboxes and a daemon run as root",
)

# What a command sees of the busybox image: its files, a whiteout honoured, its Env.
LOOK = "cat /etc/kept.txt; test -e /etc/gone.txt || echo gone; echo $GREETING; ls /opq"


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    images = root / "images"
    images.mkdir()
    layers = [*busybox_layers(), bash_layer()]
    oci = write_oci(images / "oci", layers)
    rootfs = write_rootfs(images / "rootfs")
    (rootfs / "bin" / "bash").unlink(missing_ok=True)
    with tarfile.open(fileobj=io.BytesIO(bash_layer())) as tar:
        tar.extractall(rootfs, filter="tar")
    evil = [
        Member("bin", tarfile.DIRTYPE, mode=0o755),
        Member("../escaped.txt", data=b"out\n"),
    ]
    return {
        "root": root,
        "images": images,
        "oci": oci,
        "oci_tar": tar_of(oci, images / "oci.tar"),
        "docker": write_docker(images / "docker.tar", layers),
        "rootfs": rootfs,
        "evil": write_oci(images / "evil", [layer_tar(evil)]),
        "outside": write_oci(root / "outside", layers),
    }


@pytest.fixture(scope="module")
def daemon(places: dict[str, Path]) -> Iterator[Daemon]:
    cache = places["root"] / "cache"
    flags = ("--image-dirs", str(places["images"]), "--image-cache", str(cache))
    (places["root"] / "d").mkdir()
    with shared_daemon(places["root"] / "d", *flags) as shared:
        yield shared


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=120) as connected:
        yield connected


def output(result: ToolResult) -> str:
    assert result.text.endswith("Exit code: 0"), result.text
    return result.text.rsplit("\nExit code:", 1)[0]


def mounts_under(path: Path) -> list[str]:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table if line.split()[4].startswith(real)]


@pytest.mark.spec("V13")
@pytest.mark.parametrize("form", ["oci", "oci_tar", "docker"])
def test_V13_a_sessions_commands_run_on_its_images_root(
    client: Client, places: dict[str, Path], workspace: Path, form: str
) -> None:
    # Given a session whose root is an image (an OCI layout, its tar, a docker save)
    with client.session(workspace, root={"image": str(places[form])}) as session:
        # When a command looks at its root
        seen = output(call(session, "bash", command=LOOK + "; pwd; echo $PATH"))
    # Then it sees the image's files (the second layer's whiteout and opaque dir
    # honoured), its Env, and starts in the workspace (the image's WorkingDir, /work,
    # is outside the session's roots)
    assert seen.splitlines() == ["kept", "gone", "hello", "new.txt", str(workspace), "/bin"]


@pytest.mark.spec("V13")
def test_V13_a_root_directory_is_used_as_it_is(
    client: Client, places: dict[str, Path], workspace: Path
) -> None:
    rootfs = places["rootfs"]
    before = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*"))
    with client.session(workspace, root={"image": str(rootfs)}) as session:
        look = "cat /etc/kept.txt; echo new > /etc/new.txt; ls /etc"
        seen = output(call(session, "bash", command=look)).splitlines()
    # The host's masks (deny_read: /etc/shadow…) show as empty placeholders there too.
    assert seen[0] == "kept" and {"kept.txt", "new.txt"} <= set(seen[1:])
    # The directory itself is the lower layer: never written
    assert sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*")) == before


@pytest.mark.spec("V13")
def test_V13_writes_to_an_image_root_are_the_sessions_alone(
    client: Client, places: dict[str, Path], workspace: Path, tmp_path: Path
) -> None:
    image = {"image": str(places["oci"])}
    other = tmp_path / "other"
    other.mkdir()
    with (
        client.session(workspace, root=image) as first,
        client.session(other, root=image) as second,
    ):
        # When a session's command writes into the image's /etc and replaces a file
        wrote = call(first, "bash", command="echo mine > /etc/mine; echo changed > /etc/kept.txt")
        assert wrote.text.endswith("Exit code: 0"), wrote.text
        # Then its later commands and its background shells see the change
        assert output(call(first, "bash", command="cat /etc/mine /etc/kept.txt")) == "mine\nchanged"
        # (the image's Env theirs too)
        shell = call(first, "bash", command="cat /etc/mine; echo $GREETING", run_in_background=True)
        read, _ = read_until(first, str(shell.details["shell_id"]), "hello")
        assert "mine" in read and "hello" in read
        # And another session of the same image sees the image as it was
        look = "cat /etc/kept.txt; test -e /etc/mine || echo absent"
        assert output(call(second, "bash", command=look)) == "kept\nabsent"
        # And status says what each session's root is and what its layer holds
        status = client.status()["sessions"][first.id]
        assert status["environment"]["root"] == "image"
        assert status["environment"]["image"] == str(places["oci"])
        assert status["environment"]["layer_used_bytes"] > 0
        assert status["sandboxes"][0]["root"].startswith("image sha256:")
    # And the image's layers in the cache never changed
    cached = list((places["root"] / "cache" / "layers").glob("*/root/etc/kept.txt"))
    assert cached and all(p.read_text() == "kept\n" for p in cached)
    assert not list((places["root"] / "cache" / "layers").glob("*/root/etc/mine"))


@pytest.mark.spec("V13")
def test_V13_a_closed_sessions_image_layer_is_unmounted_and_removed(
    client: Client, daemon: Daemon, places: dict[str, Path], workspace: Path
) -> None:
    sandboxes = daemon.runtime / f"workers-{daemon.pid}" / "s"
    with client.session(workspace, root={"image": str(places["oci"])}) as session:
        output(call(session, "bash", command="echo x > /etc/x"))
        during = mounts_under(sandboxes)
        assert any(p.endswith("/root/merged") for p in during), during
    # (the session's end is carried out after its close is answered)
    wait_until(
        lambda: not [m for m in mounts_under(sandboxes) if m in during],
        "the layer's mounts are gone",
    )


@pytest.mark.spec("V13")
def test_V13_an_image_outside_image_dirs_is_refused_at_open(
    client: Client, places: dict[str, Path], workspace: Path, tmp_path: Path
) -> None:
    # An image outside image_dirs, one reached through a symlink inside them that
    # points out, and a relative path: each refused when the session opens.
    link = places["images"] / f"link{os.getpid()}"
    link.symlink_to(places["outside"])
    try:
        for image, why in [
            (places["outside"], "lies outside image_dirs"),
            (link, "lies outside image_dirs"),
        ]:
            with (
                pytest.raises(RequestFailed, match=why),
                client.session(workspace, root={"image": str(image)}),
            ):
                pass
    finally:
        link.unlink()
    with (
        pytest.raises(RequestFailed, match="absolute path"),
        client.session(workspace, root={"image": "images/oci"}),
    ):
        pass


@pytest.mark.spec("V13")
def test_V13_a_malicious_image_is_refused_and_writes_nothing_outside(
    client: Client, places: dict[str, Path], workspace: Path
) -> None:
    # Given an image whose layer holds a "../" member
    cache = places["root"] / "cache"
    with client.session(workspace, root={"image": str(places["evil"])}) as session:
        # When a command of it would start
        result = call(session, "bash", command="echo ran")
    # Then the call fails (no command ran), saying why, and nothing landed outside
    assert result.is_error and result.error_code == ErrorCode.SANDBOX_FAILED, result.text
    assert "ran" not in result.text and "image" in result.text
    assert not list(cache.rglob("escaped.txt"))
    assert not (cache.parent / "escaped.txt").exists()


@pytest.mark.spec("V13")
def test_V13_an_absolute_symlink_made_in_an_image_root_never_leads_a_file_tool_to_the_host(
    client: Client, places: dict[str, Path], workspace: Path
) -> None:
    # Given a command of an image session that links the workspace to the image's
    # /etc/kept.txt (an absolute link: on the host that path is another file or none)
    with client.session(workspace, root={"image": str(places["oci"])}) as session:
        output(call(session, "bash", command="busybox ln -s /etc/kept.txt link; cat link"))
        # When a file tool reads the link
        read = call(session, "read", path="link")
    # Then it is refused: the link points outside the roots, in any view
    assert read.is_error and "outside" in read.text, read.text


@pytest.mark.spec("V13")
def test_V13_no_command_reaches_the_image_cache_or_another_sessions_layer(
    client: Client, daemon: Daemon, places: dict[str, Path], workspace: Path
) -> None:
    cache = places["root"] / "cache"
    layers = daemon.runtime / f"workers-{daemon.pid}" / "s"
    image = {"image": str(places["oci"])}
    with client.session(workspace, root=image) as first, client.session(workspace) as plain:
        output(call(first, "bash", command="echo s3cr3t-content > /etc/secret"))
        assert list(cache.glob("layers/*/root/etc/kept.txt"))  # the cache is there
        for session in (first, plain):
            # When a command looks for the cache and the sessions' layers by name
            look = (
                f"cat {layers}/*/root/upper/etc/secret 2>/dev/null; "
                f"ls -A {cache} 2>/dev/null | busybox wc -l"
            )
            # Then it finds nothing there: both are masked (empty, or absent)
            assert output(call(session, "bash", command=look)).strip() == "0"
            # And writing to the cache by name changes nothing in it
            call(session, "bash", command=f"echo x > {cache}/planted")
            assert not (cache / "planted").exists()
