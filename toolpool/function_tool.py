"""``@tool``: a typed Python function (sync or async) becomes a tool (SPEC T5).

The name comes from the function, the description from its docstring, and the JSON
Schema from its type hints through pydantic (nested models, ``Optional``,
``Literal``, ``Annotated[int, Field(ge=0)]`` …). Parameter descriptions come from the
docstring (Google, NumPy or reST style). A parameter annotated ``ToolContext``
receives the call's context and is not part of the schema.

    @tool(read_only=True)
    def word_count(path: str, ctx: ToolContext) -> int:
        '''Count the words of a file in the workspace.

        Args:
            path: File path relative to the workspace.
        '''
        return len((ctx.workspace / path).read_text().split())
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, overload

import docstring_parser
import pydantic
from pydantic import BaseModel, ConfigDict, Field, create_model

from toolpool.errors import ToolDefinitionError, ToolError
from toolpool.tool import Arguments, InterruptBehavior, ToolContext, ValidationResult

Flag = bool | Callable[[Arguments], bool]
Behavior = InterruptBehavior | str | Callable[[Arguments], InterruptBehavior | str]
Activity = str | Callable[[Arguments], str]


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` keys: noise in the model's prompt.

    Property *names* called "title" stay; only schema keywords go.
    """
    if isinstance(schema, list):
        return [_strip_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def _is_context(hint: Any) -> bool:
    """``ToolContext`` or ``ToolContext | None``: the parameter gets the context."""
    if hint is ToolContext:
        return True
    args = typing.get_args(hint)
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and ToolContext in args


def _arguments_model(
    fn: Callable[..., Any], tool_name: str
) -> tuple[type[BaseModel], list[str], str]:
    """The pydantic model of ``fn``'s arguments, its context parameters, its description."""
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    param_docs = {p.arg_name: p.description for p in doc.params if p.description}
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    context_params: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {tool_name!r}: *args and **kwargs have no schema")
        hint = hints.get(pname)
        if _is_context(hint):
            context_params.append(pname)
            continue
        if hint is None:
            raise ToolDefinitionError(f"tool {tool_name!r}: parameter {pname!r} needs a type hint")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hint, Field(default=default, description=param_docs.get(pname)))
    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    description = (doc.description or "").strip()
    return model, context_params, description


