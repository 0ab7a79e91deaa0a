"""Which waiting calls go to which worker, several to a frame (SPEC H4) — decided
without I/O, as the planner decides what to start and retire: ``assign`` and
``recalls`` read the workers' and the calls' records and return what to do.

Below ``max_workers``, or with ``hold_calls`` off, a call goes to an idle worker of
its own, one to a frame, and the planner starts workers for the rest. Once the pool
is at ``max_workers`` with no worker of the kind starting, calls may wait at a worker
instead of in the pool, ``depth`` (``worker_calls_per_frame``) at most:

- the idle workers take the queue in even shares, up to ``depth`` calls each in one
  frame: the first runs at once, the others wait in order behind it (held);
- a busy worker takes more calls behind the one it runs, up to ``depth`` held, the
  least loaded first (in a frame of its own: no frame carries more than ``depth``).

A call is held behind others only when it and every call ahead of it are read-only
(each may run again, should a held one crash the worker), none of them is being
stopped, the worker's cgroup already has the call's limits, and the worker will not
be recycled (``max_calls_per_worker``) before the call runs, and no call given it
has the same call id (two sessions may use one; a worker's messages name their call
by it). A call that runs again
because a worker died under it, perhaps of its doing, runs alone: nothing is held
behind it, and it is held behind nothing. A worker that falls
idle while calls are held elsewhere takes some of them back (``recalls``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from toolpool.pool.workers import Call, CallState, Kind, Worker, WorkerState

Frame = tuple[Worker, list[Call]]


@dataclass(frozen=True, slots=True)
class Rules:
    depth: int  # calls in one frame; calls held behind a worker's running one
    max_calls: int  # max_calls_per_worker
    hold: bool  # calls may wait at workers: at max_workers, none of the kind starting


@dataclass(slots=True)
class Plan:
    """What to do with the calls of one kind that wait: the frames to send, the held
    calls to take back, and whether calls still wait (the planner may start workers)."""

    frames: list[Frame] = field(default_factory=list)
    recalls: list[Call] = field(default_factory=list)
    waiting: bool = False


def plan(
    queue: Sequence[Call],
    workers: Iterable[Worker],
    kind: Kind,
    *,
    max_workers: int,
    at_max: Rules,
    below_max: Rules,
) -> Plan:
    """The plan for ``queue`` (the calls waiting for a worker of ``kind``).
    Calls wait at busy workers (``at_max``'s rules) only where no worker of their own
    can be had soon: the pool is at ``max_workers``, with none of the kind starting."""
    idle: list[Worker] = []
    busy: list[Worker] = []
    live, starting = 0, False
    for worker in workers:
        state = worker.state
        if state is not WorkerState.RETIRING and state is not WorkerState.DEAD:
            live += 1
        if worker.kind == kind:
            if state is WorkerState.IDLE:
                idle.append(worker)
            elif state is WorkerState.BUSY:
                busy.append(worker)
            elif state is WorkerState.STARTING:
                starting = True
    if not queue:
        # Nothing waits: idle workers take back calls held elsewhere.
        return Plan(recalls=recalls(len(idle), busy, at_max) if idle and busy else [])
    if len(queue) <= len(idle):  # the common case: each call a worker of its own
        return Plan([(worker, [call]) for worker, call in zip(idle, queue, strict=False)])
    rules = at_max if live >= max_workers and not starting else below_max
    frames = assign(queue, idle, busy, rules)
    return Plan(frames, waiting=sum(len(calls) for _, calls in frames) < len(queue))


def can_follow(worker: Worker, ahead: Sequence[Call], call: Call, rules: Rules) -> bool:
    """Whether ``call`` may wait at ``worker`` behind ``ahead`` (the calls it has, or
    takes in this frame; the first runs)."""
    first = ahead[0]  # (a suspect is never held: it can only be first)
    if not (call.holdable and first.holdable) or call.suspect or first.suspect:
        return False
    if len(ahead) > rules.depth:
        return False
    if worker.kill_reason is not None or worker.calls + len(ahead) >= rules.max_calls:
        return False
    if worker.cgroup is not None and call.cgroup != first.cgroup:
        return False
    # A worker's messages name their call by its id: no two calls at a worker share one.
    return not any(c.cancel_sent or c.call_id == call.call_id for c in ahead)


def assign(
    queue: Sequence[Call], idle: Sequence[Worker], busy: Sequence[Worker], rules: Rules
) -> list[Frame]:
    """The frames to send: calls of ``queue`` (first come first served; one kind of
    worker) for ``idle`` and ``busy`` workers of that kind. A call in none of them
    waits on."""
    waiting = list(queue)
    frames: list[Frame] = []
    pos = 0
    for i, worker in enumerate(idle):
        if pos == len(waiting):
            break
        take = min(max((len(waiting) - pos) // (len(idle) - i), 1), rules.depth)
        frame = [waiting[pos]]
        pos += 1
        while (
            rules.hold
            and len(frame) < take
            and pos < len(waiting)
            and can_follow(worker, frame, waiting[pos], rules)
        ):
            frame.append(waiting[pos])
            pos += 1
        frames.append((worker, frame))
    if not rules.hold or pos == len(waiting):
        return frames
    # The rest wait at busy workers (and at those just given a frame: their frames
    # grow), the least loaded first; a call that fits none stays in the queue.
    ahead: dict[Worker, list[Call]] = {w: list(w.given) for w in busy if w.given}
    ahead.update(frames)
    extra: dict[Worker, list[Call]] = {}
    for call in waiting[pos:]:
        best: Worker | None = None
        for worker, calls in ahead.items():
            if not worker.given and len(calls) >= rules.depth:
                continue  # a frame of its own is full
            if can_follow(worker, calls, call, rules) and (
                best is None or len(calls) < len(ahead[best])
            ):
                best = worker
        if best is None:
            continue
        ahead[best].append(call)
        if best.given:  # a busy worker: a frame of its own
            extra.setdefault(best, []).append(call)
    return frames + list(extra.items())


def recalls(idle: int, busy: Sequence[Worker], rules: Rules) -> list[Call]:
    """Held calls to take back (``Cancel`` with ``running=False``) for ``idle``
    workers that have nothing to do: for each, from the worker that holds the most,
    the later half of what it holds (the calls that would wait longest), at least
    one, at most ``depth``."""
    held = {
        w: [c for c in w.given if c.state is CallState.HELD and not (c.recalled or c.cancel_sent)]
        for w in busy
    }
    taken: list[Call] = []
    for _ in range(idle):
        worker = max(held, key=lambda w: len(held[w]), default=None)
        if worker is None or not held[worker]:
            break
        calls = held[worker]
        count = min((len(calls) + 1) // 2, rules.depth)
        taken += calls[-count:]
        del calls[-count:]
    return taken
