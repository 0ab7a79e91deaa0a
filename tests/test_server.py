"""The daemon's server on its own: how turn events travel to a client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from toolpool.daemon import server as server_module
from toolpool.daemon.server import Server
from toolpool.engine import Coordinator
from toolpool.protocol import Hello, TurnEvent, Welcome, decode, encode

LIMIT = 4096


@pytest.mark.spec("D5")
async def test_D5_events_batched_past_a_chunk_go_in_several_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "CHUNK_BYTES", LIMIT)
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
