"""The daemon's server on its own: how turn events travel to a client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from toolpool import tool
from toolpool.daemon import clients as clients_module
from toolpool.daemon.server import Server
from toolpool.engine import Coordinator
from toolpool.engine.executor import Done, ExecutionRequest
from toolpool.protocol import (
    Accepted,
    EventSelection,
    Hello,
    OpenSession,
    SessionOpened,
    Submit,
    TurnEvent,
    Welcome,
    decode,
    encode,
)

LIMIT = 4096


@pytest.mark.spec("D5")
async def test_D5_events_batched_past_a_chunk_go_in_several_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients_module, "CHUNK_BYTES", LIMIT)
    server = Server(Coordinator([]))
    endpoint = server.bind(f"ipc://{tmp_path}/server.sock")
    server.start()
    context = zmq.asyncio.Context()
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.IDENTITY, b"client-1")
    client.connect(endpoint)
    try:
        await client.send(encode(Hello("h1", client="test")))
        assert isinstance(decode(await client.recv()), Welcome)
        # 20 events of ~1 kB, emitted in one turn of the loop: one batch, over a chunk
        for i in range(20):
            server.send_event(
                (0, b"client-1"), "t1", {"type": "tool_update", "n": i, "x": "y" * 1000}
            )
        received: list[int] = []
        frames = 0
        while len(received) < 20:
            frame = await asyncio.wait_for(client.recv(), 5)
            assert len(frame) <= LIMIT
            message = decode(frame)
            assert isinstance(message, TurnEvent)
            assert message.turn_id == "t1"
            received += [event["n"] for event in message.events]
            frames += 1
        assert received == list(range(20))  # nothing lost, nothing reordered
        assert 5 <= frames < 20  # split where needed, still batched
    finally:
        client.close(linger=0)
        context.term()
        await server.close()


@tool(read_only=True)
def echo(text: str) -> str:
    """Say it back."""
    return text


@asynccontextmanager
async def _raw_session(server: Server, tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    """``server`` listening, and a raw DEALER client of it that said hello and opened
    a session: the socket and the session's id. The socket is closed on the way out;
    the server is the caller's."""
    endpoint = server.bind(f"ipc://{tmp_path}/server.sock")
    server.start()
    context = zmq.asyncio.Context()
    client = context.socket(zmq.DEALER)
    client.connect(endpoint)
    try:
        await client.send(encode(Hello("h1", client="test")))
        assert isinstance(decode(await client.recv()), Welcome)
        await client.send(encode(OpenSession("o1", str(tmp_path))))
        opened = decode(await asyncio.wait_for(client.recv(), 30))
        assert isinstance(opened, SessionOpened)
        yield client, opened.session_id
    finally:
        client.close(linger=0)
        context.term()


async def _turn_frames(tmp_path: Path, events: EventSelection, calls: int) -> list[list[str]]:
    """The event types of each TurnEvent frame a raw client receives for one turn of
    ``calls`` echo calls submitted with ``events``, until its turn_end."""
    coordinator = Coordinator([echo])
    server = Server(coordinator)
    frames: list[list[str]] = []
    try:
        async with _raw_session(server, tmp_path) as (client, session_id):
            batch = [
                {"id": f"c{i}", "name": "echo", "arguments": {"text": f"t{i}"}}
                for i in range(calls)
            ]
            await client.send(encode(Submit("s1", session_id, batch, events=events)))
            while not frames or frames[-1][-1:] != ["turn_end"]:
                message = decode(await asyncio.wait_for(client.recv(), 30))
                if isinstance(message, TurnEvent):
                    frames.append([e["type"] for e in message.events])
                else:
                    assert isinstance(message, Accepted)
    finally:
        await server.close()
        coordinator.close()  # its sessions' scratch dirs
    return frames


@pytest.mark.spec("H1")
async def test_H1_a_results_only_turn_is_sent_its_tool_ends_and_turn_end_only(
    tmp_path: Path,
) -> None:
    every = await _turn_frames(tmp_path, EventSelection.ALL, 3)
    only = await _turn_frames(tmp_path, EventSelection.RESULTS, 3)
    sent = [t for frame in every for t in frame]
    assert sent.count("tool_start") == 3 and sent.count("tool_end") == 3
    assert "message_start" not in sent  # made by the client at turn_end (L2)
    kept = [t for frame in only for t in frame]
    assert sorted(kept) == ["tool_end"] * 3 + ["turn_end"]
    assert kept[-1] == "turn_end"


@pytest.mark.spec("H1")
async def test_H1_a_calls_tool_end_and_its_turns_end_share_a_frame(tmp_path: Path) -> None:
    # One call: its tool_end, and the turn_end that it brings, in one frame.
    assert await _turn_frames(tmp_path, EventSelection.RESULTS, 1) == [["tool_end", "turn_end"]]


class NeverAnswers:
    """An executor that takes calls and never ends them: a defect below the engine
    (a lost callback), as once a worker's unreadable answer was."""

    def __init__(self) -> None:
        self.taken: list[str] = []

    def submit(self, request: ExecutionRequest, done: Done) -> None:
        self.taken.append(request.call.id)


@pytest.mark.spec("D1")
async def test_D1_a_stopping_daemon_does_not_wait_for_ever_on_a_turn_that_never_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a server with a turn whose call is never answered, even once aborted
    executor = NeverAnswers()
    coordinator = Coordinator([echo], executor=executor)
    server = Server(coordinator)
    closed = False
    try:
        async with _raw_session(server, tmp_path) as (client, session_id):
            call = {"id": "c1", "name": "echo", "arguments": {"text": "hi"}}
            await client.send(encode(Submit("s1", session_id, [call])))
            while not executor.taken:
                await asyncio.sleep(0.01)
            # When the daemon stops: a short grace, then the abort, which nothing answers
            # (a hang guard around it: without its bound, the drain never returns)
            await asyncio.wait_for(server.drain(0.05, aborted_wait=0.2), 30)
            # Then the drain returned, the turn still unfinished, and the log says so
            assert len(server.unfinished_turns()) == 1
            stuck = [r for r in caplog.records if "did not end" in r.getMessage()]
            assert len(stuck) == 1 and stuck[0].levelname == "ERROR"
            # and closing returns too, though the session waits for that turn to close
            await asyncio.wait_for(server.close(wait=0.2), 30)
            closed = True
            unclosed = [r for r in caplog.records if "did not close" in r.getMessage()]
            assert len(unclosed) == 1 and unclosed[0].levelname == "ERROR"
    finally:
        if not closed:
            await server.close(wait=0.2)
        coordinator.close()
