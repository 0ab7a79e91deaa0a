"""The image cache: the three forms, verified, unpacked safely once, shared, bounded
(toolpool/images/). Real files, real unpack processes, real overlay mounts."""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from tests.image_builders import (
    OCI_INDEX,
    OCI_MANIFEST,
    Member,
    busybox_layers,
    config_for,
    in_overlay,
    layer_tar,
    sha,
    tar_of,
    write_docker,
    write_oci,
    write_rootfs,
)
from toolpool.images import ImageCache, ImageError, PreparedImage, UnpackLimits
from toolpool.images.formats import host_arch

# What the overlay of the busybox image shows, and that busybox runs from it.
LOOK = (
    "test ! -e etc/gone.txt && cat etc/kept.txt etc/hard.txt etc/added.txt && ls opq && "
    "chroot . /bin/sh -c 'cd /work && pwd && echo ran'"
)
SEEN = "kept\nkept\nadded\nnew.txt\n/work\nran\n"


def gzip_of(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


@pytest.fixture(scope="module")
def layers() -> list[bytes]:
    return busybox_layers()


@pytest.fixture
def images(tmp_path: Path) -> Path:
    place = tmp_path / "images"
    place.mkdir()
    return place


@pytest.fixture
def cache(tmp_path: Path) -> ImageCache:
    return ImageCache(tmp_path / "cache", 1 << 30)


def prepare(
    cache: ImageCache, image: Path, images: Path, denied: Sequence[Path] = ()
) -> PreparedImage:
    return cache.prepare(image, allowed_dirs=[images], denied=denied)


def assert_only_complete(cache: ImageCache) -> list[str]:
    """Nothing in the cache but complete layers (no temporary dir, no trash); their keys."""
    assert sorted(os.listdir(cache.root / "tmp")) == []
    assert sorted(os.listdir(cache.root / "trash")) == []
    keys = sorted(os.listdir(cache.root / "layers"))
    for key in keys:
        entry = cache.root / "layers" / key
        assert (entry / "root").is_dir() and json.loads((entry / "entry.json").read_text())
    return keys


def look(prepared: PreparedImage, tmp_path: Path) -> str:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir(exist_ok=True)
    done = in_overlay(prepared.layers, LOOK, xattr=prepared.xattr, mountpoint=mountpoint)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.spec("V20", "V25")
@pytest.mark.parametrize("form", ["oci-dir", "oci-tar", "oci-dir-uncompressed", "docker"])
def test_each_form_mounts_as_the_image_tree_and_busybox_runs_from_it(
    form: str, layers: list[bytes], images: Path, cache: ImageCache, tmp_path: Path
) -> None:
    if form == "docker":
        image = write_docker(images / "busybox.tar", layers)
    else:
        layout = write_oci(images / "busybox", layers, compress=form != "oci-dir-uncompressed")
        image = tar_of(layout, images / "busybox-oci.tar") if form == "oci-tar" else layout
    with prepare(cache, image, images) as prepared:
        assert len(prepared.layers) == 2
        assert prepared.layers == tuple(
            cache.root / "layers" / sha(layer).removeprefix("sha256:") / "root" for layer in layers
        )
        assert prepared.env == {"PATH": "/bin", "GREETING": "hello"}
        assert prepared.working_dir == "/work"
        assert prepared.xattr == ("trusted" if os.geteuid() == 0 else "user")
        assert look(prepared, tmp_path) == SEEN
    assert len(assert_only_complete(cache)) == 2


@pytest.mark.spec("V20")
def test_a_rootfs_directory_is_one_layer_as_it_is(
    images: Path, cache: ImageCache, tmp_path: Path
) -> None:
    root = write_rootfs(images / "rootfs")
    with prepare(cache, root, images) as prepared:
        assert prepared.layers == (root,)
        assert prepared.form == "rootfs" and prepared.bytes == 0
        assert prepared.env == {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
        }
        assert prepared.working_dir == "/"
        mountpoint = tmp_path / "mnt"
        mountpoint.mkdir()
        done = in_overlay(prepared.layers, "chroot . /bin/cat /etc/kept.txt", mountpoint=mountpoint)
        assert (done.returncode, done.stdout) == (0, "kept\n"), done.stderr
    assert assert_only_complete(cache) == []  # not copied


@pytest.mark.spec("V25")
def test_user_xattr_layers_mount_with_userxattr(
    layers: list[bytes], images: Path, tmp_path: Path
) -> None:
    """The layers an unprivileged daemon makes (``user.overlay.opaque``) show the same
    tree under a ``userxattr`` mount."""
    cache = ImageCache(tmp_path / "user-cache", 1 << 30, xattr="user")
    with prepare(cache, write_oci(images / "busybox", layers), images) as prepared:
        assert prepared.xattr == "user"
        opaque = prepared.layers[1] / "opq"
        assert os.getxattr(opaque, "user.overlay.opaque") == b"y"
        with pytest.raises(OSError, match="No data available"):
            os.getxattr(opaque, "trusted.overlay.opaque")
        assert look(prepared, tmp_path) == SEEN
    with pytest.raises(ImageError, match=r"made for user\.overlay") as refused:
        ImageCache(tmp_path / "user-cache", 1 << 30, xattr="trusted")
    assert refused.value.code == "image_refused"


@pytest.mark.spec("V26")
def test_prepares_share_one_copy_across_prepares_and_forms(
    layers: list[bytes], images: Path, cache: ImageCache
) -> None:
    oci = write_oci(images / "busybox", layers)
    docker = write_docker(images / "busybox.tar", layers)
    first = prepare(cache, oci, images)
    busybox = first.layers[0] / "bin" / "busybox"
    made = os.stat(busybox)
    second = prepare(cache, oci, images)
    third = prepare(cache, docker, images)
    assert first.layers == second.layers == third.layers
    again = os.stat(busybox)
    assert (again.st_ino, again.st_mtime_ns, again.st_ctime_ns) == (
        made.st_ino,
        made.st_mtime_ns,
        made.st_ctime_ns,
    )  # not unpacked again
    assert first.digest != third.digest  # the manifest's digest, docker's config digest
    assert first.bytes == third.bytes == cache.usage() > len(layers[0])
    for prepared in (first, second, third):
        prepared.release()
    assert len(assert_only_complete(cache)) == 2


# --- a hostile image ------------------------------------------------------------------


def hostile(images: Path, members: Sequence[Member], name: str = "evil") -> Path:
    """An OCI layout whose one layer is ``members``."""
    return write_oci(images / name, [layer_tar(members)], compress=False)


def refused(
    cache: ImageCache,
    image: Path,
    images: Path,
    code: str,
    match: str,
    denied: Sequence[Path] = (),
    kept: Sequence[str] = (),
) -> ImageError:
    """The image is refused with ``code`` and a message matching ``match``, and the cache
    holds complete layers only (``kept``, those of good layers before the bad one)."""
    with pytest.raises(ImageError, match=match) as caught:
        prepare(cache, image, images, denied)
    assert re.fullmatch(code, caught.value.code)
    assert assert_only_complete(cache) == sorted(kept)
    return caught.value


@pytest.mark.spec("V23")
@pytest.mark.parametrize(
    ("members", "match"),
    [
        ([Member("../escaped", data=b"x")], "'../escaped' climbs out of the layer"),
        ([Member("a/../../escaped", data=b"x")], "climbs out of the layer"),
        ([Member("/etc/escaped", data=b"x")], "'/etc/escaped' has an absolute path"),
        (
            [Member("lnk", tarfile.LNKTYPE, linkname="/etc/passwd")],
            "hard link target '/etc/passwd' has an absolute path",
        ),
        (
            [Member("lnk", tarfile.LNKTYPE, linkname="etc/passwd")],
            "points at 'etc/passwd', which is no file of this layer",
        ),
        (
            [Member("lnk", tarfile.LNKTYPE, linkname="../../../../../../etc/passwd")],
            "climbs out of the layer",
        ),
        (
            [
                Member("d", tarfile.DIRTYPE, mode=0o755),
                Member("lnk", tarfile.LNKTYPE, linkname="d"),
            ],
            "points at 'd', which is no file of this layer",
        ),
        ([Member("etc/.wh...")], r"whiteout 'etc/\.wh\.\.\.' names '\.\.'"),
        ([Member(".wh.")], "names '', which is no entry"),
        ([Member("a/.wh.x/b", data=b"x")], "lies below a whiteout"),
    ],
    ids=[
        "dotdot",
        "dotdot-inside",
        "absolute",
        "hardlink-absolute",
        "hardlink-not-in-layer",
        "hardlink-dotdot",
        "hardlink-to-dir",
        "whiteout-dotdot",
        "whiteout-empty",
        "whiteout-dir",
    ],
)
def test_a_member_that_escapes_its_layer_refuses_the_image(
    members: list[Member], match: str, images: Path, cache: ImageCache
) -> None:
    refused(cache, hostile(images, members), images, "image_invalid", match)


@pytest.mark.spec("V23")
def test_a_symlink_is_never_written_through(images: Path, cache: ImageCache, outside: Path) -> None:
    """The classic: a symlink to outside, then a member below it (and a hard link below
    it): refused, nothing appears outside."""
    for number, second in enumerate(
        [
            Member("lnk/pwned", data=b"pwned"),
            Member("lnk/sub/pwned", data=b"pwned"),
            Member("lnk/pwned", tarfile.SYMTYPE, linkname="/etc/passwd"),
        ]
    ):
        members = [Member("lnk", tarfile.SYMTYPE, linkname=str(outside)), second]
        image = hostile(images, members, name=f"evil{number}")
        refused(cache, image, images, "image_invalid", "'lnk', a symlink or file of this layer")
    assert sorted(os.listdir(outside)) == ["secret.txt"]


@pytest.mark.spec("V23")
def test_a_hard_link_then_write_does_not_change_the_linked_file(
    images: Path, cache: ImageCache
) -> None:
    members = [
        Member("kept", data=b"original"),
        Member("alias", tarfile.LNKTYPE, linkname="kept"),
        Member("alias", data=b"overwritten"),  # a later member replaces the link
    ]
    with prepare(cache, hostile(images, members), images) as prepared:
        root = prepared.layers[0]
        assert (root / "kept").read_bytes() == b"original"
        assert (root / "alias").read_bytes() == b"overwritten"


@pytest.mark.spec("V23")
def test_devices_fifos_set_id_bits_and_archive_xattrs_do_not_arrive(
    images: Path, cache: ImageCache
) -> None:
    members = [
        Member("dev", tarfile.DIRTYPE, mode=0o755),
        Member("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
        Member("dev/sda", tarfile.BLKTYPE, mode=0o660, devmajor=8, devminor=0),
        Member("dev/pipe", tarfile.FIFOTYPE, mode=0o644),
        Member("dev/wh", tarfile.CHRTYPE, mode=0o644),  # a 0/0 device: no whiteout either
        Member("suid", data=b"#!/bin/sh\n", mode=0o4755),
        Member("sgid", data=b"#!/bin/sh\n", mode=0o2755),
        Member("tmp", tarfile.DIRTYPE, mode=0o1777),
        Member(
            "opaque-claim",
            tarfile.DIRTYPE,
            mode=0o755,
            pax={
                "SCHILY.xattr.trusted.overlay.opaque": "y",
                "SCHILY.xattr.user.overlay.opaque": "y",
            },
        ),
        Member("cap", data=b"x", pax={"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}),
    ]
    with prepare(cache, hostile(images, members), images) as prepared:
        root = prepared.layers[0]
        assert sorted(os.listdir(root / "dev")) == []  # skipped, each
        assert stat.S_IMODE(os.stat(root / "suid").st_mode) == 0o755
        assert stat.S_IMODE(os.stat(root / "sgid").st_mode) == 0o755
        assert stat.S_IMODE(os.stat(root / "tmp").st_mode) == 0o777
        assert os.listxattr(root / "opaque-claim") == []
        assert os.listxattr(root / "cap") == []
        entry = json.loads((root.parent / "entry.json").read_text())
        assert entry["skipped"] == 4


@pytest.mark.spec("V22")
def test_a_layer_that_does_not_match_its_digest_is_refused(
    layers: list[bytes], images: Path, cache: ImageCache
) -> None:
    image = write_oci(images / "busybox", layers, compress=False)
    blob = image / "blobs" / "sha256" / sha(layers[1]).removeprefix("sha256:")
    data = bytearray(blob.read_bytes())
    data[600] ^= 0xFF  # in the first member's data: still a tar, not the same one
    blob.write_bytes(bytes(data))
    good = sha(layers[0]).removeprefix("sha256:")  # the first layer is good, and stays
    error = refused(
        cache, image, images, "image_invalid", "the layer's digest does not match", kept=[good]
    )
    assert sha(layers[1]) in error.message


@pytest.mark.spec("V22")
def test_a_layer_that_does_not_match_its_diff_id_is_refused(
    layers: list[bytes], images: Path, cache: ImageCache
) -> None:
    config = config_for(layers)
    config["rootfs"] = {"type": "layers", "diff_ids": [sha(b"other"), sha(layers[1])]}
    image = write_oci(images / "busybox", layers, config=config)
    refused(cache, image, images, "image_invalid", "the layer's diff id does not match")


@pytest.mark.spec("V22")
def test_a_broken_image_is_refused_with_what_is_wrong(
    layers: list[bytes], images: Path, cache: ImageCache
) -> None:
    image = write_oci(images / "a", layers)
    manifest_digest = json.loads((image / "index.json").read_text())["manifests"][0]["digest"]
    manifest_path = image / "blobs" / "sha256" / manifest_digest.removeprefix("sha256:")
    manifest = json.loads(manifest_path.read_text())
    (image / "blobs" / "sha256" / manifest["config"]["digest"].removeprefix("sha256:")).write_text(
        "{}"
    )
    refused(cache, image, images, "image_invalid", "digest mismatch")

    image = write_oci(images / "b", layers)
    (image / "blobs" / "sha256" / sha(gzip_of(layers[0])).removeprefix("sha256:")).unlink()
    refused(cache, image, images, "image_invalid", "a missing blob")

    image = write_oci(
        images / "c", layers, layer_type="application/vnd.oci.image.layer.v1.tar+zstd"
    )
    refused(cache, image, images, "image_invalid", "unknown media type .*zstd")

    image = write_oci(images / "d", layers)
    blobs = image / "blobs" / "sha256"
    manifest_digest = json.loads((image / "index.json").read_text())["manifests"][0]["digest"]
    others = {"os": "linux", "architecture": "riscv64"}
    nested = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": manifest_digest, "size": 1, "platform": others},
            {
                "mediaType": OCI_MANIFEST,
                "digest": manifest_digest,
                "size": 1,
                "platform": {"os": "windows", "architecture": host_arch()},
            },
        ],
    }
    nested_bytes = json.dumps(nested).encode()
    (blobs / sha(nested_bytes).removeprefix("sha256:")).write_bytes(nested_bytes)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": OCI_INDEX, "digest": sha(nested_bytes), "size": len(nested_bytes)}
        ],
    }
    (image / "index.json").write_text(json.dumps(index))
    refused(
        cache,
        image,
        images,
        "image_invalid",
        f"no image for linux/{host_arch()} .*linux/riscv64, windows/",
    )

    # the same index with the host's entry added: that one is taken
    nested["manifests"].append(
        {
            "mediaType": OCI_MANIFEST,
            "digest": manifest_digest,
            "size": 1,
            "platform": {"os": "linux", "architecture": host_arch()},
        }
    )
    nested_bytes = json.dumps(nested).encode()
    (blobs / sha(nested_bytes).removeprefix("sha256:")).write_bytes(nested_bytes)
    index["manifests"][0].update(digest=sha(nested_bytes), size=len(nested_bytes))
    (image / "index.json").write_text(json.dumps(index))
    with prepare(cache, image, images) as prepared:
        assert prepared.digest == manifest_digest and len(prepared.layers) == 2


