"""Which calls of a turn may run now: pure decisions, no I/O (SPEC S1-S5).

The scheduler is told what happened (a call finished, the user interrupted, the run
was aborted) and answers with what to do (start these, cancel those, end these
without running them). ``turn.py`` carries the answers out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum


class CallState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class StopPlan:
    """What an interrupt or abort asks for: running calls to cancel, and queued calls
    that will never start and must be ended without running."""

    cancel: tuple[int, ...]
    never_started: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    queued: int
    running: int
    running_unsafe: bool
    done: int
    stopped: bool


class TurnScheduler:
    """Head-of-line scheduling of one turn's calls.

    ``safe[i]`` says whether call i may run beside others (S1);
    ``cancel_on_interrupt[i]`` whether an interrupt cancels it while it runs (S4).
    """

    def __init__(
        self,
        safe: Sequence[bool],
        cancel_on_interrupt: Sequence[bool],
        max_concurrency: int,
    ) -> None:
        if len(safe) != len(cancel_on_interrupt):
            raise ValueError("safe and cancel_on_interrupt must have one entry per call")
        self._safe = list(safe)
        self._cancel_on_interrupt = list(cancel_on_interrupt)
        self._max = max_concurrency
        self._state = [CallState.QUEUED] * len(safe)
        self._next = 0  # the head of the queue: calls start strictly in order (S2)
        self._running = 0
        self._running_unsafe = False
        self._cancelled: set[int] = set()
        self._stopped = False

    def add(self, safe: bool, cancel_on_interrupt: bool) -> int:
        """Queue one more call at the tail (an open turn); its index. A stopped
        scheduler takes no new call."""
        if self._stopped:
            raise ValueError("the turn was stopped: it takes no new calls")
        self._safe.append(safe)
        self._cancel_on_interrupt.append(cancel_on_interrupt)
        self._state.append(CallState.QUEUED)
        return len(self._state) - 1

    def cancel_one(self, index: int) -> CallState:
        """Stop one call: a running one is to be cancelled (the answer is RUNNING), a
        queued one never starts (QUEUED); a finished one needs nothing (DONE)."""
        state = self._state[index]
        if state is CallState.RUNNING:
            self._cancelled.add(index)
        elif state is CallState.QUEUED:
            self._state[index] = CallState.DONE
        return state

    def start_ready(self) -> list[int]:
        """The calls to start now, in turn order; they count as running from here."""
        started: list[int] = []
        while not self._stopped and self._next < len(self._state):
            i = self._next
            if self._state[i] is CallState.DONE:  # cancelled while queued
                self._next += 1
                continue
            # Three cases: nothing runs (anything may start); an unsafe call is
            # involved (it must run alone); safe beside safe, up to the limit (S3).
            if self._running and (
                not self._safe[i] or self._running_unsafe or self._running >= self._max
            ):
                break  # head-of-line: the calls behind it wait too (S2)
            self._state[i] = CallState.RUNNING
            self._running += 1
            self._running_unsafe = not self._safe[i]
            self._next += 1
            started.append(i)
        return started

    def finish(self, index: int) -> None:
        """Call ``index``, which was running, has ended."""
        if self._state[index] is not CallState.RUNNING:
            raise ValueError(f"call {index} is {self._state[index].value}, not running")
        self._state[index] = CallState.DONE
        self._running -= 1
        if not self._safe[index]:
            self._running_unsafe = False

    def interrupt(self) -> StopPlan:
        """S4: start nothing more; cancel running "cancel" calls; the queued never start."""
        return self._stop(lambda i: self._cancel_on_interrupt[i])

    def abort(self) -> StopPlan:
        """S5: start nothing more; cancel every running call; the queued never start."""
        return self._stop(lambda i: True)

    def _stop(self, should_cancel: Callable[[int], bool]) -> StopPlan:
        self._stopped = True
        cancel = tuple(
            i
            for i, state in enumerate(self._state)
            if state is CallState.RUNNING and i not in self._cancelled and should_cancel(i)
        )
        self._cancelled.update(cancel)
        never_started = tuple(
            i for i in range(self._next, len(self._state)) if self._state[i] is CallState.QUEUED
        )
        for i in never_started:
            self._state[i] = CallState.DONE
        self._next = len(self._state)
        return StopPlan(cancel, never_started)

    @property
    def stopped(self) -> bool:
        """An interrupt, an abort or a sibling's failure stopped the turn."""
        return self._stopped

    @property
    def done(self) -> bool:
        return all(s is CallState.DONE for s in self._state)

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            queued=self._state.count(CallState.QUEUED),
            running=self._running,
            running_unsafe=self._running_unsafe,
            done=self._state.count(CallState.DONE),
            stopped=self._stopped,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        unsafe = " (unsafe)" if s.running_unsafe else ""
        stopped = ", stopped" if s.stopped else ""
        return (
            f"<TurnScheduler [{s.running} running{unsafe}, {s.queued} queued, "
            f"{s.done} done{stopped}]>"
        )
