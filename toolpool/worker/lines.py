"""What a worker's lines carry, apart from the sockets (``toolpool.worker.channel``):
the messages of a ZeroMQ message's parts, the progress that leaves joined, and the
timeout of the idle receive."""

from __future__ import annotations

import logging

from toolpool.protocol import Message, Progress, ProtocolError, decode

log = logging.getLogger(__name__)

# The most text one Progress carries when text progress waiting together is joined.
PROGRESS_TEXT = 64 * 1024


def coalesced(messages: list[Message | bytes]) -> list[Message | bytes]:
    """``messages`` as they go out: a run of text progress of one call made of whole
    lines (what a tool prints, line by line) as one ``Progress`` of their text
    joined, up to ``PROGRESS_TEXT`` characters; the rest (messages, or frames encoded
    already) as they are, in order. Nothing is lost, and no report runs into another:
    a text that does not end a line ("step 2") goes alone. A tool that prints in a
    tight loop costs the coordinator one event per flush, not one per line."""
    out: list[Message | bytes] = []
    run: list[str] = []  # the text of the run being joined
    run_of, size = "", 0  # its call, its length

    def end_run() -> None:
        if run:
            out.append(Progress(run_of, run[0] if len(run) == 1 else "".join(run)))
            run.clear()

    for message in messages:
        if type(message) is Progress and type(message.data) is str:
            text = message.data
            whole = text.endswith("\n")
            if run and (
                message.call_id != run_of
                or size + len(text) > PROGRESS_TEXT
                or not (whole and run[-1].endswith("\n"))
            ):
                end_run()
            if not run:
                run_of, size = message.call_id, 0
            run.append(text)
            size += len(text)
        else:
            end_run()
            out.append(message)
    end_run()
    return out


def receive_timeout_ms(wait: float) -> int:
    """A receive timeout of at most ``wait`` seconds (never past the heartbeat due
    then), in whole milliseconds: above a tenth of a second, rounded down to one, so
    that it stays the same from one call to the next — a receive that gives up early
    only looks again."""
    ms = int(max(0.0, wait) * 1000) + 1
    return ms if ms <= 100 else ms // 100 * 100


def decoded(parts: list[bytes]) -> list[Message]:
    """The messages of a ZeroMQ message's parts, in order; a part that is not one is
    dropped (logged)."""
    messages = []
    for part in parts:
        try:
            messages.append(decode(part))
        except ProtocolError as exc:
            log.error("dropped a bad frame from the coordinator: %s", exc)
    return messages