@pytest.mark.spec("V23")
def test_a_symlink_inside_an_oci_layout_is_not_followed(
    layers: list[bytes], images: Path, cache: ImageCache, outside: Path
) -> None:
    image = write_oci(images / "busybox", layers)
    shutil.move(image / "blobs", outside / "blobs")
    os.symlink(outside / "blobs", image / "blobs")
    refused(cache, image, images, "image_invalid", "without following a symlink")


@pytest.mark.spec("V24")
def test_layer_bombs_stop_at_their_bounds(images: Path, tmp_path: Path) -> None:
    """A gzip of zeros, a file of zeros, too many entries: limit_exceeded, nothing kept."""
    limits = UnpackLimits(max_bytes=1 << 20, max_entries=1000)
    cache = ImageCache(tmp_path / "small", 1 << 30, limits=limits)
    zeros = images / "zeros"
    write_oci(zeros, [bytes(64 << 20)])  # every block a tar end: the stream counts
    refused(
        cache, zeros, images, "limit_exceeded", r"layer's tar is larger than max_bytes \(1048576\)"
    )
    big = write_oci(images / "big", [layer_tar([Member("big", data=bytes(8 << 20))])])
    refused(cache, big, images, "limit_exceeded", "larger than max_bytes")
    many = [Member(f"f{n}") for n in range(1001)]
    refused(
        cache,
        hostile(images, many, "many"),
        images,
        "limit_exceeded",
        r"more than max_entries \(1000\)",
    )
    at_bounds = hostile(images, many[:999], "fine")  # 999 members and the root: within
    with prepare(cache, at_bounds, images) as prepared:
        assert len(os.listdir(prepared.layers[0])) == 999


