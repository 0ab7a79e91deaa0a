"""Tools by name, with their capabilities resolved once (SPEC T1, T2, T5).

``ToolSpec`` is how the rest of toolpool sees a tool: it checks the four required
parts, compiles the argument schema, detects each optional capability with
``isinstance`` and applies the defaults of SPEC T2 for what is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolpool.errors import ToolDefinitionError, ToolError
from toolpool.tool import (
    ActivityDescriber,
    Arguments,
    ConcurrencySafeTool,
    ContentTool,
    FileTool,
    FixedAnswersTool,
    InterruptBehavior,
    InterruptBehaviorTool,
    Labeler,
    LimitedTool,
    PermissionMetadataTool,
    Previewer,
    ReadOnlyTool,
    Tool,
    ToolContext,
    ValidationResult,
    Validator,
)

if TYPE_CHECKING:  # imported with the first checker: jsonschema comes with it
    from toolpool.arguments import ArgumentChecker

_BEHAVIORS: dict[Any, InterruptBehavior] = {
    **{b: b for b in InterruptBehavior},
    **{b.value: b for b in InterruptBehavior},
}
log = logging.getLogger("toolpool.tools")

# The capabilities a tool may answer once for every call (FixedAnswersTool), and the
# mark of an answer asked per call.
_FIXABLE = frozenset(("label", "read_only", "concurrency_safe", "interrupt_behavior", "activity"))
_ASKED = object()
# The names every provider accepts (OpenAI, Anthropic and Gemini agree on this set).
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class ToolSpec:
    """One tool with its capabilities resolved, and the defaults of T2 applied.

    The ``read_only``, ``concurrency_safe``, ``interrupt_behavior`` and ``activity``
    answers never raise: a capability that fails answers with the cautious default
    (not read-only, not safe, block, no activity), because a scheduling decision must
    not crash a turn.
    """

    __slots__ = (
        "_activity",
        "_call_limits",
        "_checker",
        "_complained",
        "_concurrency_safe",
        "_file_paths",
        "_fixed_read_only",
        "_interrupt_behavior",
        "_label",
        "_preview",
        "_read_only",
        "_validate",
        "binding",
        "description",
        "execute_fn",
        "has_call_limits",
        "has_file_paths",
        "is_async",
        "name",
        "permissions",
        "preview_is_async",
        "schema",
        "steady_plan",
        "steady_start",
        "tool",
        "validate_is_async",
    )

    def __init__(self, tool: Any, *, check_schema: bool = True) -> None:
        if inspect.isclass(tool) or not isinstance(tool, Tool):
            missing = [
                p for p in ("name", "description", "schema", "execute") if not hasattr(tool, p)
            ]
            what = "a class, not an instance" if inspect.isclass(tool) else f"missing {missing}"
            raise ToolDefinitionError(f"{tool!r} is not a tool: {what}")
        name, description, schema = tool.name, tool.description, tool.schema
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise ToolDefinitionError(
                f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'"
            )
        if not isinstance(description, str):
            raise ToolDefinitionError(f"tool {name!r}: description must be a string")
        self._checker: ArgumentChecker | None = None
        if check_schema:  # T1: a schema that is not one is refused here, at registration
            self._checker = _checker(name, schema)
            self.schema: dict[str, Any] = self._checker.schema
        else:
            self.schema = dict(schema)
        self.tool = tool
        # Where a client's shipped tool runs (SPEC A6): the pool's binding of its
        # session, set by the daemon; None for the tools of the workers' own modules.
        self.binding: Any = None
        self.name: str = name
        self.description: str = description
        self._label: Callable[[], str] | None = tool.label if isinstance(tool, Labeler) else None
        self._validate = tool.validate if isinstance(tool, Validator) else None
        self._preview = tool.preview if isinstance(tool, Previewer) else None
        self._read_only = tool.read_only if isinstance(tool, ReadOnlyTool) else None
        self._concurrency_safe = (
            tool.concurrency_safe if isinstance(tool, ConcurrencySafeTool) else None
        )
        self._activity = tool.activity if isinstance(tool, ActivityDescriber) else None
        self._interrupt_behavior = (
            tool.interrupt_behavior if isinstance(tool, InterruptBehaviorTool) else None
        )
        self._file_paths = tool.file_paths if isinstance(tool, FileTool) else None
        self._call_limits = tool.call_limits if isinstance(tool, LimitedTool) else None
        self._complained: set[str] = set()  # the capabilities whose failure was logged
        self.has_file_paths = self._file_paths is not None
        self.has_call_limits = self._call_limits is not None
        self._fix_answers(tool.fixed_answers() if isinstance(tool, FixedAnswersTool) else {})
        self.permissions: tuple[str, ...] = (
            tuple(tool.permissions()) if isinstance(tool, PermissionMetadataTool) else ()
        )
        self.execute_fn: Callable[[Arguments, ToolContext], Any] = (
            tool.execute_content if isinstance(tool, ContentTool) else tool.execute
        )
        self.is_async = inspect.iscoroutinefunction(self.execute_fn)
        # Where the tool's validate or preview must be awaited (an executor's slow path).
        self.validate_is_async = inspect.iscoroutinefunction(self._validate)
        self.preview_is_async = inspect.iscoroutinefunction(self._preview)

    def _fix_answers(self, fixed: Any) -> None:
        """The answers that are the same for every call — T2's defaults for what the
        tool lacks, and what it fixes itself (``FixedAnswersTool``) — known once, so
        that a call's planning and start need not ask: ``steady_plan`` (whether a call
        is concurrency-safe, whether an interrupt cancels it) and ``steady_start`` (the
        label and the activity of its ``tool_start``), each None where a part of it
        depends on the arguments."""
        if not isinstance(fixed, Mapping):
            raise ToolDefinitionError(f"tool {self.name!r}: fixed_answers() must be a mapping")
        unknown = set(fixed) - _FIXABLE
        if unknown:
            raise ToolDefinitionError(
                f"tool {self.name!r}: fixed_answers() names {sorted(unknown)}; "
                f"it may fix {sorted(_FIXABLE)}"
            )
        for name in ("read_only", "concurrency_safe"):
            if name in fixed and not isinstance(fixed[name], bool):
                raise ToolDefinitionError(f"tool {self.name!r}: a fixed {name} must be a bool")
        if "label" in fixed and not isinstance(fixed["label"], str):
            raise ToolDefinitionError(f"tool {self.name!r}: a fixed label must be a string")
        if "activity" in fixed and not isinstance(fixed["activity"], str | None):
            raise ToolDefinitionError(
                f"tool {self.name!r}: a fixed activity must be a string or None"
            )
        given = fixed.get("interrupt_behavior", InterruptBehavior.BLOCK)
        behavior = _BEHAVIORS.get(given) if isinstance(given, str) else None
        if behavior is None:
            choices = ", ".join(repr(b.value) for b in InterruptBehavior)
            raise ToolDefinitionError(
                f"tool {self.name!r}: a fixed interrupt_behavior must be one of {choices}"
            )

        def known(name: str, capability: object, default: object) -> object:
            return fixed.get(name, default if capability is None else _ASKED)

        read_only = known("read_only", self._read_only, False)
        self._fixed_read_only = None if read_only is _ASKED else bool(read_only)
        safe = known("concurrency_safe", self._concurrency_safe, read_only)
        cancels = (
            behavior is InterruptBehavior.CANCEL
            if "interrupt_behavior" in fixed or self._interrupt_behavior is None
            else _ASKED
        )
        label = known("label", self._label, self.name)
        activity = known("activity", self._activity, None)
        self.steady_plan: tuple[bool, bool] | None = (
            None if _ASKED in (safe, cancels) else (bool(safe), bool(cancels))
        )
        self.steady_start: tuple[str, str | None] | None = (
            None
            if label is _ASKED or activity is _ASKED
            else (str(label), None if activity is None else str(activity))
        )

    @property
    def checker(self) -> ArgumentChecker:
        """The arguments' checker (P5); made here, at the first use, for a spec whose
        schema was not checked at registration (``check_schema=False``)."""
        if self._checker is None:
            self._checker = _checker(self.name, self.schema)
        return self._checker

    # -- T2 defaults ---------------------------------------------------------------

    def _failed(self, capability: str, exc: Exception) -> None:
        """A capability raised: it answers with T2's cautious default, and the first
        time (per tool and capability) the log says so, with the traceback — a tool's
        refusal (``ToolError``, a path out of reach…) is no failure to report."""
        if capability in self._complained or isinstance(exc, ToolError):
            return
        self._complained.add(capability)
        log.warning(
            "tool %r: its %s raised %s; it answers with the default (logged once)",
            self.name,
            capability,
            type(exc).__name__,
            exc_info=exc,
        )

    def label(self) -> str:
        if self.steady_start is not None:
            return self.steady_start[0]
        if self._label is None:
            return self.name
        try:
            return str(self._label())
        except Exception as exc:
            self._failed("label", exc)
            return self.name

    def read_only(self, args: Arguments) -> bool:
        if self._fixed_read_only is not None or self._read_only is None:
            return bool(self._fixed_read_only)
        try:
            return bool(self._read_only(args))
        except Exception as exc:
            self._failed("read_only", exc)
            return False

    def concurrency_safe(self, args: Arguments) -> bool:
        """S1: concurrency_safe if the tool says, else read_only, else False."""
        if self.steady_plan is not None:
            return self.steady_plan[0]
        if self._concurrency_safe is None:
            return self.read_only(args)
        try:
            return bool(self._concurrency_safe(args))
        except Exception as exc:
            self._failed("concurrency_safe", exc)
            return False

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior:
        if self.steady_plan is not None:
            return InterruptBehavior.CANCEL if self.steady_plan[1] else InterruptBehavior.BLOCK
        if self._interrupt_behavior is None:
            return InterruptBehavior.BLOCK
        try:
            answer = self._interrupt_behavior(args)
        except Exception as exc:
            self._failed("interrupt_behavior", exc)
            return InterruptBehavior.BLOCK
        # A dict, not InterruptBehavior(answer): an Enum's call costs ten times more.
        return _BEHAVIORS.get(answer, InterruptBehavior.BLOCK)

    def activity(self, args: Arguments) -> str | None:
        if self.steady_start is not None:
            return self.steady_start[1]
        if self._activity is None:
            return None
        try:
            text = self._activity(args)
        except Exception as exc:
            self._failed("activity", exc)
            return None
        return None if text is None else str(text)

    def file_paths(self, args: Arguments, ctx: ToolContext) -> list[Path]:
        """The files whose register stamps this call needs; none when it cannot say."""
        if self._file_paths is None:
            return []
        try:
            return [Path(p) for p in self._file_paths(args, ctx)]
        except Exception as exc:
            self._failed("file_paths", exc)
            return []

    def call_limits(self, args: Arguments) -> dict[str, Any]:
        """The limits this call asks for; none when the tool says nothing or fails."""
        if self._call_limits is None:
            return {}
        try:
            return dict(self._call_limits(args))
        except Exception as exc:
            self._failed("call_limits", exc)
            return {}

    @property
    def has_preflight(self) -> bool:
        """Whether P6 or P7 has anything of the tool's to run."""
        return self._validate is not None or self._preview is not None

    @property
    def has_preview(self) -> bool:
        return self._preview is not None

    @property
    def has_validate(self) -> bool:
        return self._validate is not None

    def validate_now(self, args: Arguments, ctx: ToolContext) -> Any:
        """The tool's semantic check as it answers: a ``ValidationResult``, or an
        awaitable of one from an async ``validate`` (the caller awaits it where it
        can: a worker has no event loop until an async tool needs one). May raise."""
        if self._validate is None:
            return ValidationResult.passed()
        return self._validate(args, ctx)

    def preview_now(self, args: Arguments, ctx: ToolContext) -> Any:
        """The tool's preview as it answers (None: none), or an awaitable of it."""
        return None if self._preview is None else self._preview(args, ctx)

    async def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult:
        """The tool's semantic check; passes when it has none. May raise."""
        if self._validate is None:
            return ValidationResult.passed()
        result = await _maybe_await(self._validate(args, ctx))
        if not isinstance(result, ValidationResult):
            raise TypeError(f"validate returned {type(result).__name__}, not ValidationResult")
        return result

    async def preview(self, args: Arguments, ctx: ToolContext) -> Any:
        """The tool's preview, or None when it has none. May raise."""
        if self._preview is None:
            return None
        return await _maybe_await(self._preview(args, ctx))

    def definition(self) -> dict[str, Any]:
        """Name, description and schema: what the model is shown."""
        return {"name": self.name, "description": self.description, "schema": self.schema}

    def __repr__(self) -> str:
        return f"<ToolSpec {self.name!r}>"


