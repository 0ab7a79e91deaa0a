"""Tools a client ships with a session, as the daemon takes them (SPEC A5, A6).

The daemon never runs a shipped tool's code, nor unpickles it: it checks who ships
(``session_tools``: its own user over its Unix socket by default, TCP clients only
when the operator says, none at all with "off"), that the Python that pickled them
is the workers' (major.minor), how many tools and how large (each schema is compiled
as the session opens, on the event loop: L10), and each tool's name and JSON schema
(T1); the
pipeline and the scheduler then see a ``ClientTool`` per tool — the answers the
client sent as values — and the pool runs its calls on workers bound to the session,
which load the pickle once confined (``WorkerPool.bindings.bind``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from toolpool.daemon.records import BadRequest
from toolpool.errors import ToolDefinitionError
from toolpool.protocol import (
    MAX_SHIPPED_BYTES,
    MAX_SHIPPED_SCHEMA_BYTES,
    MAX_SHIPPED_TOOLS,
    FailureCode,
    ShippedTool,
    ShippedTools,
)
from toolpool.registry import ToolSpec
from toolpool.tool import Arguments, ToolContext, ValidationResult

# The workers run this daemon's interpreter (the zygote is ``sys.executable``).
WORKERS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


class SessionTools(StrEnum):
    """Who may ship tools with a session (the ``session_tools`` setting)."""

    LOCAL = "local"  # clients on the daemon's Unix socket: its own user (the default)
    ANY = "any"  # TCP clients too: code of theirs runs as the daemon's user, confined
    OFF = "off"  # no client


def admit(shipped: ShippedTools, setting: SessionTools, *, local: bool) -> list[ToolSpec]:
    """The specs of the tools a client ships, or ``BadRequest`` saying why not."""
    if setting is SessionTools.OFF:
        _refuse("this daemon's session_tools = 'off' admits none")
    if not local and setting is not SessionTools.ANY:
        _refuse(
            "this client connects over TCP, and this daemon admits them only over its "
            "Unix socket (session_tools = 'local'); an operator who sets "
            "session_tools = 'any' lets TCP clients run code as the daemon's user"
        )
    if shipped.python != WORKERS_PYTHON:
        _refuse(
            f"they were pickled by Python {shipped.python[:16]!r}, and the daemon's workers "
            f"run Python {WORKERS_PYTHON!r}: a pickle of one does not load in the other; run "
            f"the program under Python {WORKERS_PYTHON}, or put the tools in a module on "
            "the daemon's tool_modules"
        )
    if len(shipped.payload) > MAX_SHIPPED_BYTES:
        _refuse(f"their pickle is {len(shipped.payload):,} bytes, over {MAX_SHIPPED_BYTES:,}")
    if not shipped.tools:
        _refuse("the list of tools is empty")
    if len(shipped.tools) > MAX_SHIPPED_TOOLS:
        _refuse(f"{len(shipped.tools)} tools, more than {MAX_SHIPPED_TOOLS}")
    specs: list[ToolSpec] = []
    for definition in shipped.tools:
        try:
            size = len(json.dumps(definition.schema, default=str))
        except (RecursionError, ValueError) as exc:  # nested past what Python walks
            _refuse(f"tool {definition.name[:64]!r}: its schema cannot be read ({exc})")
        if size > MAX_SHIPPED_SCHEMA_BYTES:
            _refuse(
                f"tool {definition.name[:64]!r}: its schema is {size:,} bytes of JSON, "
                f"more than {MAX_SHIPPED_SCHEMA_BYTES:,}"
            )
        try:
            spec = ToolSpec(ClientTool(definition))  # T1: the name, the schema, the answers
        except ToolDefinitionError as exc:
            _refuse(str(exc))
        except RecursionError:  # a schema nested deeper than its checker walks
            _refuse(f"tool {definition.name[:64]!r}: its schema is nested too deep to check")
        if any(s.name == spec.name for s in specs):
            _refuse(f"two tools are named {spec.name!r}")
        specs.append(spec)
    return specs


def _refuse(why: str) -> Any:
    raise BadRequest(FailureCode.BAD_REQUEST, f"session tools refused: {why}")


class ClientTool:
    """A shipped tool as the daemon sees it: the client's definition and answers.
    Its code — execute, validate, preview — is the client's, and runs only in the
    session's bound workers; here it is never called."""

    def __init__(self, definition: ShippedTool) -> None:
        self.name = definition.name
        self.description = definition.description
        self.schema: Mapping[str, Any] = definition.schema
        self._definition = definition
        # validate and preview are capabilities the tool has only when the client's
        # has them (T2): the pipeline then asks the worker for them (L10).
        if definition.validates:
            self.validate = _elsewhere
        if definition.previews:
            self.preview = _elsewhere
        if definition.activity is not None:
            self.activity = self._activity

    def fixed_answers(self) -> dict[str, Any]:
        d = self._definition
        fixed: dict[str, Any] = {
            "label": d.label,
            "read_only": d.read_only,
            "concurrency_safe": d.concurrency_safe,
            "interrupt_behavior": d.interrupt_behavior,
        }
        if d.activity is None:
            fixed["activity"] = None
        return fixed

    def label(self) -> str:
        return self._definition.label

    def permissions(self) -> tuple[str, ...]:
        return self._definition.permissions

    def _activity(self, args: Arguments) -> str:
        """The client's format string over the arguments, as ``@tool`` formats it."""
        activity = self._definition.activity
        assert activity is not None
        return activity.format(**args)

    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        return _elsewhere(args, ctx)

    def __repr__(self) -> str:
        return f"<ClientTool {self.name!r}>"


def _elsewhere(args: Arguments, ctx: ToolContext) -> ValidationResult:
    raise RuntimeError("a client's shipped tool runs in its session's bound workers only")
