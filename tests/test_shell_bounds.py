"""SPEC L9 without a daemon: the caps on how many shells run, and which limit ended a
shell, as the supervisor decides them (a shell's output file: ``test_spill.py``)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from toolpool.background import ShellState
from toolpool.pool.shell_bounds import ShellCaps, at_exit, overrun, reached
from toolpool.sandbox import confine_exec
from toolpool.sandbox.limits import Limits


@pytest.mark.spec("L9")
@pytest.mark.parametrize(
    ("running", "session", "client", "refusal"),
    [
        ([("s1", "c1")] * 15, "s1", "c1", None),
        ([("s1", "c1")] * 16, "s1", "c1", "the most a session may (16)"),
        ([("s1", "c1")] * 16 + [("s2", "c1")] * 3, "s2", "c1", None),
        (
            [("s1", "c1")] * 16 + [("s2", "c1")] * 4,
            "s3",
            "c1",
            "max_background_shells_per_client = 20",
        ),
        ([("s1", "c1")] * 16 + [("s2", "c1")] * 4, "s9", "c2", None),  # another client
        ([("s1", None)] * 16 + [("s2", None)] * 4, "s3", None, None),  # owners not known
        ([(f"s{i}", f"c{i}") for i in range(30)], "s99", "c99", "max_background_shells = 30"),
    ],
)
def test_L9_the_caps_count_running_shells_by_session_client_and_daemon(
    running: list[tuple[str, str | None]], session: str, client: str | None, refusal: str | None
) -> None:
    caps = ShellCaps(per_client=20, total=30)
    said = caps.refusal(running, session, client)
    if refusal is None:
        assert said is None
    else:
        assert said is not None and refusal in said


LIMITS = Limits(cpu_seconds=2, memory_bytes=64 << 20, processes=32)
KILL, XCPU = 128 + signal.SIGKILL, 128 + signal.SIGXCPU


@pytest.mark.spec("L9")
@pytest.mark.parametrize(
    ("code", "cpu", "oom", "pids", "limit"),
    [
        (0, 0.1, 0, 0, None),  # its own end
        (KILL, 0.3, 0, 0, None),  # killed by someone, its CPU far from spent
        (0, 2.5, 0, 0, None),  # it spent the allowance but exited by itself
        (XCPU, 1.97, 0, 0, "cpu_seconds = 2"),  # RLIMIT_CPU's SIGXCPU, under bubblewrap:
        (-signal.SIGXCPU, None, 0, 0, "cpu_seconds = 2"),  # its tick clock runs ahead
        (KILL, 3.0, 0, 0, "cpu_seconds = 2"),  # its SIGKILL, SIGXCPU ignored
        (-signal.SIGKILL, 2.01, 0, 0, "cpu_seconds = 2"),  # the same, without bubblewrap
        (KILL, 1.97, 0, 0, None),  # a SIGKILL of someone's, the CPU not spent
        (KILL, None, 0, 0, None),  # no CPU counted: nothing to tell it by
        (KILL, 0.2, 1, 0, "memory_bytes = 67108864"),  # the OOM killer
        (1, 0.2, 0, 3, "processes = 32"),  # a fork refused, then it gave up
    ],
)
def test_L9_the_limit_that_ended_a_shell_is_told_from_its_own_end(
    code: int, cpu: float | None, oom: int, pids: int, limit: str | None
) -> None:
    ended = at_exit(LIMITS, code, cpu, oom, pids)
    if limit is None:
        assert ended is None
    else:
        assert ended is not None and limit in ended.reason


@pytest.mark.spec("L9")
def test_L9_a_running_shell_past_its_cpu_or_with_a_refused_fork_has_reached_a_limit() -> None:
    assert reached(LIMITS, 1.9, 0) is None
    assert reached(LIMITS, None, 0) is None
    cpu = reached(LIMITS, 2.1, 0)
    assert cpu is not None and (cpu.name, cpu.value) == ("cpu_seconds", 2)
    assert cpu.reason == "it used up its CPU time limit (cpu_seconds = 2)"
    pids = reached(LIMITS, 0.5, 1)
    assert pids is not None and pids.reason == "it reached its process limit (processes = 32)"


@pytest.mark.spec("L9")
def test_L9_a_running_shell_times_out_at_its_deadline_and_is_killed_past_a_limit() -> None:
    # Given a shell with 60 s of wall time, its deadline at 100 (monotonic).
    def end(now: float, counters: tuple[float | None, int] | None) -> tuple[str, str] | None:
        ended = overrun(LIMITS, now, 100.0, 60.0, counters)
        return None if ended is None else (ended[0].value, ended[1].name)

    # Then within its time and limits it runs on, with counters or without;
    assert end(99.0, (1.0, 0)) is None and end(99.0, None) is None
    # past its deadline it times out, whatever its counters;
    assert end(100.0, None) == (ShellState.TIMED_OUT.value, "background_wall_seconds")
    assert end(100.0, (9.0, 1)) == (ShellState.TIMED_OUT.value, "background_wall_seconds")
    # and before it, past its CPU time or with a fork refused, it is killed.
    assert end(50.0, (2.1, 0)) == (ShellState.KILLED.value, "cpu_seconds")
    assert end(50.0, (0.5, 1)) == (ShellState.KILLED.value, "processes")


@pytest.mark.spec("L9")
def test_L9_a_shells_cpu_rlimit_warns_with_sigxcpu_a_second_before_its_sigkill() -> None:
    # Given the exec wrapper a shell starts through, asked for CPU=3:4 and NOFILE=64.
    show = "import resource as r; print(r.getrlimit(r.RLIMIT_CPU), r.getrlimit(r.RLIMIT_NOFILE))"
    argv = [sys.executable, "-I", "-S", confine_exec.__file__, "--rlimit", "CPU=3:4"]
    argv += ["--rlimit", "NOFILE=64", "--", sys.executable, "-I", "-S", "-c", show]
    # When the command it execs reads its own rlimits.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    # Then CPU's soft and hard limits are apart (SIGXCPU comes first), the rest equal.
    assert done.stdout.split("\n")[0] == "(3, 4) (64, 64)"