@pytest.mark.spec("V24")
def test_the_unpack_process_runs_under_rlimits(images: Path, tmp_path: Path) -> None:
    """Memory and open files are rlimits of the unpack process: too little of either is
    limit_exceeded, named."""
    tiny = ImageCache(tmp_path / "tiny", 1 << 30, limits=UnpackLimits(address_space=32 << 20))
    image = hostile(images, [Member("a", data=b"a")])
    refused(tiny, image, images, "limit_exceeded", "(memory|out of memory|address space)")
    few = ImageCache(tmp_path / "few", 1 << 30, limits=UnpackLimits(open_files=5))
    deep = hostile(images, [Member("a/b/c/d", data=b"x")], "deep")
    refused(few, deep, images, "limit_exceeded", "unpacking needed more than 5 open files")


@pytest.mark.spec("V21")
def test_image_paths_outside_image_dirs_or_near_denied_paths_are_refused(
    layers: list[bytes], images: Path, cache: ImageCache, tmp_path: Path, outside: Path
) -> None:
    elsewhere = write_oci(outside / "busybox", layers)
    refused(cache, elsewhere, images, "image_refused", "lies outside image_dirs")
    link = images / "link"
    os.symlink(elsewhere, link)
    refused(cache, link, images, "image_refused", r"link \(really .*outside/busybox\) lies outside")
    os.symlink(outside, images / "dirlink")
    refused(cache, images / "dirlink" / "busybox", images, "image_refused", "lies outside")
    inside = write_oci(images / "busybox", layers)
    refused(
        cache,
        inside,
        images,
        "image_refused",
        "is or lies inside .*, which is denied",
        denied=[images],
    )
    refused(cache, inside, images, "image_refused", "is or lies inside", denied=[inside])
    (inside / "secrets").mkdir()
    refused(
        cache,
        inside,
        images,
        "image_refused",
        "holds .*secrets, which is denied",
        denied=[inside / "secrets"],
    )
    refused(cache, Path("relative/image"), images, "image_refused", "is not absolute")
    with pytest.raises(ImageError, match="images are off") as off:
        cache.prepare(inside, allowed_dirs=[], denied=[])
    assert off.value.code == "image_refused"
    with prepare(cache, inside, images, denied=[outside]) as prepared:  # beside it: fine
        assert len(prepared.layers) == 2


