"""The messages between the pool and its workers, counted, so that no change adds one
silently (what a call costs in a lean daemon is messages).

At the worker, exactly: a one-call turn is one message each way, one part each; a
32-call turn, given as the pool gives it at its maximum (frames of
``worker_calls_per_frame`` = 8 calls, one message each), is answered with one message
of eight results a frame (the hold pinned long, so the count does not depend on the
machine's speed). Through a real pool, what does not depend on timing: a one-call
turn's two messages; a 32-call turn's frames of at most 8, its 32 results, and one
call sent again for each given back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool.pool import WorkerPool
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.supervisor import Supervisor
from toolpool.protocol import Heartbeat, Ready, Result, Withdrawn, decode

from .direct_worker import DirectWorker
from .support import PoolFactory, pool_factory
from .test_pool_holding import SETTINGS, run, text

FRAME = 8  # PoolConfig.worker_calls_per_frame's default


@pytest.fixture
def worker(tmp_path: Path, workspace: Path) -> Iterator[DirectWorker]:
    made = DirectWorker(tmp_path, workspace, result_hold=600.0)
    yield made
    made.close()


def shape(messages: list[list[Any]]) -> list[int]:
    """How many parts each message had, every part a Result."""
    assert all(isinstance(p, Result) for parts in messages for p in parts), messages
    return [len(parts) for parts in messages]


@pytest.mark.spec("H4")
def test_H4_a_one_call_turn_is_one_message_each_way_at_the_worker(worker: DirectWorker) -> None:
    # When the pool sends one call, then (once answered) another
    worker.send(worker.execute("noop", {}, "c1"))
    worker.receive()
    worker.send(worker.execute("noop", {}, "c2"))
    worker.receive()
    # Then the worker sent one message of one part for each, and nothing else
    assert shape(worker.call_line()) == [1, 1]


@pytest.mark.spec("H4")
def test_H4_a_32_call_turn_is_one_message_of_8_results_a_frame_at_the_worker(
    worker: DirectWorker,
) -> None:
    # When the pool sends 32 calls in frames of 8, one message each
    calls = [worker.execute("noop", {}, f"c{i}") for i in range(32)]
    for at in range(0, 32, FRAME):
        worker.send(*calls[at : at + FRAME])
    worker.receive(32 // FRAME)
    # Then each frame was answered with one message of its 8 results, in order
    assert shape(worker.call_line()) == [FRAME] * 4
    ids = [p.call_id for parts in worker.call_line() for p in parts if isinstance(p, Result)]
    assert ids == [c.call_id for c in calls]


class _Counted:
    """The ZeroMQ messages and parts between a pool and its workers' call lines (the
    zygote's pipe and the control lines apart; heartbeats and Ready not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[int] = []  # parts of each message to a worker
        self.received: list[list[type]] = []  # each message from a worker: its parts' types
        send_parts, on_frames = WorkerProcesses.send_parts, Supervisor._on_frames

        def counted_send(processes: WorkerProcesses, worker: Any, parts: list[bytes]) -> None:
            self.sent.append(len(parts))
            send_parts(processes, worker, parts)

        def counted_frames(supervisor: Supervisor, frames: list[bytes]) -> None:
            parts = [decode(f) for f in frames[1:]]
            if not all(isinstance(p, Heartbeat | Ready) for p in parts):
                self.received.append([type(p) for p in parts])
            on_frames(supervisor, frames)

        monkeypatch.setattr(WorkerProcesses, "send_parts", counted_send)
        monkeypatch.setattr(Supervisor, "_on_frames", counted_frames)

    def clear(self) -> None:
        self.sent.clear()
        self.received.clear()


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    async with pool_factory(**SETTINGS) as make:
        yield make


@pytest.mark.spec("H4")
async def test_H4_through_the_pool_a_turn_costs_its_calls_messages_and_no_more(
    make_pool: PoolFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = _Counted(monkeypatch)
    pool: WorkerPool = await make_pool(min_workers=2, max_workers=2)
    await asyncio.gather(*(run(pool, workspace, f"warm{i}", "noop", {}) for i in range(2)))
    # A one-call turn: one message to the worker, one back, one part each
    counted.clear()
    assert text(await run(pool, workspace, "one", "noop", {})) == "ok"
    assert (counted.sent, counted.received) == ([1], [[Result]])
    # A 32-call turn: in frames of at most 8; back, 32 results and nothing else but
    # the calls given back (a worker falling idle takes calls held elsewhere: each is
    # sent once more)
    counted.clear()
    outcomes = await asyncio.gather(*(run(pool, workspace, f"c{i}", "noop", {}) for i in range(32)))
    assert [text(o) for o in outcomes] == ["ok"] * 32
    back = [kind for parts in counted.received for kind in parts]
    assert set(back) <= {Result, Withdrawn} and back.count(Result) == 32
    assert sum(counted.sent) == 32 + back.count(Withdrawn)
    assert max(counted.sent) <= FRAME and len(counted.sent) >= 32 // FRAME
