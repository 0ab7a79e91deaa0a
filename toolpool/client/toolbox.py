"""A session as a framework's tools (SPEC A2): what every integration needs, once.

An agent framework calls tools one at a time, by name, with the model's arguments,
often several at once, and sometimes cancels one. A toolbox turns that into one
toolpool session with one open turn for its whole life: each ``call`` is appended
to the turn (so the session's read register, breaker, gate, profile and the turn's
scheduling hold across the framework's calls) and answered with its result; one
router follows the turn and hands each call its progress reports and its result;
the gate's questions go to the call's own ``on_approval`` (an adapter routes them to
its framework's approval mechanism), else the toolbox's, else they are denied with
a reason the model reads. A call whose caller is cancelled is cancelled in the
daemon as an interrupt cancels it (its worker gets SIGTERM; queued, it never starts).

``AsyncToolbox`` is for frameworks that run tools on an event loop (it drives an
``AsyncClient``); ``Toolbox`` for those that call from threads (a ``Client``: one
thread follows the turn, any number of threads call, SPEC A1). ``toolpool mcp
serve`` is an ``AsyncToolbox`` behind an MCP server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.client.aio import AsyncClient, AsyncSession, AsyncTurn
from toolpool.client.base import SessionBase
from toolpool.client.core import ApprovalRequested, TurnItem
from toolpool.client.errors import ClientError, ClientProtocolError
from toolpool.client.sync import Client, Session, Turn
from toolpool.models import ToolCall, ToolEnd, ToolResult, ToolUpdate, UpdateKind

ProgressHandler = Callable[[Any], Any]  # a call's progress report (P9): text or data
ApprovalAnswer = Any  # True, False, (allowed, reason), or an awaitable of one
ApprovalHandler = Callable[[ApprovalRequested], ApprovalAnswer]
NOBODY_ASKED = "The gate asked for approval and nobody was there to give it."


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A tool the session offers: what a framework shows its model. ``read_only``
    is the tool's answer for no particular arguments (``readOnlyHint``)."""

    name: str
    description: str
    schema: dict[str, Any]
    read_only: bool = False
    title: str = ""

    @classmethod
    def from_mcp(cls, data: dict[str, Any]) -> ToolDefinition:
        hints = data.get("annotations") or {}
        return cls(
            data["name"],
            data.get("description") or "",
            dict(data.get("inputSchema") or {"type": "object"}),
            bool(hints.get("readOnlyHint", False)),
            data.get("title") or data["name"],
        )


def _shipped(session: SessionBase[Any] | None) -> list[ToolDefinition]:
    """The tools the session's client shipped with it (SPEC A5), as definitions."""
    if session is None:
        return []
    return [
        ToolDefinition(t.name, t.description, dict(t.schema), t.read_only, t.label)
        for t in session.shipped_tools
    ]


def gate_asks(options: dict[str, Any], tool: ToolDefinition) -> bool:
    """Whether the session's gate (its ``gate`` and ``policy`` options) would put a
    call of ``tool`` to the client, judged here as the daemon judges it (P8): "ask"
    asks about every tool that is not read-only, "policy" follows the first rule
    that matches (none: ask). For frameworks that decide on approval before a tool
    runs; a rule by permission is not matched here (a definition carries none), so
    the daemon may still ask, and the toolbox's ``on_approval`` then answers."""
    from toolpool.policy import Action, parse_policy

    gate = str(options.get("gate", "allow"))
    if gate == "ask":
        return not tool.read_only
    if gate != "policy":
        return False
    asked = _Asked(tool.name, tool.read_only)
    for rule in parse_policy(options.get("policy") or ()):
        if rule.matches(asked):
            return rule.action is Action.ASK
    return True


@dataclass(frozen=True, slots=True)
class _Asked:
    """A call of a tool as a policy rule reads it (``toolpool.policy``)."""

    tool_name: str
    read_only: bool
    permissions: tuple[str, ...] = ()


@dataclass(slots=True)
class _Route:
    """Where one call's progress, approval question and result go."""

    on_progress: ProgressHandler | None
    on_approval: ApprovalHandler | None
    result: Any = None  # an asyncio or a concurrent Future of the ToolResult


@dataclass(slots=True)
class _Routes:
    """The calls under way, by call id, and what a turn item means for them: the
    sans-IO part of both toolboxes."""

    on_progress: Callable[[str, Any], Any] | None
    on_approval: ApprovalHandler | None
    calls: dict[str, _Route] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self.ids)}"

    def filed(self, item: TurnItem) -> tuple[_Route, Any] | None:
        """What ``item`` asks of a route: (its route, a progress report) or (its
        route, its result); None when it is no business of a call under way."""
        if isinstance(item, ToolUpdate) and item.kind is UpdateKind.PROGRESS:
            route = self.calls.get(item.call_id)
            if route is not None:
                return route, _Progress(item.call_id, item.data)
        elif isinstance(item, ToolEnd):
            route = self.calls.pop(item.call_id, None)
            if route is not None:
                return route, item.result
        return None

    def progress(self, route: _Route, report: _Progress) -> Any:
        if route.on_progress is not None:
            return route.on_progress(report.data)
        if self.on_progress is not None:
            return self.on_progress(report.call_id, report.data)
        return None

    def handler(self, request: ApprovalRequested) -> ApprovalHandler | None:
        route = self.calls.get(request.call.id)
        if route is not None and route.on_approval is not None:
            return route.on_approval
        return self.on_approval


