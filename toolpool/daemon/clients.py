"""The daemon's clients and everything that goes out to them (SPEC D5, L3, L5), with
no socket of its own: what is to be sent goes to a ``Transport``.

A client that said hello has a ``ClientState``: its sessions, its ``Outbox`` (at most
``client_buffer_bytes`` unacknowledged; the rest waits on disk while the client's
turns are held) and its hold. A turn's events wait in ``_pending`` until ``flush``,
which the owner runs once per turn of the event loop (``defer``): the events emitted
together — a call's end and the turn's end it brings — leave in one frame. A message
larger than a chunk leaves as chunks (L3). A send that fails (the client's connection
is gone) reports the client to ``on_gone``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from toolpool.daemon.outbox import Outbox
from toolpool.daemon.records import Address, ClientState
from toolpool.protocol import (
    CHUNK_BYTES,
    Error,
    FailureCode,
    Message,
    Ping,
    TurnEvent,
    chunked,
    encode,
)

log = logging.getLogger("toolpool.daemon")


class ClientGone(Exception):
    """The transport cannot reach the client any more (its connection is gone)."""


class Cancellable(Protocol):
    def cancel(self) -> None:
        """It will not run (an event loop's timer handle)."""
        ...


class Transport(Protocol):
    def send(self, address: Address, frames: list[bytes]) -> None:
        """Send one message of ``frames`` to ``address``, now; ClientGone if it left."""
        ...


class Clients:
    def __init__(
        self,
        transport: Transport,
        *,
        defer: Callable[[Callable[[], None]], object],
        spill_dir: Path,
        window: int,
        on_gone: Callable[[Address], None],
        hold: Callable[[Callable[[], None]], Cancellable] | None = None,
    ) -> None:
        self._transport = transport
        self._defer = defer
        self._hold = hold
        self._spill_dir = spill_dir
        self._window = window
        self._on_gone = on_gone
        self.table: dict[Address, ClientState] = {}
        self._streams = itertools.count(1)  # chunked messages' stream ids
        self._pending: dict[Address, list[tuple[str, dict[str, Any]]]] = {}
        # Replies that lead the next flush's events, in one message of several parts.
        self._leading: dict[Address, list[bytes]] = {}
        self._flush_deferred = False  # a flush is due at the next turn of the loop
        self._held: Cancellable | None = None  # a flush due within the hold

    # -- the table -------------------------------------------------------------------

    def add(self, address: Address, name: str) -> ClientState:
        """A client that said hello: its record, with its outbox and spill file."""
        client = self.table.get(address)
        if client is None:
            spill = self._spill_dir / f"{address[0]}-{address[1].hex()}.frames"
            outbox = Outbox(lambda frame: self._raw(address, frame), self._window, spill)
            client = self.table[address] = ClientState(address, name, outbox)
        return client

    def remove(self, address: Address) -> ClientState | None:
        """Forget the client; what waits for it is dropped."""
        client = self.table.pop(address, None)
        if client is not None:
            client.outbox.close()
            self._pending.pop(address, None)
            self._leading.pop(address, None)
        return client

    # -- what goes out --------------------------------------------------------------------

    def send(self, address: Address, message: Message) -> None:
        """Send now, after the events still waiting for this client (so an approval
        request never overtakes the tool_start of its call)."""
        if address in self._pending or address in self._leading:
            self._flush_one(address)
        self._out(address, encode(message))

    def send_before_events(self, address: Address, message: Message) -> None:
        """Send ahead of the events queued after it, with them, in one message of
        several parts, within the hold: a Submit's ``Accepted`` leaves with its
        turn's first events (a no-op turn's all), one wake-up of the client."""
        if address in self._pending:
            self._flush_one(address)  # what was queued before it goes first
        frame = encode(message)
        leading = self._leading.get(address)
        if leading is None:
            self._leading[address] = [frame]
        else:
            leading.append(frame)
        if not (self._flush_deferred or self._held):
            self._hold_flush()

    def send_event(self, address: Address, turn_id: str, event: dict[str, Any]) -> None:
        """Queue a turn's event for the next ``flush``, at the next turn of the loop
        (with what is held: a result and the turn's end do not wait)."""
        pending = self._pending.get(address)
        if pending is None:
            self._pending[address] = [(turn_id, event)]
        else:
            pending.append((turn_id, event))
        if not self._flush_deferred:
            self._flush_deferred = True
            self._defer(self.flush)

    def hold_event(self, address: Address, turn_id: str, event: dict[str, Any]) -> None:
        """Queue a turn's event that may wait for the next one, within the hold
        (``tool_start``, ``tool_update``): a call that ends soon sends its start
        with its end, one frame where there were two."""
        pending = self._pending.get(address)
        if pending is None:
            self._pending[address] = [(turn_id, event)]
        else:
            pending.append((turn_id, event))
        if not (self._flush_deferred or self._held):
            self._hold_flush()

    def _hold_flush(self) -> None:
        if self._hold is None:  # no hold: at the next turn of the loop, as the rest
            self._flush_deferred = True
            self._defer(self.flush)
        else:
            self._held = self._hold(self._held_over)

    def _held_over(self) -> None:
        self._held = None
        self.flush()

    def flush(self) -> None:
        """Send every client's waiting events: one frame per client and turn."""
        self._flush_deferred = False
        if self._held is not None:
            # What was held leaves now: its timer goes, so the loop is not woken for it.
            self._held.cancel()
            self._held = None
        for address in list(self._leading):
            if address not in self._pending:
                self._flush_one(address)
        for address in list(self._pending):
            self._flush_one(address)

    def _flush_one(self, address: Address) -> None:
        leading = self._leading.pop(address, None)
        events = self._pending.pop(address, None)
        client = self.table.get(address)
        if client is None:
            return  # gone, or let go: nobody reads these
        frames = leading or []
        if events:
            batch: list[dict[str, Any]] = []
            last = len(events) - 1
            for i, (turn_id, event) in enumerate(events):
                batch.append(event)
                if i == last or events[i + 1][0] != turn_id:
                    self._event_frames(turn_id, batch, frames)
                    batch = []
        if len(frames) == 1 or any(len(f) > CHUNK_BYTES for f in frames):
            for frame in frames:  # a large one leaves as chunks, nothing in between
                self._out(address, frame)
        elif frames:
            client.outbox.push_together(frames, lambda parts: self._raw(address, *parts))
            client.hold.set(client.outbox.held)

    def _event_frames(self, turn_id: str, events: list[dict[str, Any]], out: list[bytes]) -> None:
        """One frame, or halves when the batch would pass a chunk (many large results
        that ended in one turn of the loop); one large event is one frame, which
        leaves as chunks."""
        frame = encode(TurnEvent(turn_id, events))
        if len(frame) <= CHUNK_BYTES or len(events) == 1:
            out.append(frame)
            return
        half = len(events) // 2
        self._event_frames(turn_id, events[:half], out)
        self._event_frames(turn_id, events[half:], out)

    def _out(self, address: Address, frame: bytes) -> None:
        """Through the client's outbox, in chunks when large; straight out to an
        address that has not said hello (errors only)."""
        client = self.table.get(address)
        if client is None:
            self._raw(address, frame)
            return
        try:
            if len(frame) <= CHUNK_BYTES:
                client.outbox.push(frame)
            else:
                for part in chunked(frame, next(self._streams)):
                    client.outbox.push(part)
        except OSError as exc:  # the spill file cannot take it (disk full…): no silent loss
            log.error("cannot keep what waits for client %s: %s", client.name, exc)
            self.disconnect(client, f"the daemon could not keep what waits for it ({exc})")
            return
        client.hold.set(client.outbox.held)

    def _raw(self, address: Address, *frames: bytes) -> None:
        """One message of ``frames`` to ``address``, now."""
        try:
            self._transport.send(address, list(frames))
        except ClientGone as exc:
            log.info("client gone (%s)", exc, extra={"client": address[1].hex()})
            self._on_gone(address)

    # -- acknowledgements, pings, stalls (L5) ------------------------------------------------

    def acknowledged(self, address: Address, received: int) -> None:
        client = self.table.get(address)
        if client is not None:
            client.outbox.ack(received)
            client.hold.set(client.outbox.held)

    def ping(self, stall_seconds: float, now: float | None = None) -> None:
        """Find clients that went away without a Bye (a send to them fails), and let
        go of those stalled for longer than ``stall_seconds`` (L5)."""
        now = time.monotonic() if now is None else now
        for address, client in list(self.table.items()):
            stalled = client.outbox.stalled(now)
            if stalled > stall_seconds:
                self._let_go(client, stalled)
            elif not client.outbox.held:  # a held client hears nothing new anyway
                self.send(address, Ping())

    def _let_go(self, client: ClientState, stalled: float) -> None:
        """A client that has not read for too long: its turns are aborted, its
        sessions closed, what waits for it dropped; it is told, after what it has."""
        outbox = client.outbox
        log.warning(
            "client %s stalled: it read nothing for %.0f s with %d bytes unread and %d "
            "waiting on disk; its turns are aborted and it is disconnected",
            client.name,
            stalled,
            outbox.in_flight,
            outbox.spilled,
            extra={"client": client.address[1].hex()},
        )
        self.disconnect(
            client,
            f"it read nothing for {stalled:.0f} s (client_stall_seconds) with its buffer full",
        )

    def disconnect(self, client: ClientState, why: str) -> None:
        """Forget the client (``on_gone``: its turns aborted, its sessions closed) and
        tell it so, after what is already on its way."""
        self._on_gone(client.address)
        reason = f"the daemon disconnected this client: {why}; its turns were aborted"
        self._raw(client.address, encode(Error(None, FailureCode.DISCONNECTED, reason)))

    def close(self) -> None:
        """The last events out; every outbox closed."""
        self.flush()
        for client in self.table.values():
            client.outbox.close()
