"""A turn's events as they cross the wire: each result once (SPEC L2).

A call's result travels in its ``tool_end``. ``message_start`` and ``message_end``
carry the call id of the result they present, and ``turn_end`` the call ids of the
turn's results in call order; the receiver (``EventReader``) rebuilds the full
events from the results it has seen. Every other event travels as ``to_dict()``.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    from its ``tool_end``. A reference to a result it has not seen is a ValueError."""

    def __init__(self) -> None:
        self._results: dict[str, ToolResult] = {}

    def read(self, data: Mapping[str, Any]) -> Event:
        kind = data.get("type")
        if kind in (EventType.MESSAGE_START, EventType.MESSAGE_END):
            message = ToolMessage.from_result(self._result(data.get("call_id")))
            return MessageStart(message) if kind == EventType.MESSAGE_START else MessageEnd(message)
        if kind == EventType.TURN_END:
            ids = data.get("call_ids")
            if not isinstance(ids, list):
                raise ValueError("turn_end without its call ids")
            return TurnEnd(tuple(self._result(i) for i in ids))
        event = event_from_dict(data)
        if isinstance(event, ToolEnd):
            if event.call_id in self._results:
                raise ValueError(f"a second tool_end for call {event.call_id!r}")
            self._results[event.call_id] = event.result
        return event

    def _result(self, call_id: object) -> ToolResult:
        if not isinstance(call_id, str) or call_id not in self._results:
            raise ValueError(f"an event names call {call_id!r}, whose tool_end did not arrive")
        return self._results[call_id]
