"""A session's gate (SPEC P8 over the wire), made from its mode and policy rules
(``toolpool.policy``: allow, ask, or policy).

Asking is the daemon's business (an ``ApprovalRequest`` to the session's client);
here it is any async function from a GateRequest to a GateDecision.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from toolpool.engine.gate import Gate, GateDecision, GateRequest
from toolpool.policy import Action, GateMode, PolicyRule

Ask = Callable[[GateRequest], Awaitable[GateDecision]]


def decide(rules: Iterable[PolicyRule], request: GateRequest) -> tuple[Action, int | None]:
    """The first matching rule's action and its index; ASK when none matches."""
    for i, rule in enumerate(rules):
        if rule.matches(request):
            return rule.action, i
    return Action.ASK, None


def make_gate(mode: GateMode, rules: Iterable[PolicyRule], ask: Ask) -> Gate | None:
    """The gate for a session in ``mode``; None (no gate) for ``allow``."""
    if mode is GateMode.ALLOW:
        return None
    if mode is GateMode.ASK:

        async def ask_unless_read_only(request: GateRequest) -> GateDecision:
            return GateDecision.allow("read-only") if request.read_only else await ask(request)

        return ask_unless_read_only
    policy = list(rules)

    async def by_policy(request: GateRequest) -> GateDecision:
        action, index = decide(policy, request)
        if action is Action.ALLOW:
            return GateDecision.allow(f"policy rule {index}")
        if action is Action.DENY:
            return GateDecision.deny(
                f'Not allowed: policy rule {index} denies "{request.spec.name}" here.',
                f"policy rule {index}",
            )
        return await ask(request)

    return by_policy
