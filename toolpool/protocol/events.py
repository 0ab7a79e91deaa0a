"""A turn's events as they cross the wire: each result once (SPEC L2).

A call's result travels in its ``tool_end``. ``message_start`` and ``message_end``
carry the call id of the result they present, and ``turn_end`` the call ids of the
turn's results in call order; the receiver (``EventReader``) rebuilds the full
events from the results it has seen. Every other event travels as ``to_dict()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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


def event_to_wire(event: Event) -> dict[str, Any]:
    """``event`` in its wire form."""
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
    ``events`` is the turn's selection: what it does not hold is passed over."""

    def __init__(self, events: EventSelection = EventSelection.ALL) -> None:
        self._results: dict[str, ToolResult] = {}
        # A result's message, built once for its message_start and message_end.
        self._messages: dict[str, ToolMessage] = {}
        self._wanted = None if events is _ALL else RESULT_EVENTS

    def read_all(self, events: Iterable[Mapping[str, Any]]) -> list[Event]:
        """The events of one ``TurnEvent``, in order, those selected."""
        wanted = self._wanted
        return [self.read(e) for e in events if wanted is None or e.get("type") in wanted]

    def read(self, data: Mapping[str, Any]) -> Event:
        kind = data.get("type")
        if kind == _TOOL_END:
            event = event_from_dict(data)
            assert isinstance(event, ToolEnd)
            if event.call_id in self._results:
                raise ValueError(f"a second tool_end for call {event.call_id!r}")
            self._results[event.call_id] = event.result
            return event
        if kind == _MESSAGE_START:
            return MessageStart(self._message(data.get("call_id")))
        if kind == _MESSAGE_END:
            return MessageEnd(self._message(data.get("call_id")))
        if kind == _TURN_END:
            ids = data.get("call_ids")
            if not isinstance(ids, list):
                raise ValueError("turn_end without its call ids")
            return TurnEnd(tuple([self._result(i) for i in ids]))
        return event_from_dict(data)

    def _message(self, call_id: object) -> ToolMessage:
        if isinstance(call_id, str) and call_id in self._messages:
            return self._messages[call_id]
        message = ToolMessage.from_result(self._result(call_id))
        self._messages[str(call_id)] = message
        return message

    def _result(self, call_id: object) -> ToolResult:
        if not isinstance(call_id, str) or call_id not in self._results:
            raise ValueError(f"an event names call {call_id!r}, whose tool_end did not arrive")
        return self._results[call_id]
