"""Messages larger than a chunk, as ``Chunk`` frames and back (SPEC L3).

The daemon's frames to a client are at most about ``CHUNK_BYTES``: a larger one (a
turn event with a large result) is cut into ``Chunk`` messages of one stream, sent
back to back, and joined again by the client before it is decoded. Chunks bound the
size of one send (the window of SPEC L5 counts frames) and lift the frame limit from
results: a message may be up to ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

from toolpool.protocol.client import Chunk
from toolpool.protocol.frames import encode
from toolpool.protocol.kinds import CHUNK_BYTES, MAX_MESSAGE_BYTES, ProtocolError


def chunked(frame: bytes, stream: int, size: int = CHUNK_BYTES) -> list[bytes]:
    """The frames that carry ``frame``: itself when it is at most ``size`` bytes,
    else ``Chunk`` frames of stream ``stream``, the last one marked."""
    if len(frame) <= size:
        return [frame]
    view = memoryview(frame)
    return [
        encode(Chunk(stream, bytes(view[at : at + size]), at + size >= len(frame)))
        for at in range(0, len(frame), size)
    ]


class Reassembly:
    """Joins the chunks of one stream at a time; refuses interleaved streams and
    messages over ``limit`` bytes (ProtocolError)."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._stream: int | None = None
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def pending(self) -> bool:
        """A stream has begun and not ended: any other frame now is out of order."""
        return self._stream is not None

    def add(self, chunk: Chunk) -> bytes | None:
        """The whole frame when ``chunk`` is its stream's last, else None."""
        if self._stream is None:
            self._stream = chunk.stream
        elif chunk.stream != self._stream:
            raise ProtocolError(f"chunk of stream {chunk.stream} inside stream {self._stream}")
        self._size += len(chunk.data)
        if self._size > self.limit:
            raise ProtocolError(f"a chunked message over {self.limit} bytes")
        self._parts.append(chunk.data)
        if not chunk.last:
            return None
        whole = b"".join(self._parts)
        self._stream, self._parts, self._size = None, [], 0
        return whole
