"""Tools of the client's own program, shipped to the daemon's workers (SPEC A5).

``client.session(..., tools=[fn, ...])``: each tool is a function — a closure, a
function of ``__main__`` or of a notebook — or a ``@tool`` function, with its options
(validate and preview included). It travels by value: dill, ``multiprocess``'s
serializer, pickles the function and its options, and only a worker bound to the
session loads them; the daemon checks the name and the schema and passes the bytes
on, never unpickling them (A6).

What the daemon decides before a worker runs a call — the schema (from the
signature, as ``@tool`` makes it), whether the tool is read-only or
concurrency-safe, what an interrupt does, its label and activity — is computed here
and sent as values: the daemon never runs the client's code, so an option given as a
function of the arguments is refused, naming it. A tool that cannot be pickled is
refused naming the tool and what could not be pickled.

As dill does, a function or class of a module the client imports by name (not
``__main__``) travels by reference: the workers must be able to import that module.
A tool itself is always copied by value, its annotations resolved here (the worker
needs no name to read them).
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

from toolpool import protocol as wire
from toolpool.client.errors import ShippingError
from toolpool.errors import ToolDefinitionError

# The Python that pickles: a worker of another major.minor cannot load the payload.
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The options the daemon decides on: each must be a value, not a function.
_DECIDED = ("read_only", "concurrency_safe", "interrupt_behavior", "activity", "label")


def pack(tools: Iterable[Any]) -> wire.ShippedTools:
    """``tools`` as ``OpenSession`` carries them; ShippingError for a tool that is not
    a function, whose options the daemon cannot use, or that does not pickle."""
    from toolpool.function_tool import FunctionTool, tool

    definitions: list[wire.ShippedTool] = []
    shipped: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []
    for given in tools:
        if isinstance(given, FunctionTool):
            fn, options = given.fn, dict(given.options)
        elif inspect.isfunction(given) or inspect.iscoroutinefunction(given):
            fn, options = given, {}
        else:
            raise ShippingError(
                f"{_shown(given)} cannot be a session tool: ship a function or a @tool "
                "function (a tool object belongs in a module of the daemon's tool_modules)"
            )
        name = options.get("name") or getattr(fn, "__name__", "?")
        try:
            made = tool(fn, **options)  # the schema from the signature, as @tool makes it
        except ToolDefinitionError as exc:
            raise ShippingError(f"session tool {name!r}: {exc}") from None
        if any(s.name == made.name for s in definitions):
            raise ShippingError(f"two session tools are named {made.name!r}")
        definitions.append(_definition(made, options))
        for hook in ("validate", "preview"):
            if callable(options.get(hook)):
                options[hook] = _portable(options[hook])
        shipped.append((made.name, _portable(fn), options))
    if len(definitions) > wire.MAX_SHIPPED_TOOLS:
        raise ShippingError(
            f"{len(definitions)} session tools, more than {wire.MAX_SHIPPED_TOOLS} a session ships"
        )
    payload = _pickled(shipped)
    if len(payload) > wire.MAX_SHIPPED_BYTES:
        raise ShippingError(
            f"the session tools pickle to {len(payload):,} bytes, more than "
            f"{wire.MAX_SHIPPED_BYTES:,}: what their closures hold travels with them"
        )
    return wire.ShippedTools(PYTHON, payload, tuple(definitions))


def _definition(made: Any, options: dict[str, Any]) -> wire.ShippedTool:
    """What the daemon is told of a tool: every answer it needs, as a value."""
    for option in _DECIDED:
        if callable(options.get(option)):
            raise ShippingError(
                f"session tool {made.name!r}: {option} is a function; the daemon decides "
                f"on {option} without running the client's code, so give it as a value"
            )
    fixed = made.fixed_answers()
    activity = options.get("activity")
    return wire.ShippedTool(
        name=made.name,
        description=made.description,
        schema=made.schema,
        label=fixed["label"],
        read_only=fixed["read_only"],
        concurrency_safe=fixed["concurrency_safe"],
        interrupt_behavior=str(fixed["interrupt_behavior"]),
        activity=None if activity is None else str(activity),
        permissions=tuple(str(p) for p in made.permissions()),
        validates=callable(options.get("validate")),
        previews=callable(options.get("preview")),
    )


def _portable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of a plain function that dill pickles by value (it is found under no
    module's name), its annotations resolved: the worker evaluates none of them."""
    if not isinstance(fn, types.FunctionType):
        return fn
    copy = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__doc__ = fn.__doc__
    copy.__qualname__ = fn.__qualname__
    copy.__module__ = fn.__module__
    try:
        copy.__annotations__ = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a hint this process cannot evaluate either: as it is
        copy.__annotations__ = dict(fn.__annotations__)
    return copy


def _pickled(shipped: list[tuple[str, Callable[..., Any], dict[str, Any]]]) -> bytes:
    import dill  # multiprocess's serializer: only a client that ships tools loads it

    try:
        return bytes(dill.dumps(shipped, recurse=True))
    except Exception as exc:
        for name, fn, options in shipped:
            culprit = _culprit(dill, fn, options)
            if culprit is not None:
                what, why = culprit
                raise ShippingError(
                    f"session tool {name!r} cannot be shipped: {what} cannot be pickled ({why})"
                ) from None
        raise ShippingError(f"the session tools cannot be pickled: {_why(exc)}") from None


def _culprit(dill: Any, fn: Callable[..., Any], options: dict[str, Any]) -> tuple[str, str] | None:
    """What of one tool does not pickle, named as its author would name it, and why;
    None when each part pickles alone."""
    parts: list[tuple[str, Any]] = []
    if isinstance(fn, types.FunctionType):
        seen = inspect.getclosurevars(fn)
        parts += [(f"its closure variable {n!r}", v) for n, v in seen.nonlocals.items()]
        parts += [(f"the global {n!r} it uses", v) for n, v in seen.globals.items()]
        parts += [(f"the default of {n!r}", v) for n, v in _defaults(fn).items()]
    for option in ("validate", "preview"):
        hook = options.get(option)
        if callable(hook):
            parts.append((f"its {option}", hook))
    parts.append(("the function", fn))
    for what, value in parts:
        try:
            dill.dumps(value, recurse=True)
        except Exception as exc:
            return f"{what} (a {type(value).__module__}.{type(value).__qualname__})", _why(exc)
    return None


def _defaults(fn: types.FunctionType) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"
