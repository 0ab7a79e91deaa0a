"""The gate's questions to a session's client (SPEC P8 over the wire): an
``ApprovalRequest`` out, the client's ``ApprovalReply`` in — or no answer within the
session's ``approval_timeout``, a denial. A client that leaves has its questions
denied."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from toolpool.daemon.clients import Clients
from toolpool.daemon.records import Address, SessionEntry
from toolpool.engine.gate import GateDecision, GateRequest
from toolpool.protocol import ApprovalReply, ApprovalRequest


@dataclass(slots=True)
class _Question:
    answer: asyncio.Future[GateDecision]
    owner: Address


class Approvals:
    def __init__(self, clients: Clients, turn_of: Callable[[SessionEntry, str], str]) -> None:
        self._clients = clients
        self._turn_of = turn_of  # the turn a call of a session belongs to
        self._waiting: dict[str, _Question] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    async def ask(self, entry: SessionEntry, request: GateRequest) -> GateDecision:
        """Put the call to the session's client; no answer in time is a denial."""
        approval_id = uuid.uuid4().hex[:12]
        loop = asyncio.get_running_loop()
        question = _Question(loop.create_future(), entry.owner)
        self._waiting[approval_id] = question
        self._clients.send(
            entry.owner,
            ApprovalRequest(
                approval_id=approval_id,
                session_id=entry.session.id,
                turn_id=self._turn_of(entry, request.call.id),
                call=request.call.to_dict(),
                label=request.label,
                preview=request.preview,
                read_only=request.read_only,
                permissions=list(request.permissions),
                timeout=entry.approval_timeout,
                preview_truncated=request.preview_truncated,
            ),
        )
        timeout = GateDecision.deny(
            f"Not approved: no answer within {entry.approval_timeout:g} s.", "timeout"
        )
        timer = loop.call_later(entry.approval_timeout, _settle, question.answer, timeout)
        try:
            return await asyncio.shield(question.answer)
        finally:
            timer.cancel()
            self._waiting.pop(approval_id, None)

    def reply(self, address: Address, message: ApprovalReply) -> None:
        """The client's answer; one too late, or not this client's to give, is dropped."""
        question = self._waiting.get(message.approval_id)
        if question is None or question.owner != address:
            return
        reason = message.reason or "The user did not approve this call."
        _settle(
            question.answer,
            GateDecision.allow("client")
            if message.allowed
            else GateDecision.deny(reason, "client"),
        )

    def forget(self, address: Address) -> None:
        """The client left: what it was asked is denied."""
        for question in list(self._waiting.values()):
            if question.owner == address:
                _settle(
                    question.answer, GateDecision.deny("The client disconnected.", "disconnect")
                )


def _settle(answer: asyncio.Future[GateDecision], decision: GateDecision) -> None:
    if not answer.done():
        answer.set_result(decision)
