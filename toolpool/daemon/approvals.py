"""The questions put to a session's client: the gate's (SPEC P8 over the wire) and a
policy session's proxy's (N6). An ``ApprovalRequest`` out, the client's
``ApprovalReply`` in — or no answer within the session's ``approval_timeout``, a
denial. A client that leaves has its questions denied."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from toolpool.daemon.clients import Clients
from toolpool.daemon.records import Address, SessionEntry
from toolpool.engine.gate import GateDecision, GateRequest
from toolpool.pool.egress import Answer
from toolpool.protocol import ApprovalReply, ApprovalRequest

MAX_NETWORK_PENDING = 16  # a session's network questions waiting (the proxy's bound too)
SESSION_SCOPE = "session"


@dataclass(slots=True)
class _Question:
    answer: asyncio.Future[tuple[GateDecision, str]]  # the decision, and its scope
    owner: Address
    session_id: str
    network: bool = False


class Approvals:
    def __init__(self, clients: Clients, turn_of: Callable[[SessionEntry, str], str]) -> None:
        self._clients = clients
        self._turn_of = turn_of  # the turn a call of a session belongs to
        self._waiting: dict[str, _Question] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    async def ask(self, entry: SessionEntry, request: GateRequest) -> GateDecision:
        """Put the call to the session's client; no answer in time is a denial."""
        message = ApprovalRequest(
            approval_id=uuid.uuid4().hex[:12],
            session_id=entry.session.id,
            turn_id=self._turn_of(entry, request.call.id),
            call=request.call.to_dict(),
            label=request.label,
            preview=request.preview,
            read_only=request.read_only,
            permissions=list(request.permissions),
            timeout=entry.approval_timeout,
            preview_truncated=request.preview_truncated,
        )
        decision, _ = await self._put(entry, message, network=False)
        return decision

    async def ask_network(
        self, entry: SessionEntry, call: dict[str, object], host: str, port: int
    ) -> Answer:
        """Put a connection no rule names to the session's client (N6): ``call`` is
        the call that opened it, as far as it is known. Past MAX_NETWORK_PENDING
        questions of the session waiting, a denial at once."""
        session_id = entry.session.id
        waiting = sum(1 for q in self._waiting.values() if q.network and q.session_id == session_id)
        if waiting >= MAX_NETWORK_PENDING:
            return Answer(False, by=f"{MAX_NETWORK_PENDING} network approvals pending already")
        message = ApprovalRequest(
            approval_id=uuid.uuid4().hex[:12],
            session_id=session_id,
            turn_id=self._turn_of(entry, str(call.get("id", ""))),
            call=call,
            label=f"Connect to {host}:{port}",
            preview=f"{host}:{port}",
            read_only=False,
            permissions=["network"],
            timeout=entry.approval_timeout,
            kind="network",
            host=host,
            port=port,
        )
        decision, scope = await self._put(entry, message, network=True)
        return Answer(
            decision.allowed,
            remember=scope == SESSION_SCOPE and decision.by == "client",
            by=decision.by or "client",
            reason=decision.reason or "",
        )

    async def _put(
        self, entry: SessionEntry, message: ApprovalRequest, *, network: bool
    ) -> tuple[GateDecision, str]:
        loop = asyncio.get_running_loop()
        question = _Question(loop.create_future(), entry.owner, entry.session.id, network)
        self._waiting[message.approval_id] = question
        self._clients.send(entry.owner, message)
        timeout = GateDecision.deny(
            f"Not approved: no answer within {entry.approval_timeout:g} s.", "timeout"
        )
        timer = loop.call_later(entry.approval_timeout, _settle, question.answer, timeout)
        try:
            return await asyncio.shield(question.answer)
        finally:
            timer.cancel()
            self._waiting.pop(message.approval_id, None)

    def reply(self, address: Address, message: ApprovalReply) -> None:
        """The client's answer; one too late, or not this client's to give, is dropped."""
        question = self._waiting.get(message.approval_id)
        if question is None or question.owner != address:
            return
        default = (
            "The user did not approve this connection."
            if question.network
            else ("The user did not approve this call.")
        )
        reason = message.reason or default
        decision = (
            GateDecision.allow("client") if message.allowed else GateDecision.deny(reason, "client")
        )
        _settle(question.answer, decision, message.scope)

    def forget(self, address: Address) -> None:
        """The client left: what it was asked is denied."""
        for question in list(self._waiting.values()):
            if question.owner == address:
                _settle(
                    question.answer, GateDecision.deny("The client disconnected.", "disconnect")
                )


def _settle(
    answer: asyncio.Future[tuple[GateDecision, str]], decision: GateDecision, scope: str = ""
) -> None:
    if not answer.done():
        answer.set_result((decision, scope))