class FunctionTool:
    """A tool made from a function by ``@tool``; also callable as the function itself."""

    # Set per instance, only when given (see __init__).
    validate: Callable[[Arguments, ToolContext], ValidationResult]
    preview: Callable[[Arguments, ToolContext], Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        label: str | None = None,
        read_only: Flag = False,
        concurrency_safe: Flag | None = None,
        interrupt_behavior: Behavior = InterruptBehavior.BLOCK,
        activity: Activity | None = None,
        validate: Callable[[Arguments, ToolContext], ValidationResult] | None = None,
        preview: Callable[[Arguments, ToolContext], Any] | None = None,
        permissions: Sequence[str] = (),
    ) -> None:
        self.fn = fn
        # As given: ``tool(fn, **options)`` makes this tool again (a client ships a
        # tool as its function and these, SPEC A5).
        self.options: dict[str, Any] = {
            "name": name,
            "description": description,
            "label": label,
            "read_only": read_only,
            "concurrency_safe": concurrency_safe,
            "interrupt_behavior": interrupt_behavior,
            "activity": activity,
            "validate": validate,
            "preview": preview,
            "permissions": tuple(permissions),
        }
        self.name: str = name or fn.__name__
        self.model, self._context_params, doc = _arguments_model(fn, self.name)
        self.description: str = description if description is not None else doc
        if not self.description:
            raise ToolDefinitionError(
                f"tool {self.name!r} needs a description: write a docstring or pass description="
            )
        self.schema: dict[str, Any] = _strip_titles(self.model.model_json_schema())
        self._label = label or self.name
        self._read_only = read_only
        self._concurrency_safe = concurrency_safe
        # A fixed behaviour is made an InterruptBehavior here, once (a bad one raises
        # at the definition, not at the first call).
        self._interrupt_behavior = (
            interrupt_behavior if callable(interrupt_behavior) else _behavior(interrupt_behavior)
        )
        self._activity = activity
        # validate and preview are capabilities the tool has only when given (T2):
        # an instance attribute, so that a tool without them is seen without them
        # (no validate to run, no "prepare" dispatch before a gate).
        if validate is not None:
            self.validate = validate
        if preview is not None:
            self.preview = preview
        self._permissions = tuple(permissions)
        # A function of no arguments has nothing for pydantic to check or convert.
        self._no_arguments = not self.model.model_fields
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r} from {self.fn.__module__}.{self.fn.__qualname__}>"

    # -- capabilities (T2); each answers with T2's default when not configured -----

    def label(self) -> str:
        return self._label

    def read_only(self, args: Arguments) -> bool:
        flag = self._read_only
        return bool(flag(args) if callable(flag) else flag)

    def concurrency_safe(self, args: Arguments) -> bool:
        flag = self._concurrency_safe
        if flag is None:
            return self.read_only(args)
        return bool(flag(args) if callable(flag) else flag)

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior:
        behavior = self._interrupt_behavior
        if callable(behavior):
            return InterruptBehavior(behavior(args))
        return behavior

    def activity(self, args: Arguments) -> str | None:
        if self._activity is None:
            return None
        if callable(self._activity):
            return self._activity(args)
        return self._activity.format(**args)

    def permissions(self) -> tuple[str, ...]:
        return self._permissions

    def fixed_answers(self) -> dict[str, Any]:
        """The options given as values, not functions: the same for every call."""
        fixed: dict[str, Any] = {"label": self._label}
        if not callable(self._read_only):
            fixed["read_only"] = bool(self._read_only)
        safe = self._read_only if self._concurrency_safe is None else self._concurrency_safe
        if not callable(safe):
            fixed["concurrency_safe"] = bool(safe)
        if not callable(self._interrupt_behavior):
            fixed["interrupt_behavior"] = self._interrupt_behavior
        if self._activity is None:
            fixed["activity"] = None
        return fixed

    # -- execution -----------------------------------------------------------------

    def bind(self, args: Arguments, ctx: ToolContext) -> dict[str, Any]:
        """The keyword arguments for ``fn``: validated by pydantic, context added."""
        if self._no_arguments and not args:
            return dict.fromkeys(self._context_params, ctx)
        try:
            values = self.model.model_validate(args)
        except pydantic.ValidationError as exc:
            raise ToolError(f"invalid arguments: {exc}") from None
        kwargs = {field: getattr(values, field) for field in type(values).model_fields}
        kwargs.update(dict.fromkeys(self._context_params, ctx))
        return kwargs


def _behavior(value: str) -> InterruptBehavior:
    """A fixed interrupt behaviour as the enum, or ToolDefinitionError naming the choices."""
    try:
        return InterruptBehavior(value)
    except ValueError:
        choices = ", ".join(repr(b.value) for b in InterruptBehavior)
        raise ToolDefinitionError(
            f"interrupt_behavior = {value!r}: expected one of {choices}, or a function"
        ) from None


def _plain(output: Any) -> Any:
    """pydantic models a function returns become JSON-able data."""
    return output.model_dump(mode="json") if isinstance(output, BaseModel) else output


class SyncFunctionTool(FunctionTool):
    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        return _plain(self.fn(**self.bind(args, ctx)))


class AsyncFunctionTool(FunctionTool):
    async def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        return _plain(await self.fn(**self.bind(args, ctx)))


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    label: str | None = None,
    read_only: Flag = False,
    concurrency_safe: Flag | None = None,
    interrupt_behavior: Behavior = InterruptBehavior.BLOCK,
    activity: Activity | None = None,
    validate: Callable[[Arguments, ToolContext], ValidationResult] | None = None,
    preview: Callable[[Arguments, ToolContext], Any] | None = None,
    permissions: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, **options: Any
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed function into a tool; use bare (``@tool``) or with options.

    Options: ``name``, ``description`` (default: the docstring), ``label``,
    ``read_only``, ``concurrency_safe`` (each a bool or a function of the
    arguments), ``interrupt_behavior`` ("cancel" or "block", or a function),
    ``activity`` (a format string over the arguments, like ``"Running: {command}"``,
    or a function), ``validate``, ``preview`` and ``permissions``.
    """

    def build(f: Callable[..., Any]) -> FunctionTool:
        cls = AsyncFunctionTool if inspect.iscoroutinefunction(f) else SyncFunctionTool
        return cls(f, **options)

    return build if fn is None else build(fn)
