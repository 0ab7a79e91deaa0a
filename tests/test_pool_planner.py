"""SPEC D2: the pool's decisions — when a worker starts, when one retires, what
replaces one that ended — as the planner takes them, on snapshots and without a
process. (Which worker takes which calls: tests/test_pool_dispatch.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpool.pool.planner import (
    Action,
    CallEnd,
    FailWaiters,
    PoolPlanner,
    PoolState,
    RetireWorker,
    StartWorker,
    WorkerView,
    apply,
)
from toolpool.pool.workers import Binding, Kind, PoolConfig, WorkerState

IDLE, BUSY, STARTING, RETIRING = (
    WorkerState.IDLE,
    WorkerState.BUSY,
    WorkerState.STARTING,
    WorkerState.RETIRING,
)


def pool(*workers: WorkerView, online: int = 0, offline: int = 0, open: bool = True) -> PoolState:
    queued = {kind: n for kind, n in ((False, online), (True, offline)) if n}
    return PoolState(workers, queued=queued, open=open)


def w(worker_id: str, state: WorkerState, *, offline: bool = False, **kw: int) -> WorkerView:
    return WorkerView(worker_id, offline, state, **kw)


planner = PoolPlanner(min_workers=2, max_workers=4, max_calls_per_worker=10, max_worker_rss=100)


def test_from_config_takes_the_pools_settings() -> None:
    config = PoolConfig(min_workers=1, max_workers=3, max_calls_per_worker=7, max_worker_rss=9)
    assert PoolPlanner.from_config(config) == PoolPlanner(1, 3, 7, 9)


def test_the_pool_starts_with_its_minimum() -> None:
    assert planner.initial(True) == [StartWorker(True), StartWorker(True)]


def test_waiting_calls_start_workers_up_to_the_maximum() -> None:
    state = pool(w("w1", BUSY), w("w2", BUSY), online=5)
    assert planner.grow(state, False) == [StartWorker(False), StartWorker(False)]


def test_a_starting_worker_counts_for_a_waiting_call() -> None:
    state = pool(w("w1", BUSY), w("w2", STARTING), online=2)
    assert planner.grow(state, False) == [StartWorker(False)]


def test_a_full_pool_makes_room_by_retiring_an_idle_worker_of_the_other_kind() -> None:
    state = pool(w("w1", BUSY), w("w2", BUSY), w("w3", IDLE, offline=True), w("w4", BUSY), online=2)
    assert planner.grow(state, False) == [
        RetireWorker("w3", "to make room for another kind"),
        StartWorker(False),
    ]  # one idle worker of the other kind: room for one


def test_retiring_to_make_room_never_goes_past_the_maximum() -> None:
    tight = PoolPlanner(min_workers=2, max_workers=2)
    state = pool(w("w1", IDLE, offline=True), w("w2", BUSY, offline=True), online=1)
    plan = tight.grow(state, False)
    assert plan == [RetireWorker("w1", "to make room for another kind"), StartWorker(False)]
    assert len(_after(state, plan).live()) == 2


def test_an_idle_worker_of_the_other_kind_gives_its_place_to_a_waiting_call() -> None:
    full = pool(w("w1", BUSY), w("w2", BUSY), w("w3", BUSY), w("w4", IDLE), offline=1)
    assert planner.grow(full, True) == [
        RetireWorker("w4", "to make room for another kind"),
        StartWorker(True),
    ]


@pytest.mark.parametrize(
    ("worker", "end", "reason"),
    [
        (w("w1", BUSY), CallEnd(stopped=True), "its call was stopped"),
        (w("w1", BUSY), CallEnd(cancelled=True), "its call was cancelled"),
        (w("w1", BUSY), CallEnd(limit_exceeded=True), "its call met a limit"),
        (w("w1", BUSY), CallEnd(left_processes=True), "its call left processes behind"),
        (w("w1", BUSY, calls=10), CallEnd(), "it served 10 calls (max_calls_per_worker)"),
        (w("w1", BUSY, rss=101), CallEnd(), "it grew to 101 bytes resident (max_worker_rss)"),
    ],
)
@pytest.mark.spec("D2")
def test_a_worker_is_retired_after_a_call_that_must_not_reach_the_next(
    worker: WorkerView, end: CallEnd, reason: str
) -> None:
    state = pool(worker, w("w2", IDLE))
    assert planner.retire_reason(worker, end) == reason
    # Two live workers stay the minimum: the retired one is replaced at once.
    assert planner.retire(state, "w1", reason) == [
        RetireWorker("w1", reason),
        StartWorker(False, replacement=True),
    ]


def test_an_ordinary_call_leaves_its_worker_to_the_next() -> None:
    assert planner.retire_reason(w("w1", BUSY, calls=9, rss=100), CallEnd()) is None


def test_nothing_is_decided_for_a_worker_that_is_gone_or_leaving() -> None:
    assert planner.retire(pool(w("w1", RETIRING)), "w1", "again") == []
    assert planner.retire(pool(), "w1", "gone") == []


@pytest.mark.spec("D2")
def test_a_worker_that_ended_is_replaced_below_the_minimum_or_when_calls_wait() -> None:
    assert planner.replenish(pool(w("w1", BUSY)), False) == [StartWorker(False, replacement=True)]
    enough = pool(w("w1", BUSY), w("w2", BUSY), offline=2)
    assert planner.replenish(enough, True) == [
        StartWorker(True, replacement=True),
        StartWorker(True, replacement=True),
    ]
    assert planner.replenish(pool(w("w1", IDLE), w("w2", IDLE)), False) == []
    assert planner.replenish(pool(open=False), False) == []  # a closing pool replaces nothing


def test_workers_that_fail_to_start_again_and_again_fail_the_waiting_calls() -> None:
    state = pool(online=1)
    assert planner.start_failed(state, False, 1, "boom") == [StartWorker(False)]
    assert planner.start_failed(state, False, 3, "boom") == [
        FailWaiters("workers fail to start: boom")
    ]


def test_apply_follows_the_actions() -> None:
    state = pool(w("w1", BUSY), w("w2", BUSY, offline=True), online=1, offline=1)
    state = apply(state, RetireWorker("w2", "done"))
    assert [v.id for v in state.live()] == ["w1"]
    state = apply(state, StartWorker(True))
    assert [(v.kind, v.state) for v in state.live()] == [(False, BUSY), (True, STARTING)]
    assert apply(state, FailWaiters("no")).waiting(True) == 0


def _after(state: PoolState, plan: list[Action]) -> PoolState:
    for action in plan:
        state = apply(state, action)
    return state


# The plain kinds, and two bindings' (a session's shipped tools), offline or not.
BINDINGS = (Binding("s1", b""), Binding("s2", b""))
kinds = st.one_of(
    st.booleans(), st.builds(lambda b, o: b.kind(o), st.sampled_from(BINDINGS), st.booleans())
)
states = st.sampled_from([IDLE, BUSY, STARTING, RETIRING])


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[PoolPlanner, PoolState]:
    maximum = draw(st.integers(1, 5))
    planner = PoolPlanner(min_workers=draw(st.integers(0, maximum)), max_workers=maximum)
    workers = draw(st.lists(st.tuples(kinds, states), max_size=maximum))
    live = [(o, s) for o, s in workers if s is not RETIRING][:maximum]
    views = tuple(WorkerView(f"w{i}", o, s) for i, (o, s) in enumerate(live))
    waiting = draw(st.dictionaries(kinds, st.integers(1, 6), max_size=3))
    return planner, PoolState(views, queued=waiting)


@settings(max_examples=300, deadline=None)
@given(snapshots(), kinds, st.sampled_from(["grow", "retire", "replenish"]))
def test_no_plan_holds_more_live_workers_than_the_maximum(
    snapshot: tuple[PoolPlanner, PoolState], kind: Kind, decision: str
) -> None:
    planner, state = snapshot
    worker = next((v.id for v in state.workers if v.state is BUSY), None)
    if decision == "grow":
        plan = planner.grow(state, kind)
    elif decision == "replenish":
        plan = planner.replenish(state, kind)
    elif worker is None:
        return
    else:
        plan = planner.retire(state, worker, "test")
    after = _after(state, plan)
    assert len(after.live()) <= max(planner.max_workers, len(state.live()))
    assert all(n >= 0 for n in after.queued.values())
    retired = {a.worker_id for a in plan if isinstance(a, RetireWorker)}
    assert all(state.worker(r) is not None for r in retired)


# --- workers bound to a session's shipped tools (SPEC A6) --------------------------------


@pytest.mark.spec("A6")
def test_A6_a_bound_kind_grows_by_making_room_and_never_counts_as_the_minimum() -> None:
    bound = Binding("s1", b"payload").kind(False)
    # Given a full pool with an idle plain worker, and a call of a session's tools
    full = PoolState((w("w1", BUSY), w("w2", IDLE), w("w3", BUSY), w("w4", BUSY)), {bound: 1})
    # Then the idle plain worker makes room for a worker of the binding
    assert planner.grow(full, bound) == [
        RetireWorker("w2", "to make room for another kind"),
        StartWorker(bound),
    ]
    # Given a bound worker gone below the minimum: a plain one replaces it ...
    below = PoolState((w("w1", BUSY),), {})
    assert planner.replenish(below, bound) == [StartWorker(False, replacement=True)]
    # ... and one of the binding's too when its calls wait
    waiting = PoolState((w("w1", BUSY),), {bound: 1})
    assert planner.replenish(waiting, bound) == [
        StartWorker(False, replacement=True),
        StartWorker(bound, replacement=True),
    ]


@pytest.mark.spec("A6")
def test_A6_tools_that_do_not_load_fail_their_own_calls_alone() -> None:
    bound = Binding("s1", b"payload").kind(True)
    state = PoolState((w("w1", BUSY),), {False: 2, bound: 3})
    # When a worker of the binding said its tools did not load
    plan = planner.start_failed(state, bound, 1, "ModuleNotFoundError: x", final=True)
    # Then only the binding's calls end, at once (no second try would load them)
    assert plan == [FailWaiters("ModuleNotFoundError: x", bound)]
    assert apply(state, plan[0]).queued == {False: 2}


@pytest.mark.spec("A6")
def test_A6_a_new_zygote_starts_workers_for_the_bindings_that_wait() -> None:
    bound = Binding("s1", b"payload").kind(True)
    state = PoolState((), {bound: 1})
    actions = planner.zygote_started(state, offline=True)
    assert actions == [StartWorker(True, replacement=True)] * 2 + [StartWorker(bound)]