def _checker(name: str, schema: Any) -> ArgumentChecker:
    from toolpool.arguments import ArgumentChecker

    try:
        return ArgumentChecker(schema)
    except ToolDefinitionError as exc:
        raise ToolDefinitionError(f"tool {name!r}: {exc}") from exc


class ToolRegistry:
    """The tools a coordinator or worker knows, by name.

    ``check_schemas=False`` leaves each schema unchecked until its tool's arguments
    are first checked: for the zygote, whose tools the daemon registered (and
    checked) first, and whose workers never check arguments — they then never load
    jsonschema, some 8 MB of every worker's memory.
    """

    def __init__(self, tools: Iterable[Any] = (), *, check_schemas: bool = True) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._check_schemas = check_schemas
        for tool in tools:
            self.add(tool)

    def add(self, tool: Any) -> ToolSpec:
        spec = (
            tool if isinstance(tool, ToolSpec) else ToolSpec(tool, check_schema=self._check_schemas)
        )
        if spec.name in self._specs:
            raise ToolDefinitionError(f"two tools are named {spec.name!r}")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def extended(self, tools: Iterable[Any]) -> ToolRegistry:
        """A registry of these tools and ``tools`` beside them (a session's own, SPEC
        A5); a name of one of these is a ToolDefinitionError naming it, and so is a
        name two of ``tools`` share."""
        extended = ToolRegistry(check_schemas=self._check_schemas)
        extended._specs = dict(self._specs)
        for tool in tools:
            spec = (
                tool
                if isinstance(tool, ToolSpec)
                else ToolSpec(tool, check_schema=self._check_schemas)
            )
            if spec.name in self._specs:
                raise ToolDefinitionError(
                    f"tool {spec.name!r}: a tool of that name is there already"
                )
            extended.add(spec)
        return extended

    def names(self) -> list[str]:
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"<ToolRegistry {len(self._specs)} tools: {', '.join(self._specs)}>"


def load_module(ref: str) -> ModuleType:
    """Import a module by dotted name, or from a ``.py`` file path."""
    if ref.endswith(".py") or "/" in ref:
        path = Path(ref).resolve()
        if not path.is_file():
            raise ToolDefinitionError(f"no tool module at {path}")
        name = f"toolpool_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ToolDefinitionError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(ref)
    except ImportError as exc:
        raise ToolDefinitionError(f"cannot import tool module {ref!r}: {exc}") from exc


def tools_in_module(ref: str) -> list[Any]:
    """T5: the tools a user module offers.

    A module lists them in ``TOOLS``; without that list, every module-level object
    that meets the contract (instances, not classes) is taken, in definition order.
    """
    module = load_module(ref)
    listed = getattr(module, "TOOLS", None)
    if listed is not None:
        return list(listed)
    return [
        obj
        for obj in vars(module).values()
        if not inspect.isclass(obj) and not inspect.ismodule(obj) and isinstance(obj, Tool)
    ]
