"""A session's gate mode (SPEC P8 over the wire): allow, ask, or policy.

- ``allow``: no gate, every call runs.
- ``ask``: every call that is not read-only is put to the user; read-only calls run.
- ``policy``: rules, first match wins, by tool name (a glob), declared permission
  (T3: read, write, exec, network…) and read-only-ness → allow, ask or deny. A call
  no rule matches is asked about.

Asking is the daemon's business (an ``ApprovalRequest`` to the session's client);
here it is any async function from a GateRequest to a GateDecision.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from toolpool.engine.gate import Gate, GateDecision, GateRequest

Ask = Callable[[GateRequest], Awaitable[GateDecision]]


class GateMode(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    POLICY = "policy"


class Action(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """``action`` for calls that match every condition given (None: any)."""

    action: Action
    tool: str | None = None  # a glob over tool names: "mcp__*"
    permission: str | None = None  # one of the tool's declared permissions
    read_only: bool | None = None

    def matches(self, request: GateRequest) -> bool:
        return (
            (self.tool is None or fnmatch.fnmatchcase(request.spec.name, self.tool))
            and (self.permission is None or self.permission in request.permissions)
            and (self.read_only is None or request.read_only == self.read_only)
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyRule:
        unknown = set(data) - {"action", "tool", "permission", "read_only"}
        if unknown:
            raise ValueError(f"unknown policy rule keys {sorted(unknown)}")
        try:
            action = Action(data["action"])
        except (KeyError, ValueError):
            raise ValueError(
                f"a policy rule needs an action of allow, ask or deny, not {data.get('action')!r}"
            ) from None
        read_only = data.get("read_only")
        if read_only is not None and not isinstance(read_only, bool):
            raise ValueError("read_only must be true or false")
        for key in ("tool", "permission"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise ValueError(f"{key} must be a string")
        return cls(action, data.get("tool"), data.get("permission"), read_only)


def parse_policy(rules: Iterable[Mapping[str, Any]]) -> list[PolicyRule]:
    parsed = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, Mapping):
            raise ValueError(f"policy rule {i} is not an object")
        try:
            parsed.append(PolicyRule.from_dict(rule))
        except ValueError as exc:
            raise ValueError(f"policy rule {i}: {exc}") from None
    return parsed


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
