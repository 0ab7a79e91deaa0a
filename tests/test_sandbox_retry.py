"""SPEC X12: a sandbox that fails before its command starts is started again (up to
three attempts), and counted; one that fails every time is ``sandbox_failed``, and its
command never ran.

The daemon runs with a ``bwrap`` of its own first on PATH: for a command that carries
a test's word it fails as bubblewrap did under load (it exits before the sandbox is
up, saying "loopback: Failed RTM_NEWADDR: No child processes") — the first time
only, or every time — and otherwise it is the real bubblewrap. Every start it sees
for such a command is one line in a log: how many attempts were made. The command
itself appends to a file of the workspace: how many times it ran.

A ``pasta`` of its own, likewise, fails as pasta did about once in a hundred starts on
a loaded machine ("Couldn't switch to pasta namespaces") while a test's flag file
exists — once, or every time — and otherwise is the real pasta.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpool import Client
from toolpool.models import ErrorCode
from toolpool.sandbox.command import START_ATTEMPTS
from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import Daemon, shared_daemon
from .shell_support import call, marker, wait_state

REAL_BWRAP = shutil.which("bwrap")
REAL_PASTA = shutil.which("pasta")
pytestmark = pytest.mark.skipif(
    REAL_BWRAP is None or not SandboxProfile.probe().active("bwrap"),
    reason="bubblewrap is off here: no sandbox to fail before its command",
)
FAILURE = "bwrap: loopback: Failed RTM_NEWADDR: No child processes"

FAKE_BWRAP = """#!/bin/sh
# bubblewrap, failing before the sandbox is up for the commands of a test that asks.
for arg in "$@"; do
  case "$arg" in
    *FAIL-ONCE-*|*FAIL-ALWAYS-*)
      word=$(printf '%s' "$arg" | sed -n 's/.*\\(FAIL-[A-Z]*-[0-9.]*\\).*/\\1/p')
      echo start >> "{log}/$word.attempts"
      case "$word" in
        FAIL-ALWAYS-*) echo "{failure}" >&2; exit 1 ;;
      esac
      if [ ! -e "{log}/$word.failed" ]; then
        : > "{log}/$word.failed"
        echo "{failure}" >&2
        exit 1
      fi
      break  # one start, however many arguments carry the word
      ;;
  esac
done
exec {real} "$@"
"""

PASTA_FAILURE = "Couldn't switch to pasta namespaces"
FAKE_PASTA = """#!/bin/sh
# pasta, ending before it connected the namespace while a test asks for it.
if [ -e "{log}/pasta.fail-always" ] || rm "{log}/pasta.fail-once" 2>/dev/null; then
  echo start >> "{log}/pasta.failed"
  echo "{failure}" >&2
  exit 1
