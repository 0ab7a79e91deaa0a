from __future__ import annotations

import gc
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from toolpool.sandbox.profile import active_profile

from .tier_support import SLOW_MODULES, FastTier, is_slow

pytest_plugins = ["pytester"]  # tests/test_tiers.py runs the guard in a suite of its own

# The longest TMPDIR under which tests' own directories (pytest-of-USER/pytest-N/
# popen-gwN/test_…/rt/workers-PID/workers.sock) stay within a Unix socket's 107 bytes.
_SHORT_TMP = 8


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (scripts/test runs two workers) each worker has a temporary
    directory of its own, so that what one leaves there is its own to answer for
    (no_toolpool_file_left_in_tmp) — and it stays short, for Unix sockets' paths.

    Under a long TMPDIR the tests' directories go to a short one of this checkout's
    (``/tmp/tp-<hash>``, emptied at each run as pytest's ``--basetemp`` is): the
    daemons the tests start make their sockets there."""
    sys.addaudithook(FAST_TIER.audit)
    if config.getoption("fast"):
        chosen = config.option.markexpr
        config.option.markexpr = f"({chosen}) and not slow" if chosen else "not slow"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    long_tmp = len(tempfile.gettempdir()) > _SHORT_TMP
    if not worker and config.option.basetemp is None and long_tmp:
        checkout = hashlib.sha256(str(config.rootpath).encode()).hexdigest()[:8]
        config.option.basetemp = f"/tmp/tp-{checkout}"
    if worker:
        mine = Path(tempfile.gettempdir()) / worker
        mine.mkdir(exist_ok=True)
        os.environ["TMPDIR"] = str(mine)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


# --- the tiers (tests/tier_support.py) ------------------------------------------------

FAST_TIER = FastTier()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help='the fast tier alone: -m "not slow", without even importing the slow modules',
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("fast") and collection_path.stem in SLOW_MODULES:
        return True
    return None  # pytest decides


def pytest_sessionstart(session: pytest.Session) -> None:
    # This machine's sandbox, probed once per process with a few confined commands
    # (bwrap, pasta…): here, before any test, so that it is no test's doing. (The
    # controller of pytest-xdist runs no test: its workers probe.)
    if hasattr(session.config, "workerinput") or not session.config.getoption("numprocesses"):
        active_profile()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    with FAST_TIER.fixture(fixturedef.baseid, fixturedef.argname):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with FAST_TIER.watching(item):
        yield
    FAST_TIER.check_fixtures(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with FAST_TIER.watching(item):
        yield


# Processes a fixture shared by several tests owns (a module's daemon): their subtrees
# change under the tests (workers are replaced) and are checked when the fixture ends.
SHARED_ROOTS: set[int] = set()


def _descendants() -> set[int]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            lineage = {p.pid for p in child.parents()} | {child.pid}
        except psutil.Error:
            continue
        if not lineage & SHARED_ROOTS:
            found.add(child.pid)
    return found


def _described(pids: set[int]) -> list[str]:
    described = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                described.append(" ".join(process.cmdline()) or str(pid))
        except psutil.Error:
            continue
    return described


def assert_none_left(before: set[int], timeout: float = 20.0) -> None:
    # ``timeout`` is a hang guard: what a test ended is gone within a second or two
    deadline = time.monotonic() + timeout
    left = _descendants() - before
    while _described(left) and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _descendants() - before
    assert not _described(left), f"processes left behind: {_described(left)}"


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test proves it leaves no process behind."""
    before = _descendants()
    yield
    assert_none_left(before)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def _toolpool_temp_files() -> set[str]:
    temp = Path(os.environ.get("TMPDIR") or "/tmp")
    return {p.name for p in temp.glob("toolpool-*")}


@pytest.fixture(autouse=True, scope="session")
def no_toolpool_file_left_in_tmp() -> Iterator[None]:
    """The whole suite leaves no toolpool file in the temporary directory (X8)."""
    before = _toolpool_temp_files()
    yield
    gc.collect()  # an in-process Coordinator a test did not close removes its scratch then
    assert sorted(_toolpool_temp_files() - before) == []


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, with a secret in it: what must stay out."""
    place = tmp_path / "outside"
    place.mkdir()
    (place / "secret.txt").write_text("top secret\n")
    return place
