"""The suite's tiers hold (tests/tier_support.py): what the fast tier would start is
refused, a fast test that needs a fixture that started a process fails, and every
rule of the slow tier names something that is there."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from toolpool.pool import PoolConfig, WorkerPool

from .conftest import FAST_TIER
from .daemon_support import start_daemon
from .tier_support import HOW_TO_MARK, SLOW_FIXTURES, SLOW_MODULES, SLOW_TESTS, started_program

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _defined(module: str) -> tuple[set[str], set[str]]:
    """The test functions and the fixtures ``module`` defines."""
    tree = ast.parse((TESTS / f"{module}.py").read_text())
    functions, fixtures = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.add(node.name)
            if any("fixture" in ast.unparse(d) for d in node.decorator_list):
                fixtures.add(node.name)
    return functions, fixtures


def test_every_rule_of_the_slow_tier_names_what_is_there() -> None:
    # Given the modules of the suite
    modules = {path.stem for path in TESTS.glob("test_*.py")}
    # Then every slow module is one of them, every slow test a function of its
    # module, and every slow fixture a fixture some module defines
    assert sorted(SLOW_MODULES - modules) == []
    missing = []
    for entry in SLOW_TESTS:
        module, name = entry.split("::")
        if module not in modules or name not in _defined(module)[0]:
            missing.append(entry)
    assert missing == []
    fixtures = set().union(*(_defined(m)[1] for m in modules))
    assert sorted(SLOW_FIXTURES - fixtures) == []


def test_the_slow_tier_is_marked(request: pytest.FixtureRequest) -> None:
    # Given this test, of the fast tier, and the marker it would have were it slow
    assert request.node.get_closest_marker("slow") is None
    # Then the slow ones of this run carry the marker, by module, fixture or name
    for item in request.session.items:
        module = Path(str(item.path)).stem
        by_rule = (
            module in SLOW_MODULES
            or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or f"{module}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS
        )
        assert bool(by_rule) == (item.get_closest_marker("slow") is not None), item.nodeid


@pytest.mark.parametrize(
    ("event", "args", "line"),
    [
        ("subprocess.Popen", ("/usr/bin/python3", ["python3", "-m", "x"], None, None),
         ["/usr/bin/python3", "-m", "x"]),
        ("subprocess.Popen", (None, ["rg", "-n", "a"], None, None), ["rg", "-n", "a"]),
        ("subprocess.Popen", (None, "ls -l", None, None), ["ls -l"]),
        ("os.posix_spawn", (b"/bin/sh", [b"sh", b"-c", b"true"], {}), ["/bin/sh", "-c", "true"]),
        ("os.system", ("sleep 1",), ["/bin/sh", "-c", "sleep 1"]),
        ("os.fork", (), ["fork"]),
        ("open", ("/etc/passwd", "r", 0), None),
    ],
)  # fmt: skip
def test_the_program_of_each_kind_of_start_is_read(
    event: str, args: tuple[object, ...], line: list[str] | None
) -> None:
    assert started_program(event, args) == line


def test_a_fast_test_cannot_start_a_daemon(tmp_path: Path) -> None:
    # When a test of the fast tier starts a daemon
    with FAST_TIER.refused() as refused:
        start_daemon(tmp_path)
    # Then it is refused before the process exists, saying where to mark the test
    (what,) = refused
    assert "test_a_fast_test_cannot_start_a_daemon started" in what
    assert "-m toolpool daemon run" in what


async def test_a_fast_test_cannot_start_a_pool(tmp_path: Path) -> None:
    # Given a pool of one worker
    pool = WorkerPool(PoolConfig(min_workers=1, max_workers=1, runtime_dir=tmp_path / "rt"))
    # When a test of the fast tier starts it
    with FAST_TIER.refused() as refused:
        try:
            await pool.start()
        finally:
            await pool.close()
    # Then its first process (the sandbox's probe) is refused, and it goes no further
    (what,) = refused
    assert "test_a_fast_test_cannot_start_a_pool started" in what


def test_a_refusal_the_code_swallowed_still_counts() -> None:
    # When a thread of a fast test starts a process and swallows the refusal
    swallowed: list[BaseException] = []

    def start() -> None:
        try:
            subprocess.run([sys.executable, "-c", "pass"], check=False)
        except Exception as exc:
            swallowed.append(exc)

    with FAST_TIER.refused() as refused:
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
    # Then the guard kept it (outside ``refused()`` it fails the test)
    assert len(swallowed) == 1 and len(refused) == 1
    assert HOW_TO_MARK in str(swallowed[0])


def test_the_file_tools_commands_run_in_the_fast_tier() -> None:
    # ripgrep (grep, glob) and git (the changes' tests compare with it) are allowed
    with FAST_TIER.refused() as refused:
        for command in (["rg", "--version"], ["git", "--version"]):
            subprocess.run(command, check=True, capture_output=True)
    assert refused == []


def test_a_slow_test_may_start_processes() -> None:
    # A test named in SLOW_TESTS is slow: the guard lets it start what it needs
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True)
    assert done.stdout == "ran\n"


SUITE = """
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def server():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


@pytest.mark.slow
def test_first_a_slow_one_uses_it(server):
    assert server.poll() is None


def test_then_a_fast_one_uses_it(server):
    assert server.poll() is None


def test_a_fast_one_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_fast_one_swallows_the_refusal():
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    except Exception:
        pass


def test_a_fast_one_runs_git():
    subprocess.run(["git", "--version"], check=True, capture_output=True)
"""


def test_a_fast_test_that_needs_a_process_fixture_fails_and_says_where_to_mark_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a suite run with this suite's conftest: a module fixture that starts a
    # process, used first by a slow test, then by a fast one
    pytester.makeini("[pytest]\nmarkers =\n    slow: starts processes\n")
    pytester.makepyfile(test_guarded=SUITE)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # When it runs
    run = pytester.runpytest_subprocess("-p", "tests.conftest", "-p", "no:cacheprovider")
    # Then the slow test and the one that runs git pass; the fast one that uses the
    # fixture fails (it would start the process in a run of the fast tier alone), and
    # so do the ones that start a process, the one that swallowed the refusal too
    run.assert_outcomes(passed=2, failed=2, errors=1)
    output = run.stdout.str()
    assert "test_then_a_fast_one_uses_it uses server, which started a process" in output
    assert "test_a_fast_one_starts_a_process started" in output
    assert "test_a_fast_one_swallows_the_refusal started" in output
    assert HOW_TO_MARK in output