@dataclass(frozen=True, slots=True)
class _Progress:
    call_id: str
    data: Any


class AsyncToolbox:
    """One session of ``client``'s daemon on ``workspace``, as tools (see the module).
    ``options`` are the session's (``toolpool.session_options.SessionOptions``,
    docs/sessions.md; checked as the session opens); ``on_approval(request)``
    answers the gate's questions no call answers itself; ``on_progress(call_id,
    data)`` gets the progress of calls that have no handler of their own. An async
    context manager, or ``await open()`` / ``await close()``."""

    def __init__(
        self,
        client: AsyncClient,
        workspace: str | Path = ".",
        *,
        on_approval: ApprovalHandler | None = None,
        on_progress: Callable[[str, Any], Any] | None = None,
        call_ids: str = "call",
        **options: Any,
    ) -> None:
        self.client = client
        self.workspace = workspace
        self.options = options
        self._routes = _Routes(on_progress, on_approval)
        self._prefix = call_ids
        self.session: AsyncSession | None = None
        self.turn: AsyncTurn | None = None
        self._router: asyncio.Task[None] | None = None
        self._cancels: set[asyncio.Task[None]] = set()
        self._definitions: list[ToolDefinition] | None = None

    async def __aenter__(self) -> AsyncToolbox:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the session and its turn; start following it."""
        self.session = await self.client.session(
            self.workspace, on_approval=self._approval, **self.options
        )
        self.turn = await self.session.submit([], open=True)
        self._router = asyncio.ensure_future(self._route(self.turn))

    async def definitions(self) -> list[ToolDefinition]:
        """The tools the session is offered (its profile's, and those it shipped:
        ``tools=[…]``, SPEC A5), asked once."""
        if self._definitions is None:
            profile = self.options.get("tool_profile", "toolpool")
            listed = await self.client.tools("mcp", profile)
            self._definitions = [ToolDefinition.from_mcp(d) for d in listed]
            self._definitions += _shipped(self.session)
        return list(self._definitions)

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None = None,
        on_progress: ProgressHandler | None = None,
        on_approval: ApprovalHandler | None = None,
    ) -> ToolResult:
        """Run one call in the session's turn; its result (a failure is a result).
        Cancelling the caller cancels the call in the daemon."""
        turn = self._open_turn()
        call_id = call_id or self._routes.new_id(self._prefix)
        route = _Route(on_progress, on_approval, asyncio.get_running_loop().create_future())
        self._routes.calls[call_id] = route  # before the call exists: no event unclaimed
        try:
            await turn.add([ToolCall(call_id, name, arguments)])
            result: ToolResult = await route.result
        except BaseException:
            if call_id in self._routes.calls:  # not ended: stop it in the daemon
                self._routes.calls.pop(call_id, None)
                self._cancel(turn, call_id)
            raise
        return result

    def _cancel(self, turn: AsyncTurn, call_id: str) -> None:
        """A task of its own: the caller's task is being cancelled, and an await in it
        would be cancelled too (anyio cancels again at every await)."""

        async def cancel() -> None:
            with contextlib.suppress(ClientError):
                await turn.cancel(call_id)

        task = asyncio.ensure_future(cancel())
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    def _open_turn(self) -> AsyncTurn:
        if self.turn is None:
            raise ClientError("the toolbox is not open (use it with async with, or open())")
        return self.turn

    async def _approval(self, request: ApprovalRequested) -> ApprovalAnswer:
        handler = self._routes.handler(request)
        if handler is None:
            return False, NOBODY_ASKED
        answer = handler(request)
        return await answer if inspect.isawaitable(answer) else answer

    async def _route(self, turn: AsyncTurn) -> None:
        """Hand each call its progress and its result, in the turn's order."""
        try:
            async for item in turn.follow():  # the turn may live for hours
                filed = self._routes.filed(item)
                if filed is None:
                    continue
                route, what = filed
                if isinstance(what, _Progress):
                    reported = self._routes.progress(route, what)
                    if inspect.isawaitable(reported):
                        await reported
                elif not route.result.done():
                    route.result.set_result(what)
        except ClientError as exc:
            failure: BaseException = exc
        else:
            failure = ClientProtocolError("the toolbox's turn ended")
        for route in self._routes.calls.values():  # nothing more will come for them
            if not route.result.done():
                route.result.set_exception(failure)
        self._routes.calls.clear()

    async def close(self) -> None:
        """End the turn (after its calls) and the session."""
        turn, self.turn = self.turn, None
        if turn is not None:
            with contextlib.suppress(ClientError):
                await turn.close()
        if self._cancels:
            await asyncio.gather(*self._cancels, return_exceptions=True)
        if self._router is not None:
            with contextlib.suppress(ClientError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._router), 30)
            self._router.cancel()
        if self.session is not None:
            await self.session.close()
            self.session = None