# --- one copy, shared, bounded ----------------------------------------------------------

PREPARER = """
import json, sys, time
from pathlib import Path
from toolpool.images import ImageCache
gate, root, image, images = (Path(a) for a in sys.argv[1:5])
while not gate.exists():
    time.sleep(0.001)
prepared = ImageCache(root, 1 << 30).prepare(image, allowed_dirs=[images], denied=[])
print(json.dumps([str(p) for p in prepared.layers]), flush=True)
sys.stdin.read()  # holds its lease until told to go (or killed)
"""


def preparer(gate: Path, cache: ImageCache, image: Path, images: Path) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", PREPARER, str(gate), str(cache.root), str(image), str(images)]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def small_image(images: Path, name: str, size: int) -> Path:
    return hostile(images, [Member("data", data=name.encode() * size)], name)


@pytest.mark.spec("V26")
def test_concurrent_prepares_in_two_processes_end_with_one_good_copy(
    layers: list[bytes], images: Path, cache: ImageCache, tmp_path: Path
) -> None:
    image = write_oci(images / "busybox", layers)
    gate = tmp_path / "gate"
    both = [preparer(gate, cache, image, images) for _ in range(2)]
    gate.touch()
    try:
        seen = [json.loads(p.stdout.readline()) for p in both]  # type: ignore[union-attr]
    finally:
        for p in both:
            p.communicate("")
    assert [p.returncode for p in both] == [0, 0]
    assert seen[0] == seen[1]
    assert len(assert_only_complete(cache)) == 2
    with prepare(cache, image, images) as prepared:
        assert [str(p) for p in prepared.layers] == seen[0]
        assert look(prepared, tmp_path) == SEEN


