"""SPEC H4 on the worker's side of a frame (docs/protocol.md, "Several calls to a
message"): a real worker reads a message of several parts as if each had come alone,
answers the calls of a frame in one message of several results, in the order they
ran, holding a result only while another call waits at it; a cancel of a call held in
a frame withdraws that call only, even when the call comes back to the same worker;
a crash in the middle of a frame costs the other calls of the frame nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool.pool import WorkerPool
from toolpool.pool.workers import OutcomeStatus
from toolpool.protocol import CallStatus, Message, Result, Withdrawn

from .direct_worker import DirectWorker
from .support import PoolFactory, pool_factory, until
from .test_pool_holding import SETTINGS, marks, run, text

# Long enough never to end within a test: a result held is held until the worker
# sends it for another reason (no call waits any more).
FOREVER = 600.0

MakeWorker = Callable[..., DirectWorker]


@pytest.fixture
def make_worker(tmp_path: Path, workspace: Path) -> Iterator[MakeWorker]:
    made: list[DirectWorker] = []

    def make(**options: Any) -> DirectWorker:
        worker = DirectWorker(tmp_path, workspace, **options)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


def results(parts: list[Message]) -> list[str]:
    """The call ids of a message's results, in order (and nothing but results)."""
    assert all(isinstance(p, Result) for p in parts), parts
    return [p.call_id for p in parts if isinstance(p, Result)]


@pytest.mark.spec("H4")
def test_H4_a_message_of_several_parts_is_read_in_order_and_a_bad_part_dropped(
    make_worker: MakeWorker,
) -> None:
    # Given a worker that holds a result as long as another call waits
    worker = make_worker(result_hold=FOREVER)
    # When one message brings three calls, with a part that is not a message among them
    a, b, c = (worker.execute("lookup", {"key": k}, f"c-{k}") for k in "abc")
    worker.send(a, b"\xc1 not msgpack", b, c)
    # Then each call ran, in order, and the three answers came in one message
    [parts] = worker.receive()
    assert results(parts) == ["c-a", "c-b", "c-c"]
    assert [p.result["content"][0]["text"] for p in parts if isinstance(p, Result)] == [
        "value of a",
        "value of b",
        "value of c",
    ]


@pytest.mark.spec("H4")
def test_H4_a_result_is_held_only_while_another_call_waits_at_the_worker(
    make_worker: MakeWorker, workspace: Path
) -> None:
    # Given a worker whose hold never ends by itself
    worker = make_worker(result_hold=FOREVER)
    # When a call comes alone, its result is sent at once: no call waits behind it
    worker.send(worker.execute("noop", {}, "alone"))
    assert [results(p) for p in worker.receive()] == [["alone"]]
    # When a call ends with another waiting behind it, its result waits for that one's
    worker.send(
        worker.execute("noop", {}, "first"), worker.execute("wait_for", {"name": "go"}, "w")
    )
    (workspace / "go").touch()
    assert [results(p) for p in worker.receive()] == [["first", "w"]]


@pytest.mark.spec("H4")
def test_H4_a_held_result_leaves_at_the_end_of_its_hold_while_the_next_call_runs(
    make_worker: MakeWorker, workspace: Path
) -> None:
    # Given a worker of the default hold (1 ms), a frame of a quick call, then one
    # that runs until the test lets it end
    worker = make_worker()
    worker.send(
        worker.execute("noop", {}, "quick"), worker.execute("wait_for", {"name": "go"}, "w")
    )
    # Then the quick call's result comes while the other still runs (it is let go
    # only once that result is in)
    assert [results(p) for p in worker.receive()] == [["quick"]]
    (workspace / "go").touch()
    assert [results(p) for p in worker.receive()] == [["w"]]


@pytest.mark.spec("H4")
def test_H4_cancelling_the_third_of_eight_held_calls_withdraws_it_alone(
    make_worker: MakeWorker, workspace: Path
) -> None:
    # Given a frame of eight calls, the first running until the test lets it end
    worker = make_worker(result_hold=FOREVER)
    first = worker.execute("wait_for", {"name": "go"}, "c1")
    held = [worker.execute("lookup", {"key": str(i)}, f"c{i}") for i in range(2, 9)]
    worker.send(first, *held)
    # When the third is cancelled
    third = held[1]
    worker.cancel(third.ticket)
    # Then it is withdrawn, and it alone: the others run, in order, the first included
    [withdrawn] = worker.receive()
    assert withdrawn == [Withdrawn(third.ticket)]
    (workspace / "go").touch()
    [parts] = worker.receive()
    assert results(parts) == ["c1", "c2", "c4", "c5", "c6", "c7", "c8"]
    assert all(p.status is CallStatus.OK for p in parts if isinstance(p, Result))


@pytest.mark.spec("H4")
def test_H4_a_call_given_back_and_given_again_to_the_same_worker_is_cancelled_again(
    make_worker: MakeWorker, workspace: Path
) -> None:
    # Given a call held behind a long one, taken back (Cancel, running=False)
    worker = make_worker(result_hold=FOREVER)
    long = worker.execute("wait_for", {"name": "go"}, "long")
    back = worker.execute("lookup", {"key": "k"}, "back")
    worker.send(long, back)
    worker.cancel(back.ticket, running=False)
    assert worker.receive() == [[Withdrawn(back.ticket)]]
    # When the pool gives it the same worker again, with its ticket, and cancels it
    # before the worker has read the first Execute of it
    worker.send(back)
    worker.cancel(back.ticket)
    # Then the second cancel withdraws the second Execute: the call never runs
    assert worker.receive() == [[Withdrawn(back.ticket)]]
    (workspace / "go").touch()
    worker.send(worker.execute("noop", {}, "after"))
    assert [results(p) for p in worker.receive(2)] == [["long"], ["after"]]


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    async with pool_factory(**SETTINGS) as make:
        yield make


@pytest.mark.spec("H4", "D2")
async def test_H4_a_crash_in_the_middle_of_a_frame_costs_the_other_calls_nothing(
    make_pool: PoolFactory, workspace: Path
) -> None:
    # Given one worker at the pool's maximum, given a frame of eight calls, the third
    # of which crashes its worker (the results of the two before it may still be held)
    pool: WorkerPool = await make_pool(min_workers=1, max_workers=1)
    first = run(pool, workspace, "c1", "wait_for", {"name": "go"})
    await until(lambda: pool.statistics().workers["busy"] == 1)
    names = ["c2", "c3", "c4", "c5", "c6", "c7", "c8"]
    calls = [
        run(pool, workspace, n, "vanish", {})
        if n == "c3"
        else run(pool, workspace, n, "marked_nap", {"name": n, "seconds": 0})
        for n in names
    ]
    await until(lambda: pool.statistics().held == 7)
    # When the first call ends and the frame runs on
    (workspace / "go").touch()
    outcomes = await asyncio.gather(first, *calls)
    # Then the crasher is lost, and every other call of the frame ends as it would
    # have (those whose result had not left the worker ran again, elsewhere)
    assert text(outcomes[0]) == "go appeared"
    by_name = dict(zip(names, outcomes[1:], strict=True))
    assert by_name.pop("c3").status is OutcomeStatus.LOST
    assert {n: text(o) for n, o in by_name.items()} == {n: f"{n} slept" for n in by_name}
    assert all(1 <= marks(workspace, n) <= 2 for n in by_name)
