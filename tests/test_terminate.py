"""The one termination function (SPEC D4): escalation with a fake clock, and against
real processes that misbehave on purpose."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from toolpool.sandbox.terminate import (
    Escalation,
    ProcessGroup,
    ProcessTree,
    Together,
    terminate,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeProcesses:
    """Processes that die on the signals they do not ignore, after ``delay``."""

    def __init__(
        self,
        pids: set[int],
        ignore: set[int],
        clock: FakeClock,
        *,
        delay: float = 0.0,
        unkillable: bool = False,
    ) -> None:
        self.alive = set(pids)
        self.ignore = ignore
        self.clock = clock
        self.delay = delay
        self.unkillable = unkillable
        self.deaths: dict[int, float] = {}
        self.signals: list[int] = []

    def pids(self) -> set[int]:
        for pid, at in list(self.deaths.items()):
            if self.clock() >= at:
                self.alive.discard(pid)
        return set(self.alive)

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig in self.ignore or (sig == signal.SIGKILL and self.unkillable):
            return
        if sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.alive:
                self.deaths.setdefault(pid, self.clock() + self.delay)


@pytest.mark.spec("D4")
@pytest.mark.parametrize(
    ("pids", "ignore", "unkillable", "expected"),
    [
        (set(), set(), False, Escalation.NOTHING),
        ({1, 2}, set(), False, Escalation.TERM),
        ({1, 2}, {signal.SIGTERM}, False, Escalation.KILL),
        ({1}, {signal.SIGTERM}, True, Escalation.STUCK),
    ],
)
def test_D4_escalation_is_reported_with_a_fake_clock(
    pids: set[int], ignore: set[int], unkillable: bool, expected: Escalation
) -> None:
    clock = FakeClock()
    target = FakeProcesses(pids, ignore, clock, delay=0.5, unkillable=unkillable)
    report = terminate(target, grace=5.0, kill_wait=2.0, clock=clock, sleep=clock.sleep)
    assert report.escalation is expected
    if expected is Escalation.KILL:
        assert 5.0 <= report.seconds < 6.0  # the whole grace period, then the kill
        assert target.signals[:3] == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    if expected is Escalation.TERM:
        assert report.seconds == pytest.approx(0.5, abs=0.02)
        assert signal.SIGKILL not in target.signals
    if expected is Escalation.STUCK:
        assert report.survivors == (1,)


def test_zero_grace_goes_straight_to_kill() -> None:
    clock = FakeClock()
    target = FakeProcesses({7}, set(), clock)
    report = terminate(target, grace=0, clock=clock, sleep=clock.sleep)
    assert report.escalation is Escalation.KILL
    assert target.signals == [signal.SIGKILL]


@pytest.mark.spec("D4")
def test_D4_real_processes_term_then_kill() -> None:
    polite = subprocess.Popen(["sleep", "100"], start_new_session=True)
    stubborn = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 100 & wait"], start_new_session=True
    )
    try:
        # The shell ignores TERM once it has started its sleep (the trap comes first)
        deadline = time.monotonic() + 30  # a hang guard: it starts within milliseconds
        while not psutil.Process(stubborn.pid).children():
            assert time.monotonic() < deadline, "the stubborn shell started no sleep"
            time.sleep(0.01)
        # Graces far past what a polite process needs: a slow machine cannot make
        # the polite sleep look stubborn, nor a SIGKILLed process look stuck
        polite_report = terminate(ProcessTree(polite.pid), grace=30, kill_wait=30)
        assert polite_report.escalation is Escalation.TERM
        started = time.monotonic()
        report = terminate(
            Together(ProcessGroup(stubborn.pid), ProcessTree(stubborn.pid)),
            grace=0.3,
            kill_wait=30,
        )
        assert report.escalation is Escalation.KILL
        assert time.monotonic() - started >= 0.3  # the whole grace was waited for
        assert len(report.pids) == 2  # the shell and its sleep
        assert not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in report.pids
        )
    finally:
        polite.wait()
        stubborn.wait()