@pytest.mark.spec("V27")
def test_eviction_removes_least_recently_used_layers_no_lease_holds(
    images: Path, tmp_path: Path
) -> None:
    roomy = ImageCache(tmp_path / "cache", 1 << 30)
    names = ("a", "b", "c")
    built = {n: small_image(images, n, 40_000 * (i + 1)) for i, n in enumerate(names)}
    prepared = {n: prepare(roomy, built[n], images) for n in names}
    size = {n: prepared[n].bytes for n in names}
    key = {n: prepared[n].layers[0].parent.name for n in names}
    prepared["a"].release()
    prepared["c"].release()
    prepare(roomy, built["a"], images).release()  # a used again: c is now the oldest unused
    assert roomy.usage() == sum(size.values())

    bounded = ImageCache(tmp_path / "cache", size["a"] + size["b"])
    assert bounded.evict() == [f"sha256:{key['c']}"]
    assert sorted(assert_only_complete(bounded)) == sorted([key["a"], key["b"]])
    nothing = ImageCache(tmp_path / "cache", 0)
    assert nothing.evict() == [f"sha256:{key['a']}"]  # b is leased
    assert assert_only_complete(nothing) == [key["b"]]
    assert prepared["b"].layers[0].joinpath("data").read_bytes() == b"b" * 80_000
    prepared["b"].release()
    assert nothing.evict() == [f"sha256:{key['b']}"]
    assert assert_only_complete(nothing) == [] and nothing.usage() == 0


