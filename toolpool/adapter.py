"""The generic adapter: another agent's tool, in its own shape, over a built-in tool.

An ``Adapter`` is a tool in the sense of SPEC T1 (its own name, description and
schema: what the model was trained on) that owns no behaviour. Every capability is
the built-in's, asked with the arguments translated (``route``): validate, preview,
execute, read_only, concurrency_safe, interrupt_behavior, activity, file_paths,
call_limits and permissions. What an adapter adds is words: the arguments in, the
result out (``result``), and the messages a model of that agent relies on
(``refused``: its refusals, in that agent's own sentences, worded from the
refusal's stable reason and details, never from toolpool's English). A built-in that lacks a
capability gives the T2 default through the adapter too, because the adapter asks
the built-in's ``ToolSpec``, which applies them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.errors import ToolDefinitionError, ToolError
from toolpool.registry import ToolSpec
from toolpool.tool import Arguments, InterruptBehavior, ToolContext, ValidationResult


@dataclass(frozen=True, slots=True)
class Refusal:
    """A built-in's refusal (``validate``) or error (``ToolError``), as an adapter
    words it again: toolpool's ``message``; its stable ``reason`` (``not_read``,
    ``changed``, ``not_found``…; "" for one that has none); its ``details`` (with
    ``validation_code`` for a refusal of ``validate``); and ``explanation``, what the
    message says past the reason's own sentence (what changed…)."""

    message: str
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    explanation: str = ""


class Adapter:
    """A tool named and shaped as another agent's, delegating to ``target``.

    Subclasses override ``arguments`` (the translation of a call's arguments), and
    where that agent's model reads things differently ``result`` and ``refused``;
    a tool that maps onto one of several built-ins by its arguments overrides
    ``route``. ``profile`` names the profile the adapter belongs to.
    """

    profile = ""

    def __init__(
        self,
        target: Any,
        *,
        name: str,
        description: str,
        schema: Mapping[str, Any],
        label: str | None = None,
    ) -> None:
        # A built-in's schema is checked where the built-in itself is registered: here
        # it is checked at the adapter's first call (a worker never loads jsonschema).
        self.target = (
            target if isinstance(target, ToolSpec) else ToolSpec(target, check_schema=False)
        )
        if self.target.is_async:
            raise ToolDefinitionError(f"{name}: an adapter delegates to plain tools only")
        self.name = name
        self.description = description
        self.schema = dict(schema)
        self._label = label or name

    # -- what a profile's tool says differently ---------------------------------------

    def arguments(self, args: Arguments) -> Arguments:
        """The built-in's arguments for a call of this tool (default: the same)."""
        return dict(args)

    def route(self, args: Arguments) -> tuple[ToolSpec, Arguments]:
        """The built-in that carries out this call, and its arguments."""
        return self.target, self.arguments(args)

    def result(self, output: Any, args: Arguments) -> Any:
        """What the model gets from the built-in's ``output`` (default: as it is)."""
        return output

    def refused(self, refusal: Refusal, args: Arguments) -> str:
        """A refusal or error of the built-in in this agent's words, made from its
        reason and details, never from toolpool's English (SPEC F14); default: its
        message as it is."""
        return refusal.message

    # -- the capabilities: the built-in's (T2) ----------------------------------------

    def label(self) -> str:
        return self._label

    def permissions(self) -> Sequence[str]:
        return self.target.permissions

    def activity(self, args: Arguments) -> str | None:
        spec, routed = self.route(args)
        return spec.activity(routed)

    def read_only(self, args: Arguments) -> bool:
        spec, routed = self.route(args)
        return spec.read_only(routed)

    def concurrency_safe(self, args: Arguments) -> bool:
        spec, routed = self.route(args)
        return spec.concurrency_safe(routed)

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior:
        spec, routed = self.route(args)
        return spec.interrupt_behavior(routed)

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        spec, routed = self.route(args)
        return spec.file_paths(routed, ctx)

    def call_limits(self, args: Arguments) -> dict[str, Any]:
        spec, routed = self.route(args)
        return spec.call_limits(routed)

    # Plain functions, as the built-ins' are (an adapter delegates to plain tools
    # only): a worker runs them without an event loop.
    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        spec, routed = self._checked(args)
        with self._rewording(args):
            verdict = spec.validate_now(routed, ctx)
        if not isinstance(verdict, ValidationResult):
            raise TypeError(f"{spec.name}: validate returned {type(verdict).__name__}")
        if verdict.ok:
            return verdict
        details = {**verdict.details, "validation_code": verdict.code}
        refusal = Refusal(verdict.message, verdict.reason, details, verdict.explanation)
        return dataclasses.replace(verdict, message=self.refused(refusal, args))

    def preview(self, args: Arguments, ctx: ToolContext) -> Any:
        spec, routed = self._checked(args)
        with self._rewording(args):
            return spec.preview_now(routed, ctx)

    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        spec, routed = self._checked(args)
        with self._rewording(args):
            output = spec.execute_fn(routed, ctx)
        return self.result(output, args)

    # -- helpers ----------------------------------------------------------------------

    def _checked(self, args: Arguments) -> tuple[ToolSpec, Arguments]:
        """The route, its arguments checked against the built-in's own schema: a
        translation that the built-in would not take is refused, never half-run."""
        spec, routed = self.route(args)
        check = spec.checker.check(routed)
        if not check.ok:
            problems = "; ".join(check.problems)
            raise ToolError(
                f"{self.name}: these arguments do not translate to {spec.name}: {problems}"
            )
        return spec, check.arguments

    @contextmanager
    def _rewording(self, args: Arguments) -> Iterator[None]:
        try:
            yield
        except ToolError as exc:
            refusal = Refusal(exc.message, exc.reason, exc.details, exc.explanation)
            raise ToolError(
                self.refused(refusal, args),
                details=exc.details,
                code=exc.code,
                reason=exc.reason,
                explanation=exc.explanation,
            ) from None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} over {self.target.name!r}>"


def tool_named(builtins: Sequence[Any], name: str) -> Any | None:
    """The built-in tool called ``name`` among ``builtins``; None when there is none."""
    return next((tool for tool in builtins if getattr(tool, "name", None) == name), None)
