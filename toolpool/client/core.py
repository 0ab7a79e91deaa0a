"""The client's data, without I/O: where the daemon is, a turn's log, an approval
request, and what a call looks like on the wire. ``connection`` builds on these."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.client.errors import DaemonUnavailable, UntrustedEndpoint
from toolpool.models import Event, ToolCall, ToolResult
from toolpool.protocol import ApprovalReply, ApprovalRequest, EventReader
from toolpool.runtime import RuntimeDirError, read_trusted_endpoint, runtime_dir
from toolpool.tracing import TurnTracer


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str


def resolve_endpoint(endpoint: str | None, directory: str | Path | None) -> Endpoint:
    """An explicit endpoint, else ``$TOOLPOOL_ENDPOINT``, else the running daemon's
    ipc socket from its endpoint file in the runtime directory. What it finds there is
    checked first (SPEC X10): the directory, the endpoint file and the socket must be
    the user's own and writable by no one else, else ``UntrustedEndpoint``, before
    any connection. An explicit endpoint is the caller's choice and is not checked."""
    if endpoint:
        return Endpoint(endpoint)
    if os.environ.get("TOOLPOOL_ENDPOINT"):
        return Endpoint(os.environ["TOOLPOOL_ENDPOINT"])
    where = Path(directory) if directory else runtime_dir()
    try:
        info = read_trusted_endpoint(where)
    except RuntimeDirError as exc:
        raise UntrustedEndpoint(str(exc)) from None
    if info is None or not isinstance(info.get("ipc"), str):
        raise DaemonUnavailable(
            f"no toolpool daemon runs for this user (no endpoint file in {where}); "
            "start one with: toolpool daemon start"
        )
    return Endpoint(str(info["ipc"]))


class Sent:
    """What ``approve()`` and ``deny()`` return: the answer is on its way already.
    Awaiting it is optional and returns at once."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


@dataclass(eq=False)
class ApprovalRequested:
    """The daemon's gate asks whether a call may run (SPEC P8, ``kind`` "call"), or
    a policy session's proxy whether a connection no rule names may go through
    (N6, ``kind`` "network": ``host``, ``port``, and ``call`` the call whose command
    opened it). Answer with ``approve()`` or ``deny(reason)`` — for a network
    question, ``scope="session"`` makes the answer hold for the session's later
    connections to that host and port too; no answer in ``timeout`` seconds is a
    denial.

    A call's question appears among its turn's events (after the call's
    ``tool_start`` and preview), unless the session has an ``on_approval`` handler
    that answered it. A network question goes to the handler (which may also return
    ``"session"``: allowed for the session); a session without a handler denies it at
    once, saying so. The answer leaves on the call itself, in both clients (``await``
    is optional); the first answer counts, later ones are ignored.
    """

    request: ApprovalRequest
    _answer: Callable[[ApprovalReply], None] = field(repr=False)
    answered: bool = False

    type = "approval_request"

    @property
    def call(self) -> ToolCall:
        return ToolCall.from_dict(self.request.call)

    @property
    def label(self) -> str:
        return self.request.label

    @property
    def preview(self) -> Any:
        return self.request.preview

    @property
    def preview_truncated(self) -> bool:
        """Whether the preview was cut at its cap (its text ends saying so)."""
        return self.request.preview_truncated

    @property
    def kind(self) -> str:
        """``"call"`` (the gate, P8) or ``"network"`` (a connection, N6)."""
        return self.request.kind

    @property
    def host(self) -> str:
        """A network question's host, as the command asked for it ("" for a call's)."""
        return self.request.host

    @property
    def port(self) -> int:
        return self.request.port

    def approve(self, scope: str = "") -> Sent:
        """Allow; ``scope="session"``: a network question's later ones too."""
        return self._reply(True, "", _scope(scope))

    def deny(self, reason: str = "", scope: str = "") -> Sent:
        """Refuse, saying ``reason``; ``scope="session"``: a network question's later
        ones too."""
        return self._reply(False, reason, _scope(scope))

    def _reply(self, allowed: bool, reason: str, scope: str = "") -> Sent:
        if not self.answered:
            self._answer(ApprovalReply(self.request.approval_id, allowed, reason, scope))
            self.answered = True
        return Sent()


def _scope(scope: str) -> str:
    if scope not in ("", "session"):
        raise ValueError(f'scope must be "" or "session", not {scope!r}')
    return scope


TurnItem = Event | ApprovalRequested


FORGET_BATCH = 256  # followed items are let go of this many at a time


