"""SPEC F2-F3 at the register level: stamps, freshness, read-before-write codes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolpool import FileReadRegister, FileReadStamp
from toolpool.file_reads import Freshness
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE, register_verdict


def read_into(register: FileReadRegister, path: Path, *, partial: bool = False) -> None:
    register.record(path, FileReadStamp.of(path, path.read_bytes(), partial=partial))


@pytest.fixture
def target(workspace: Path) -> Path:
    path = workspace / "code.py"
    path.write_text("x = 1\n")
    return path


@pytest.mark.spec("F2")
def test_F2_stamp_records_time_mtime_hash_and_partial(target: Path) -> None:
    register = FileReadRegister()
    read_into(register, target, partial=True)
    stamp = register.get(target)
    assert stamp is not None
    assert stamp.mtime_ns == target.stat().st_mtime_ns
    assert stamp.size == 6
    assert stamp.partial
    assert len(stamp.content_hash) == 32
    assert FileReadStamp.from_dict(stamp.to_dict()) == stamp
    assert repr(register) == "<FileReadRegister 1 files (1 partial)>"


@pytest.mark.spec("F2")
def test_F2_keys_are_resolved_paths(target: Path) -> None:
    register = FileReadRegister()
    read_into(register, target)
    alias = target.parent / "." / target.name
    assert register.get(alias) == register.get(target)
    link = target.parent / "link.py"
    link.symlink_to(target)
    assert register.get(link) == register.get(target)


@pytest.mark.spec("F3")
@pytest.mark.parametrize(
    ("setup", "state", "code"),
    [
        ("never read", Freshness.NEVER_READ, CODE_NOT_READ),
        ("partly read", Freshness.PARTIAL, CODE_NOT_READ),
        ("changed since", Freshness.CHANGED, CODE_STALE),
        ("deleted since", Freshness.CHANGED, None),  # absent: creating needs no read
        ("touched, same content", Freshness.FRESH, None),
        ("read and unchanged", Freshness.FRESH, None),
    ],
)
def test_F3_check_before_write(
    target: Path, setup: str, state: Freshness, code: int | None
) -> None:
    register = FileReadRegister()
    if setup != "never read":
        read_into(register, target, partial=setup == "partly read")
    if setup == "changed since":
        st = target.stat()
        target.write_text("x = 2\n")  # same size, new content, a later mtime
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    if setup == "deleted since":
        target.unlink()
    if setup == "touched, same content":
        st = target.stat()
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert register.freshness(target) is state
    verdict = register_verdict(register, target)
    assert verdict.ok is (code is None)
    if code is not None:
        assert verdict.code == code
        assert ("Read it" in verdict.message) or ("Read the whole file" in verdict.message)


@pytest.mark.spec("F3")
def test_F3_a_new_file_needs_no_read(workspace: Path) -> None:
    assert register_verdict(FileReadRegister(), workspace / "new.py").ok
