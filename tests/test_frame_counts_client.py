"""How many frames cross between a client and the daemon per turn (SPEC L2, L5): the
client library's ``Connection`` wired to the daemon's core in memory, each frame
counted on its way. Each frame is a wake-up on both sides and most of what a call
costs the client, so a change that adds one shows here, not in a benchmark."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from toolpool import MessageEnd, MessageStart, ToolCall, ToolEnd, ToolStart, TurnEnd, tool
from toolpool.client.connection import Connection
from toolpool.client.operation import Operation
from toolpool.daemon.core import DaemonCore
from toolpool.engine import Coordinator
from toolpool.protocol import TurnEvent, decode

from .support import ticks

T = TypeVar("T")
ME = (0, b"me")


@tool(read_only=True)
async def noop() -> str:
    """Nothing, at once."""
    return "ok"


@dataclass
class Counted:
    """The in-memory transport between the two, counting as it carries: ZeroMQ
    messages and their parts from the daemon, frames from the client."""

    connection: Connection
    core: DaemonCore | None = None
    down_messages: int = 0  # daemon → client, ZeroMQ messages
    down_parts: int = 0  # daemon → client, encoded messages within them
    up: int = 0  # client → daemon
    held: bool = False  # the core holds what may wait
    kinds: list[str] = field(default_factory=list)

    def send(self, address: tuple[int, bytes], frames: list[bytes]) -> None:
        self.down_messages += 1
        self.down_parts += len(frames)
        for frame in frames:
            self.kinds.append(_kinds(frame))
            self.connection.receive(frame)

    async def wait(self, operation: Operation[T]) -> T:
        assert self.core is not None
        for _ in range(10_000):  # a hang guard: a turn of no-ops ends in a few ticks
            for frame in self.connection.take_outgoing():
                self.up += 1
                self.core.receive(ME, [frame])
            if operation.done():
                return operation.outcome()
            await ticks(1)
        raise AssertionError("no answer")

    def reset(self) -> None:
        self.down_messages = self.down_parts = self.up = 0
        self.kinds.clear()


def _kinds(frame: bytes) -> str:
    message = decode(frame)
    if isinstance(message, TurnEvent):
        return "+".join(e["type"] for e in message.events)
    return message.type.value


@pytest.fixture(params=["held", "not held"])
async def link(
    request: pytest.FixtureRequest, tmp_path: Path, workspace: Path
) -> AsyncIterator[tuple[Counted, str]]:
    coordinator = Coordinator([noop])
    connection = Connection("ipc:///in-memory", 5.0)
    connection.start()
    counted = Counted(connection)
    loop = asyncio.get_running_loop()

    # "held": what may wait (Accepted, tool_start) waits for what follows it, as the
    # server's short hold does for a call that ends within it; here long enough that
    # a no-op always does, so the count does not depend on the machine's speed.
    def hold(callback: Callable[[], None]) -> asyncio.TimerHandle:
        return loop.call_later(60.0, callback)

    core = counted.core = DaemonCore(
        coordinator,
        None,
        counted,
        defer=loop.call_soon,
        hold=hold if request.param == "held" else None,
        spill_dir=tmp_path,
    )
    counted.held = request.param == "held"
    await counted.wait(connection.hello("frames", 5.0))
    session = await counted.wait(connection.open_session(str(workspace), {}, None))
    yield counted, session
    core.end_sessions()
    await ticks(5)
    coordinator.close()


async def _turn(link: Counted, session: str, size: int, tag: str) -> list[Any]:
    calls = [ToolCall(f"{tag}{i}", "noop", {}) for i in range(size)]
    log = await link.wait(link.connection.submit(session, calls, None, False))
    await link.wait(link.connection.turn_end(log, None))
    return list(log.items)


# (held, size): ZeroMQ messages down, encoded messages in them, frames up (the Submit
# alone: the client acknowledges by bytes read, every 256 KiB, not per frame, L5).
FRAMES = {
    # all in one message: [Accepted, [tool_start, tool_end, turn_end]]
    (True, 1): (1, 2, 1),
    # Accepted with the first ends and the starts before them, then 3 frames: ends,
    # which do not wait, with the starts their calls' ends let in (10 run at a time)
    (True, 32): (4, 5, 1),
    # [Accepted, [tool_start]]; [tool_end, turn_end]
    (False, 1): (2, 3, 1),
    (False, 32): (5, 6, 1),
}


@pytest.mark.spec("L2", "L5")
@pytest.mark.parametrize("size", [1, 32], ids=["one-call turn", "32-call turn"])
async def test_L2_a_turn_crosses_in_a_fixed_number_of_frames(
    link: tuple[Counted, str], size: int
) -> None:
    # Given a client connected to the daemon, after a first turn (warm)
    counted, session = link
    await _turn(counted, session, size, "warm")
    counted.reset()
    # When it runs one turn of `size` no-op calls with every event
    items = await _turn(counted, session, size, "c")
    # Then the frames each way are these
    sent = (counted.down_messages, counted.down_parts, counted.up)
    assert sent == FRAMES[counted.held, size], counted.kinds
    # and the client still sees every event, the message events made on its side
    kinds = [type(i) for i in items]
    assert kinds.count(ToolStart) == kinds.count(ToolEnd) == size
    assert kinds[-1 - 2 * size :] == [MessageStart, MessageEnd] * size + [TurnEnd]
