"""The pool's decisions about its workers, without processes: when a worker starts,
when one retires (its call was stopped or tainted it, it served
``max_calls_per_worker`` calls, it grew past ``max_worker_rss``), and what replaces a
worker that ended. (Which worker takes which waiting calls is ``holding.py``'s.)

Like the turn scheduler (``toolpool.engine.scheduler``), the planner does no I/O: it
reads a snapshot of the pool (``PoolState``) — or, for the question asked after
every call, the one worker (``retire_reason``) — and returns the actions to take —
``StartWorker``, ``RetireWorker``, ``FailWaiters``, ``ReplaceZygote``, ``GiveUp`` — in
the order the pool carries them out (``WorkerPool._perform``). Every action of a plan
is applied to the snapshot (``apply``) before the next one is decided, so a plan never
holds more than ``max_workers`` live workers.

Workers are of a kind (``workers.Kind``): offline ones (no network: a network
namespace of their own) and online ones, and those bound to one session's shipped
tools (SPEC A6), offline or not; a call waits for a worker of its kind. Every kind
counts towards ``max_workers``; the minimum (``min_workers``) is kept of plain ones.

While the zygote is down (it died, with every worker it forked: SPEC L1) no worker
can start: calls wait, and the planner decides when to try a new zygote and when to
give up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from toolpool.pool.workers import Kind, PoolConfig, WorkerState, plain

MAX_START_FAILURES = 3  # workers failing to start in a row: whoever waits gets an error
ZYGOTE_RETRIES = 4  # new zygotes that fail to start are tried again this often, then: give up
ZYGOTE_BACKOFF = 0.25  # seconds before the first retry; doubled for each next one


class WorkerLike(Protocol):
    """What the planner reads of a worker (``Worker`` and ``WorkerView`` both are)."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> Kind: ...
    @property
    def state(self) -> WorkerState: ...
    @property
    def calls(self) -> int: ...
    @property
    def rss(self) -> int: ...


@dataclass(frozen=True, slots=True)
class WorkerView:
    id: str
    kind: Kind
    state: WorkerState
    calls: int = 0
    rss: int = 0


@dataclass(frozen=True, slots=True)
class PoolState:
    """A snapshot of the pool: its workers that are not dead (in start order) and how
    many calls wait for a worker of each kind (``queued``: the kinds some wait for)."""

    workers: Sequence[WorkerLike] = ()
    queued: Mapping[Kind, int] = field(default_factory=dict)
    open: bool = True
    zygote_up: bool = True  # False from a zygote's death until its replacement started

    def waiting(self, kind: Kind) -> int:
        return self.queued.get(kind, 0)

    def worker(self, worker_id: str) -> WorkerLike | None:
        return next((w for w in self.workers if w.id == worker_id), None)

    def live(self) -> list[WorkerLike]:
        """The workers that are, or will be, able to take calls."""
        return [w for w in self.workers if w.state not in (WorkerState.DEAD, WorkerState.RETIRING)]


# --- actions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartWorker:
    kind: Kind
    replacement: bool = False  # it replaces a worker that ended or retired


@dataclass(frozen=True, slots=True)
class RetireWorker:
    """Tell the worker to shut down once its call is over."""

    worker_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class FailWaiters:
    """Workers cannot be had: every waiting call gets an error — of ``kind`` alone,
    when given (a session's tools that do not load in a worker)."""

    reason: str
    kind: Kind | None = None


