"""A session's gate mode and policy rules, as a session is opened with them (SPEC
P8): plain data, checked where the options are (``toolpool.session_options``: the
client, the in-process coordinator and the daemon alike). What a gate does with them
is ``toolpool.engine.approvals``'.

- ``allow``: no gate, every call runs.
- ``ask``: every call that is not read-only is put to the user; read-only calls run.
- ``policy``: rules, first match wins, by tool name (a glob), declared permission
  (T3: read, write, exec, network…) and read-only-ness → allow, ask or deny. A call
  no rule matches is asked about.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol


class GateRequestLike(Protocol):
    """What a rule looks at of a call (``toolpool.engine.gate.GateRequest``)."""

    @property
    def read_only(self) -> bool: ...

    @property
    def permissions(self) -> tuple[str, ...]: ...

    @property
    def tool_name(self) -> str: ...


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

    def matches(self, request: GateRequestLike) -> bool:
        return (
            (self.tool is None or fnmatch.fnmatchcase(request.tool_name, self.tool))
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

    def to_dict(self) -> dict[str, Any]:
        """The rule as it was written (``from_dict`` reads it back)."""
        data: dict[str, Any] = {"action": self.action.value}
        for key in ("tool", "permission", "read_only"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data


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
