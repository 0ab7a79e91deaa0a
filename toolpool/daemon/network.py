"""The daemon's part in a session's network (SPEC N1, N5–N8): the operator's ceiling
judged when a session opens, a policy session's proxy registered then, its
questions put to the session's client, and its connections on the record.

The proxy (``toolpool.egress``, run by the pool) decides what its rules decide; what
they leave open it asks up (``ask``), and this module asks the client — an
``ApprovalRequest`` of ``kind = "network"`` — through ``Approvals``. Each
connection's end comes up as a record (``record``): to the audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from toolpool.daemon.approvals import Approvals
from toolpool.daemon.audit import Auditor
from toolpool.daemon.records import BadRequest, SessionEntry
from toolpool.egress.rules import NetworkPolicy
from toolpool.pool import WorkerPool
from toolpool.pool.egress import Answer
from toolpool.protocol import FailureCode
from toolpool.session_options import Network, SessionOptions, network_rank, shown

log = logging.getLogger("toolpool.daemon")

CEILINGS = {"off": 0, "policy": 1, "open": 2}  # network_rank's order


class SessionNetworks:
    def __init__(
        self,
        sessions: Mapping[str, SessionEntry],
        pool: WorkerPool | None,
        approvals: Approvals,
        auditor: Auditor | None,
        ceiling: str,
    ) -> None:
        self._sessions = sessions
        self._pool = pool
        self._approvals = approvals
        self._auditor = auditor
        self.ceiling = ceiling
        if pool is not None:
            pool.egress.on_ask = self.ask
            pool.egress.on_record = self.record

    def admit(self, options: SessionOptions, given: Mapping[str, Any]) -> None:
        """Refuse, at open, a session whose network is more than the daemon's
        ``network`` setting allows (N1), or a policy without a pool to carry it out.
        ``allow_network`` is taken, and its deprecation logged."""
        if "allow_network" in given:
            log.warning("session option allow_network is deprecated: it means network = 'open'")
        wanted = network_rank(options.network)
        if options.limits.get("network"):
            wanted = max(wanted, network_rank(Network.OPEN))
        if wanted > CEILINGS[self.ceiling]:
            what = (
                "limits.network = True (network 'open')"
                if wanted == 2 and options.network is not Network.OPEN
                else f"network = {shown(_wire(options.network))}"
            )
            raise BadRequest(
                FailureCode.BAD_REQUEST,
                f"session option {what}: this daemon's network setting is "
                f"{self.ceiling!r}, the most a session may have",
            )
        if isinstance(options.network, NetworkPolicy) and self._pool is None:
            raise BadRequest(
                FailureCode.BAD_REQUEST,
                "session option network: a policy needs the daemon's worker pool",
            )

    def opened(self, entry: SessionEntry) -> None:
        """A policy session's proxy knows it from now (its approvals' timeout)."""
        policy = entry.options.network
        if isinstance(policy, NetworkPolicy) and self._pool is not None:
            self._pool.egress.register(entry.session.id, policy, entry.approval_timeout)

    async def ask(self, session_id: str, call_id: str, host: str, port: int) -> Answer:
        """The proxy asks about a connection no rule names (N6)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return Answer(False, by="the session closed")
        return await self._approvals.ask_network(entry, _call(entry, call_id), host, port)

    def record(self, record: dict[str, Any]) -> None:
        """A connection ended, or was refused (N8)."""
        if self._auditor is not None:
            self._auditor.connection(record)


def _call(entry: SessionEntry, call_id: str) -> dict[str, Any]:
    """The call that opened a connection, as an approval shows it: its name and
    arguments while its turn runs, its id alone after (a background shell's)."""
    turn = entry.turns.get(entry.turn_of_call.get(call_id, ""))
    if turn is not None:
        for call in turn.calls:
            if call.id == call_id:
                return call.to_dict()
    return {"id": call_id, "name": "", "arguments": {}}


def _wire(network: Network | NetworkPolicy) -> Any:
    return network.to_wire() if isinstance(network, NetworkPolicy) else network.value
