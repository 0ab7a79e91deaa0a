"""A turn's events as they cross the wire: each result once (SPEC L2).

A call's result travels in its ``tool_end``; ``turn_end`` carries the call ids of the
turn's results in call order. Every other event travels as ``to_dict()``, but the
message events: a turn's ``message_start`` and ``message_end`` of each result, in
call order right before ``turn_end``, carry nothing the receiver does not have
already, so they need not travel at all. The receiver (``EventReader``) rebuilds the
full events from the results it has seen, the message events too when none came.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from toolpool.frozen import maker
from toolpool.models import (
    Event,
    EventType,
    MessageEnd,
    MessageStart,
    ToolEnd,
    ToolMessage,
    ToolResult,
    TurnEnd,
    event_from_dict,
)
from toolpool.protocol.client import EventSelection

# The type strings, looked up once (an enum member's attribute costs more than a read).
_TOOL_END = EventType.TOOL_END.value
_MESSAGE_START = EventType.MESSAGE_START.value
_MESSAGE_END = EventType.MESSAGE_END.value
_TURN_END = EventType.TURN_END.value
_ALL = EventSelection.ALL
# The events of a turn submitted with ``events="results"``; a daemon that sends every
# event anyway (it predates the selection) is read the same way.
RESULT_EVENTS = frozenset({_TOOL_END, _TURN_END})
# Made from their one field, without a frozen dataclass's __init__ (frozen.maker).
_message_start, _message_end, _turn_end = maker(MessageStart), maker(MessageEnd), maker(TurnEnd)


def event_to_wire(event: Event) -> dict[str, Any]:
    """``event`` in its wire form (a message event's, for a peer that sends them:
    the call id of its result)."""
    match event:
        case MessageStart() | MessageEnd():
            return {"type": event.type.value, "call_id": event.message.tool_call_id}
        case TurnEnd():
            return {"type": event.type.value, "call_ids": [r.call_id for r in event.results]}
        case _:
            return event.to_dict()


class EventReader:
    """Rebuilds one turn's events from their wire form; remembers each call's result
    from its ``tool_end``. A reference to a result it has not seen is a ValueError.
    ``events`` is the turn's selection: what it does not hold is passed over.

    A turn of every event gets its message events whether the peer sent them or
    not: at ``turn_end``, a reader that read none yields a ``message_start`` and a
    ``message_end`` per result, in call order, right before it — the events the
    engine emits there (one ``ToolMessage`` per result, shared by the pair)."""

    def __init__(self, events: EventSelection = EventSelection.ALL) -> None:
        self.results: dict[str, ToolResult] = {}  # by call id, as their tool_end came
        self.turn_results: tuple[ToolResult, ...] | None = None  # once turn_end came
        # A result's message, built once for its message_start and message_end.
        self._messages: dict[str, ToolMessage] = {}
        self._wanted = None if events is _ALL else RESULT_EVENTS
        self._rebuild = events is _ALL  # until the peer sends a message event itself

    def read_all(self, events: Iterable[Mapping[str, Any]]) -> list[Event]:
        """The events of one ``TurnEvent``, in order, those selected."""
        read: list[Event] = []
        wanted = self._wanted
        for data in events:
            kind = data.get("type")
            if wanted is not None and kind not in wanted:
                continue
            # Four cases: a result arrives; the turn ends (its message events first,
            # when they are rebuilt here); a message event the peer sent; the rest.
            if kind == _TOOL_END:
                end = ToolEnd.from_dict(data)
                if end.call_id in self.results:
                    raise ValueError(f"a second tool_end for call {end.call_id!r}")
                self.results[end.call_id] = end.result
                read.append(end)
            elif kind == _TURN_END:
                results = self._turn_results(data.get("call_ids"))
                if self._rebuild:
                    for result in results:
                        message = ToolMessage.from_result(result)
                        read.append(_message_start(message))
                        read.append(_message_end(message))
                read.append(_turn_end(results))
                self.turn_results = results
            elif kind == _MESSAGE_START:
                self._rebuild = False
                read.append(_message_start(self._message(data.get("call_id"))))
            elif kind == _MESSAGE_END:
                self._rebuild = False
                read.append(_message_end(self._message(data.get("call_id"))))
            else:
                read.append(event_from_dict(data))
        return read

    def _turn_results(self, ids: object) -> tuple[ToolResult, ...]:
        if not isinstance(ids, list):
            raise ValueError("turn_end without its call ids")
        results = self.results
        try:
            return tuple(map(results.__getitem__, ids))
        except (KeyError, TypeError):  # an id it has no result of, or not even a string
            missing = next(i for i in ids if not isinstance(i, str) or i not in results)
        raise _unknown(missing)

    def _message(self, call_id: object) -> ToolMessage:
        if isinstance(call_id, str):
            message = self._messages.get(call_id)
            if message is not None:
                return message
            result = self.results.get(call_id)
            if result is not None:
                message = self._messages[call_id] = ToolMessage.from_result(result)
                return message
        raise _unknown(call_id)


def _unknown(call_id: object) -> ValueError:
    return ValueError(f"an event names call {call_id!r}, whose tool_end did not arrive")