class Toolbox:
    """``AsyncToolbox`` for frameworks that call tools from threads, over a blocking
    ``Client``: a thread follows the turn; ``call`` may come from any thread and
    waits for its result (``timeout``: None, no limit). A context manager."""

    def __init__(
        self,
        client: Client,
        workspace: str | Path = ".",
        *,
        on_approval: ApprovalHandler | None = None,
        on_progress: Callable[[str, Any], Any] | None = None,
        call_ids: str = "call",
        **options: Any,
    ) -> None:
        self.client = client
        self.workspace = workspace
        self.options = options
        self._routes = _Routes(on_progress, on_approval)
        self._prefix = call_ids
        self._lock = threading.Lock()  # the routes, between callers and the follower
        self.session: Session | None = None
        self.turn: Turn | None = None
        self._router: threading.Thread | None = None
        self._definitions: list[ToolDefinition] | None = None

    def __enter__(self) -> Toolbox:
        self.open()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def open(self) -> None:
        self.session = self.client.session(
            self.workspace, on_approval=self._approval, **self.options
        )
        self.turn = self.session.submit([], open=True)
        self._router = threading.Thread(
            target=self._route, args=(self.turn,), name="toolpool toolbox", daemon=True
        )
        self._router.start()

    def definitions(self) -> list[ToolDefinition]:
        if self._definitions is None:
            profile = self.options.get("tool_profile", "toolpool")
            listed = self.client.tools("mcp", profile)
            self._definitions = [ToolDefinition.from_mcp(d) for d in listed]
            self._definitions += _shipped(self.session)
        return list(self._definitions)

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None = None,
        on_progress: ProgressHandler | None = None,
        on_approval: ApprovalHandler | None = None,
        timeout: float | None = None,
    ) -> ToolResult:
        """As ``AsyncToolbox.call``, blocking; a ``timeout`` that passes cancels the
        call and raises ``ClientTimeout``."""
        turn = self.turn
        if turn is None:
            raise ClientError("the toolbox is not open (use it with with, or open())")
        future: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
        with self._lock:
            call_id = call_id or self._routes.new_id(self._prefix)
            self._routes.calls[call_id] = _Route(on_progress, on_approval, future)
        try:
            turn.add([ToolCall(call_id, name, arguments)])
            return future.result(timeout)
        except BaseException as exc:
            with self._lock:
                running = self._routes.calls.pop(call_id, None) is not None
            if running:
                with contextlib.suppress(ClientError):
                    turn.cancel(call_id)
            if isinstance(exc, concurrent.futures.TimeoutError):
                from toolpool.client.errors import ClientTimeout

                raise ClientTimeout(f"call {call_id} did not end within {timeout:g} s") from None
            raise

    def cancel(self, call_id: str) -> None:
        """Stop a call under way (running: its worker gets SIGTERM; queued: never runs)."""
        if self.turn is not None:
            self.turn.cancel(call_id)

    def _approval(self, request: ApprovalRequested) -> ApprovalAnswer:
        with self._lock:
            handler = self._routes.handler(request)
        return (False, NOBODY_ASKED) if handler is None else handler(request)

    def _route(self, turn: Turn) -> None:
        failure: BaseException
        try:
            for item in turn.follow():
                with self._lock:
                    filed = self._routes.filed(item)
                if filed is None:
                    continue
                route, what = filed
                if isinstance(what, _Progress):
                    self._routes.progress(route, what)
                elif not route.result.done():
                    route.result.set_result(what)
        except ClientError as exc:
            failure = exc
        else:
            failure = ClientProtocolError("the toolbox's turn ended")
        with self._lock:
            routes, self._routes.calls = list(self._routes.calls.values()), {}
        for route in routes:
            if not route.result.done():
                route.result.set_exception(failure)

    def close(self) -> None:
        turn, self.turn = self.turn, None
        if turn is not None:
            with contextlib.suppress(ClientError):
                turn.close()
        if self._router is not None:
            self._router.join(30)
        if self.session is not None:
            self.session.close()
            self.session = None


__all__ = [
    "ApprovalHandler",
    "AsyncToolbox",
    "ProgressHandler",
    "ToolDefinition",
    "Toolbox",
    "gate_asks",
]