@dataclass(frozen=True, slots=True)
class ReplaceZygote:
    """Start a new zygote, ``delay`` seconds from now (its workers died with the old)."""

    reason: str
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No zygote can be started: every waiting call, and every later one, gets an
    error."""

    reason: str


Action = StartWorker | RetireWorker | FailWaiters | ReplaceZygote | GiveUp


def apply(state: PoolState, action: Action) -> PoolState:
    """The snapshot as it is once ``action`` is carried out."""

    def with_state(worker_id: str, new: WorkerState) -> tuple[WorkerLike, ...]:
        return tuple(
            WorkerView(w.id, w.kind, new, w.calls, w.rss) if w.id == worker_id else w
            for w in state.workers
        )

    match action:
        case StartWorker(kind=kind):
            started = WorkerView(f"(new {len(state.workers)})", kind, WorkerState.STARTING)
            return dataclasses.replace(state, workers=(*state.workers, started))
        case RetireWorker(worker_id=worker_id):
            return dataclasses.replace(state, workers=with_state(worker_id, WorkerState.RETIRING))
        case FailWaiters(kind=None) | GiveUp():
            return dataclasses.replace(state, queued={})
        case FailWaiters(kind=kind):
            queued = {k: n for k, n in state.queued.items() if k != kind}
            return dataclasses.replace(state, queued=queued)
        case ReplaceZygote():
            return state


@dataclass(frozen=True, slots=True)
class CallEnd:
    """What the pool saw of a call's end that bears on its worker's next call."""

    stopped: bool = False  # cancelled or past its wall time: the worker was signalled
    cancelled: bool = False  # the worker answered "cancelled"
    limit_exceeded: bool = False  # the result names a limit the call met
    left_processes: bool = False  # processes the call left behind had to be ended


@dataclass(frozen=True, slots=True)
class PoolPlanner:
    min_workers: int = 2
    max_workers: int = 4
    max_calls_per_worker: int = 1000
    max_worker_rss: int = 512 * 1024 * 1024
    max_start_failures: int = MAX_START_FAILURES
    zygote_retries: int = ZYGOTE_RETRIES
    zygote_backoff: float = ZYGOTE_BACKOFF

    @classmethod
    def from_config(cls, config: PoolConfig) -> PoolPlanner:
        return cls(
            config.min_workers,
            config.max_workers,
            config.max_calls_per_worker,
            config.max_worker_rss,
        )

    def initial(self, offline: bool) -> list[Action]:
        """The workers to start with."""
        return [StartWorker(offline) for _ in range(self.min_workers)]

    def grow(self, state: PoolState, kind: Kind) -> list[Action]:
        """Start workers for the calls of this kind that no starting worker will
        serve, up to the maximum; make room by retiring idle workers of another
        kind."""
        actions: list[Action] = []
        if not state.zygote_up:
            return actions  # they wait for the new zygote's workers
        starting = sum(
            1 for w in state.live() if w.state is WorkerState.STARTING and w.kind == kind
        )
        for _ in range(state.waiting(kind) - starting):
            if len(state.live()) >= self.max_workers:
                other = next(
                    (w for w in state.live() if w.state is WorkerState.IDLE and w.kind != kind),
                    None,
                )
                if other is None:
                    break
                actions.append(RetireWorker(other.id, "to make room for another kind"))
                state = apply(state, actions[-1])
            actions.append(StartWorker(kind))
            state = apply(state, actions[-1])
        return actions

    def retire_reason(self, worker: WorkerLike, end: CallEnd) -> str | None:
        """Why a worker that has just ended a call must not take another, if it must
        not: a next call should not inherit what a stopped, cancelled or over-limit
        call left, nor a worker that served its calls or grew too large."""
        if end.stopped:
            return "its call was stopped"
        if end.cancelled:
            return "its call was cancelled"
        if end.limit_exceeded:
            return "its call met a limit"
        if end.left_processes:
            return "its call left processes behind"
        if worker.calls >= self.max_calls_per_worker:
            return f"it served {worker.calls} calls (max_calls_per_worker)"
        if worker.rss > self.max_worker_rss:
            return f"it grew to {worker.rss} bytes resident (max_worker_rss)"
        return None

    def retire(self, state: PoolState, worker_id: str, reason: str) -> list[Action]:
        """Shut the worker down once its call is over, and start what replaces it."""
        worker = state.worker(worker_id)
        if worker is None or worker.state in (WorkerState.DEAD, WorkerState.RETIRING):
            return []
        actions: list[Action] = [RetireWorker(worker_id, reason)]
        return actions + self.replenish(apply(state, actions[0]), worker.kind)

    def replenish(self, state: PoolState, kind: Kind) -> list[Action]:
        """A worker of this kind has gone (ended or retired): start a replacement
        when the pool is below its minimum (a plain one) or calls of its kind wait."""
        if not state.open or not state.zygote_up:
            return []
        actions: list[Action] = []
        if len(state.live()) < self.min_workers:
            actions.append(StartWorker(plain(kind), replacement=True))
            if plain(kind) == kind:
                return actions
            state = apply(state, actions[0])
        if state.waiting(kind):
            actions += [
                dataclasses.replace(a, replacement=True) if isinstance(a, StartWorker) else a
                for a in self.grow(state, kind)
            ]
        return actions

    def start_failed(
        self, state: PoolState, kind: Kind, failures: int, why: str, *, final: bool = False
    ) -> list[Action]:
        """A worker failed to start, the ``failures``-th time in a row: try again for
        whoever waits, or give up when starting more would fail the same way (a tool
        module that does not import…). ``final``: it will (a session's shipped tools
        that do not load): the calls waiting for its kind end at once."""
        if final:
            return [FailWaiters(why, kind)]
        if failures < self.max_start_failures:
            return self.grow(state, kind)
        return [FailWaiters(f"workers fail to start: {why}")]

    # -- the zygote (SPEC L1) -------------------------------------------------------------

    def zygote_died(self, state: PoolState, why: str, started: bool) -> list[Action]:
        """The zygote died, and every worker with it: start another at once (the
        calls that wait stay queued for its workers) — unless it died before it ever
        started (its tool modules do not import), which another would too."""
        if not state.open:
            return []
        if not started:
            return [GiveUp(f"the zygote did not start: {why}")]
        return [ReplaceZygote(f"the zygote died: {why}")]

    def zygote_start_failed(self, state: PoolState, failures: int, why: str) -> list[Action]:
        """A new zygote failed to start, the ``failures``-th time in a row: try again
        after a pause that doubles each time, or give up."""
        if not state.open:
            return []
        if failures <= self.zygote_retries:
            return [ReplaceZygote(why, self.zygote_backoff * 2 ** (failures - 1))]
        return [GiveUp(f"the zygote could not be started again ({failures} tries): {why}")]

    def zygote_started(self, state: PoolState, offline: bool) -> list[Action]:
        """A new zygote is up in place of one that died: start the minimum of workers
        again, and workers for the calls that waited meanwhile."""
        actions: list[Action] = []
        if not state.open:
            return actions
        for _ in range(max(self.min_workers - len(state.live()), 0)):
            actions.append(StartWorker(offline, replacement=True))
            state = apply(state, actions[-1])
        bound = [k for k in state.queued if not isinstance(k, bool)]
        kinds: list[Kind] = [offline, not offline, *bound]
        for kind in kinds:
            for action in self.grow(state, kind):
                actions.append(action)
                state = apply(state, action)
        return actions