fi
exec {real} "$@"
"""


@pytest.fixture(scope="module")
def attempts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bwrap-attempts")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, attempts: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("sandbox-retry")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text(FAKE_BWRAP.format(log=attempts, failure=FAILURE, real=REAL_BWRAP))
    fake.chmod(0o755)
    if REAL_PASTA is not None:
        pasta = bin_dir / "pasta"
        pasta.write_text(FAKE_PASTA.format(log=attempts, failure=PASTA_FAILURE, real=REAL_PASTA))
        pasta.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    # A sandbox per command, as where the session mechanism is off (the fake sees the
    # command's words in bubblewrap's arguments); a session's own sandbox, below.
    with shared_daemon(tmp, "--sandbox-disabled", "session", env=env) as shared:
        yield shared


def retries(client: Client) -> int:
    return int(client.status()["sandbox_retries"])


def started(attempts: Path, word: str) -> int:
    log = attempts / f"{word}.attempts"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.spec("X12")
@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_X12_a_sandbox_that_failed_before_its_command_is_retried_once_and_counted(
    daemon: Daemon, attempts: Path, workspace: Path, background: bool
) -> None:
    # Given a command whose first sandbox fails before the command starts.
    word = f"FAIL-ONCE-{marker()}"
    command = f"echo ran >> ran.txt; echo {word}"
    with Client(runtime_dir=daemon.runtime, timeout=60) as client:
        before = retries(client)
        with client.session(workspace) as session:
            # When it is run.
            result = call(session, "bash", command=command, run_in_background=background)
            assert not result.is_error, result.text
            if background:
                shell_id = str(result.details["shell_id"])
                wait_state(client, session, shell_id, "exited")
                result = call(session, "bash_output", shell_id=shell_id)
            else:
                assert result.details["usage"]["sandbox_retries"] == 1
            # Then the sandbox was started twice, the command ran once, to its end,
            # and the daemon counted the retry.
            assert started(attempts, word) == 2
            assert (workspace / "ran.txt").read_text() == "ran\n"
            assert word in result.text and FAILURE not in result.text
            assert retries(client) == before + 1


@pytest.mark.spec("X12")
@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_X12_a_sandbox_that_fails_every_time_is_sandbox_failed_and_its_command_never_ran(
    daemon: Daemon, attempts: Path, workspace: Path, background: bool
) -> None:
    word = f"FAIL-ALWAYS-{marker()}"
    command = f"echo ran >> ran.txt; echo {word}"
    with Client(runtime_dir=daemon.runtime, timeout=60) as client:
        before = retries(client)
        with client.session(workspace) as session:
            result = call(session, "bash", command=command, run_in_background=background)
            # Three attempts, then the failure as it was before retries: named, with the fix.
            assert result.is_error and result.error_code is ErrorCode.SANDBOX_FAILED
            assert f"bubblewrap failed ({FAILURE})" in result.text
            assert "toolpool doctor" in result.text
            assert started(attempts, word) == START_ATTEMPTS == 3
            assert not (workspace / "ran.txt").exists()
            assert retries(client) == before + 2


@pytest.mark.spec("X12")
@pytest.mark.skipif(REAL_PASTA is None, reason="needs pasta (Debian package passt)")
@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_X12_pasta_that_ended_before_connecting_the_namespace_is_retried_once(
    daemon: Daemon, attempts: Path, workspace: Path, background: bool
) -> None:
    # Given a network-allowed command whose first pasta ends before it connected.
    failed = attempts / "pasta.failed"
    failed.unlink(missing_ok=True)
    (attempts / "pasta.fail-once").touch()
    with Client(runtime_dir=daemon.runtime, timeout=60) as client:
        before = retries(client)
        with client.session(workspace, allow_network=True) as session:
            # When it is run.
            result = call(
                session, "bash", command="echo ran >> ran.txt", run_in_background=background
            )
            assert not result.is_error, result.text
            # (A real pasta fails now and then on its own, the reason for X12: on a busy
            # machine a start may be retried once more than the failure made here.)
            if background:
                wait_state(client, session, str(result.details["shell_id"]), "exited")
            else:
                assert result.details["usage"]["sandbox_retries"] >= 1
            # Then pasta failed once, the command ran once, and the retry was counted.
            assert len(failed.read_text().splitlines()) == 1
            assert (workspace / "ran.txt").read_text() == "ran\n"
            assert retries(client) >= before + 1


@pytest.mark.spec("X12")
@pytest.mark.skipif(REAL_PASTA is None, reason="needs pasta (Debian package passt)")
def test_X12_pasta_that_always_ends_early_is_sandbox_failed_and_the_command_never_ran(
    daemon: Daemon, attempts: Path, workspace: Path
) -> None:
    failed = attempts / "pasta.failed"
    failed.unlink(missing_ok=True)
    always = attempts / "pasta.fail-always"
    always.touch()
    try:
        with (
            Client(runtime_dir=daemon.runtime, timeout=60) as client,
            client.session(workspace, allow_network=True) as session,
        ):
            before = retries(client)
            result = call(session, "bash", command="echo ran >> ran.txt")
            assert result.is_error and result.error_code is ErrorCode.SANDBOX_FAILED
            assert PASTA_FAILURE in result.text and "toolpool doctor" in result.text
            assert len(failed.read_text().splitlines()) == 3  # three attempts, no more
            assert not (workspace / "ran.txt").exists()
            assert retries(client) == before + 2
    finally:
        always.unlink()


@pytest.fixture(scope="module")
def session_daemon(tmp_path_factory: pytest.TempPathFactory, attempts: Path) -> Iterator[Daemon]:
    """The same fakes, with commands started in their session's sandbox (V1)."""
    tmp = tmp_path_factory.mktemp("session-retry")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text(FAKE_BWRAP.format(log=attempts, failure=FAILURE, real=REAL_BWRAP))
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    with shared_daemon(tmp, env=env) as shared:
        yield shared


@pytest.mark.spec("X12", "V1")
@pytest.mark.skipif(not SandboxProfile.probe().active("session"), reason="no session sandboxes")
def test_X12_V1_a_session_sandbox_that_failed_before_it_was_ready_is_started_again(
    session_daemon: Daemon, attempts: Path, tmp_path: Path
) -> None:
    # Given a session whose sandbox fails once before it is up (its workspace's name
    # is in bubblewrap's arguments, as a command's words are not any more).
    word = f"FAIL-ONCE-{marker()}"
    workspace = tmp_path / word
    workspace.mkdir()
    with Client(runtime_dir=session_daemon.runtime, timeout=60) as client:
        before = retries(client)
        with client.session(workspace) as session:
            # When two commands run.
            first = call(session, "bash", command="echo ran >> ran.txt; echo $$")
            second = call(session, "bash", command="echo ran >> ran.txt")
            # Then the sandbox was started twice, once for good: both ran in it, once.
            assert not first.is_error and not second.is_error, (first.text, second.text)
            assert started(attempts, word) == 2
            assert (workspace / "ran.txt").read_text() == "ran\nran\n"
            assert retries(client) == before + 1