@dataclass(eq=False, slots=True)
class TurnLog:
    """Everything that arrived for one turn, in order; ``results`` once it ended.

    ``items[0]`` is item number ``first``: a turn that is followed (``follow()``)
    lets go of the items it has passed, so an open turn that lives for hours holds
    only what has not been read yet. ``reader`` rebuilds its events from their wire
    form (those of the turn's selection)."""

    turn_id: str
    call_ids: list[str]
    reader: EventReader = field(default_factory=EventReader)
    items: list[TurnItem] = field(default_factory=list)
    results: tuple[ToolResult, ...] | None = None
    custom_calls: frozenset[str] = frozenset()  # Responses custom tool calls, by call id
    first: int = 0
    tracer: TurnTracer | None = None  # its OpenTelemetry spans, when they are recorded

    @property
    def ended(self) -> dict[str, ToolResult]:
        """The results of the calls that ended, by call id."""
        return self.reader.results

    @property
    def count(self) -> int:
        """How many items arrived, kept or not."""
        return self.first + len(self.items)

    def item(self, index: int) -> TurnItem:
        return self.items[index - self.first]

    def forget_before(self, index: int) -> None:
        """Let go of the items before ``index`` (in batches: amortised O(1))."""
        drop = index - self.first
        if drop >= FORGET_BATCH:
            del self.items[:drop]
            self.first = index

    def add(self, item: ApprovalRequested) -> None:
        """An approval request joins the turn's items."""
        self.items.append(item)

    def read(self, events: list[dict[str, Any]]) -> None:
        """The events of one ``TurnEvent``, rebuilt, join the turn's items (ValueError,
        KeyError or TypeError for one that cannot be rebuilt)."""
        read = self.reader.read_all(events)
        if self.tracer is not None:
            self.tracer.on_events(read)
        self.items += read
        self.results = self.reader.turn_results


def call_payload(calls: Any, format: str | None) -> tuple[Any, str | None]:
    """What goes on the wire for ``calls``: ToolCalls or their dicts (toolpool's
    format), or model output in ``format`` ("openai", "openai-responses",
    "anthropic", "gemini"); with ``format=None`` and something else than ToolCalls,
    the daemon detects the format. Model output may be the provider SDKs' own
    objects: they go as their JSON dump (SPEC E1)."""
    if isinstance(calls, ToolCall):
        calls = [calls]
    if format in (None, "toolpool"):
        if type(calls) is list:  # the common case, ToolCalls, without an ABC's isinstance
            payload = [c.to_dict() for c in calls if type(c) is ToolCall]
            if len(payload) == len(calls):
                return payload, "toolpool"
        if _is_toolpool_calls(calls):
            return [c.to_dict() if isinstance(c, ToolCall) else dict(c) for c in calls], "toolpool"
    from toolpool.providers.payload import plain

    return plain(calls), format


def _is_toolpool_calls(calls: Any) -> bool:
    if not isinstance(calls, Sequence) or isinstance(calls, str | bytes):
        return False
    # A dict with any other key is not toolpool's (an Anthropic ``tool_use`` block, a
    # Responses ``function_call`` item…): the daemon detects its format, or refuses it.
    return all(
        isinstance(c, ToolCall)
        or (isinstance(c, Mapping) and {"id", "name"} <= c.keys() <= _TOOLPOOL_CALL_KEYS)
        for c in calls
    )


_TOOLPOOL_CALL_KEYS = frozenset({"id", "name", "arguments", "arguments_error"})


def results_as(
    results: Iterable[ToolResult], format: str, custom_calls: frozenset[str] = frozenset()
) -> Any:
    """A turn's results in a provider's shape (toolpool.providers); ``custom_calls``
    are the ids of the turn's Responses ``custom_tool_call``s, which are answered by
    ``custom_tool_call_output`` items."""
    from toolpool.providers import results_to_openai_responses, results_to_provider

    if format == "openai-responses":
        return results_to_openai_responses(results, custom_calls)
    return results_to_provider(results, format)


def custom_calls_of(payload: Any, format: str | None) -> frozenset[str]:
    """The ids of the Responses ``custom_tool_call``s in what a turn was sent."""
    if format == "toolpool":
        return frozenset()  # ToolCalls: none is a Responses item
    if type(payload) is not list and not isinstance(payload, Mapping):
        return frozenset()
    from toolpool.providers.openai_responses import custom_call_ids

    return custom_call_ids(payload)


def decision(value: Any) -> tuple[bool, str, str]:
    """What an ``on_approval`` handler returned — True/False, (allowed, reason), or
    ``"session"`` (allowed, and for the session's later connections to that host
    and port: N6) — as (allowed, reason, scope)."""
    if isinstance(value, tuple):
        allowed, reason = value
        return bool(allowed), str(reason), ""
    if value == "session":
        return True, "", "session"
    return bool(value), "", ""


__all__ = [
    "ApprovalRequested",
    "Endpoint",
    "Sent",
    "TurnItem",
    "TurnLog",
    "call_payload",
    "custom_calls_of",
    "decision",
    "resolve_endpoint",
    "results_as",
]