@pytest.mark.spec("V27")
def test_a_lease_of_another_process_holds_until_that_process_dies(
    images: Path, cache: ImageCache, tmp_path: Path
) -> None:
    image = small_image(images, "x", 1000)
    gate = tmp_path / "gate"
    gate.touch()
    holder = preparer(gate, cache, image, images)
    try:
        assert len(json.loads(holder.stdout.readline())) == 1  # type: ignore[union-attr]
        nothing = ImageCache(cache.root, 0)
        assert nothing.evict() == []
        assert len(assert_only_complete(nothing)) == 1
    finally:
        holder.kill()  # a crashed daemon: its flocks go with it
        holder.communicate()
    assert len(nothing.evict()) == 1
    assert assert_only_complete(nothing) == []


@pytest.mark.spec("V27")
def test_remove_stale_removes_what_a_crashed_unpack_left_and_nothing_under_way(
    layers: list[bytes], images: Path, cache: ImageCache, tmp_path: Path
) -> None:
    image = write_oci(images / "busybox", layers)
    gate = tmp_path / "gate"
    gate.touch()
    crashing = preparer(gate, cache, image, images)
    process = psutil.Process(crashing.pid)
    unpacker = None
    while unpacker is None:  # the moment its first unpack process exists, stop it all
        found = [c for c in process.children() if "toolpool.images.unpack" in c.cmdline()]
        unpacker = found[0] if found else None
    unpacker.suspend()
    crashing.kill()
    crashing.communicate()
    unpacker.kill()
    unpacker.wait()
    left = sorted(os.listdir(cache.root / "tmp"))
    assert len(left) == 2 and left[1] == left[0] + ".lock"  # a crash's temporary dir
    # an unpack under way (its lock held) is not stale
    live = cache.root / "tmp" / "f00d.live"
    (live / "root").mkdir(parents=True)
    lock = os.open(f"{live}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        assert cache.remove_stale() == [left[0]]
        assert sorted(os.listdir(cache.root / "tmp")) == ["f00d.live", "f00d.live.lock"]
    finally:
        os.close(lock)
    assert cache.remove_stale() == ["f00d.live"]
    assert assert_only_complete(cache) == []
    with prepare(cache, image, images) as prepared:
        assert look(prepared, tmp_path) == SEEN
