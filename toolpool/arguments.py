"""Argument checking for P5: lenient coercion, then JSON Schema validation.

Weak models (and some providers) send numbers, booleans, arrays and objects as
strings: ``"119"`` for ``119``, ``'["a","b"]'`` for a list. When such a string is an
unambiguous encoding of the type the schema expects, it is rewritten before the
schema judges; anything ambiguous is left alone and reported. Every problem is
reported in one pass, so the model can fix them all in one retry.

An ``ArgumentChecker`` is compiled once per tool and reused for every call. Valid
arguments are usually accepted by code that fastjsonschema generates from the schema
(a few µs, where jsonschema takes tens); jsonschema stays the authority and writes the
report of every call the compiled code does not accept (``toolpool.compiled_schema``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator as JsonSchemaValidator

from toolpool.compiled_schema import accepted_by, compile_fast_path
from toolpool.errors import ToolDefinitionError

_PENDING = "pending"

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# The order in which a string is tried against the types a schema allows: integer
# before number so that "3" stays an int.
_COERCIBLE = ("integer", "number", "boolean", "array", "object")
_NO_VALUE = object()


@dataclass(frozen=True, slots=True)
class Coercion:
    """One field rewritten from a string: where (``a.b[0]``), and to which type."""

    path: str
    to_type: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "to": self.to_type}


@dataclass(frozen=True, slots=True)
class ArgumentCheck:
    """The outcome of P5 for one call.

    ``arguments`` are the coerced arguments (the originals when nothing was coerced);
    ``problems`` lists every schema violation, empty when the arguments are valid.
    """

    arguments: dict[str, Any]
    problems: tuple[str, ...] = ()
    coercions: tuple[Coercion, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems


def coerce_string(text: str, to_type: str) -> Any:
    """The value ``text`` unambiguously encodes as ``to_type``, or ``_NO_VALUE``.

    Not coerced: "12abc" or "1.0" to integer (not an integer's spelling), "1e999" to
    number or integer (not finite), "yes"/"1" to boolean, JSON of the wrong shape.
    """
    t = text.strip()
    if to_type == "integer":
        if _INTEGER.fullmatch(t):
            try:
                return int(t)
            except ValueError:  # more digits than int() accepts
                return _NO_VALUE
        return _NO_VALUE
    if to_type == "number":
        if _INTEGER.fullmatch(t):
            return coerce_string(t, "integer")
        if _NUMBER.fullmatch(t):
            value = float(t)
            return value if math.isfinite(value) else _NO_VALUE
        return _NO_VALUE
    if to_type == "boolean":
        return {"true": True, "false": False}.get(t.lower(), _NO_VALUE)
    if to_type in ("array", "object") and t[:1] in ("[", "{"):
        try:
            value = json.loads(t)
        except ValueError:
            return _NO_VALUE
        wanted = list if to_type == "array" else dict
        return value if isinstance(value, wanted) else _NO_VALUE
    return _NO_VALUE


class ArgumentChecker:
    """A compiled JSON Schema plus the coercion walk over it.

    Raises ToolDefinitionError at construction when the schema itself is invalid or
    its root is not ``type: object`` (SPEC T1).
    """

    def __init__(self, schema: Mapping[str, Any]) -> None:
        schema = dict(schema)
        if schema.get("type") != "object":
            raise ToolDefinitionError("a tool's schema must have root 'type: object'")
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except SchemaError as exc:
            raise ToolDefinitionError(f"invalid JSON Schema: {exc.message}") from exc
        self.schema = schema
        self._validator: JsonSchemaValidator = cls(schema)
        # Compiled at the first check, not here: specs are built in every worker and in
        # the zygote, which never check, and compiling costs milliseconds.
        self._fast: Callable[[Any], Any] | None = None
        self._fast_path = _PENDING
        self._strings_kept: frozenset[str] | None = None  # made at the first coercion

    def __repr__(self) -> str:
        return f"<ArgumentChecker fast path: {self._fast_path}>"

    @property
    def fast_path(self) -> str:
        """``"compiled"``, ``"pending"`` before the first check, or why this schema has
        no fast path (``"no fast path: uses 'prefixItems'"``)."""
        return self._fast_path

    def check(self, arguments: Any) -> ArgumentCheck:
        """Coerce what is unambiguous, then collect every remaining problem."""
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            return ArgumentCheck({}, (f"arguments must be a JSON object, got {kind}",))
        coerced, coercions = self.coerce(arguments)
        if self._fast_path is _PENDING:
            self._compile_fast_path()
        if self._fast is not None and accepted_by(self._fast, coerced):
            return ArgumentCheck(coerced, (), coercions)
        # Rejected (or no fast path): jsonschema decides, and reports every problem. It
        # may find none where the compiled code rejected (fastjsonschema's stricter `$`
        # in patterns, uniqueItems): then the call is valid.
        problems = tuple(_describe(e) for e in _sorted(self._validator.iter_errors(coerced)))
        return ArgumentCheck(coerced, problems, coercions)

    def _compile_fast_path(self) -> None:
        self._fast, self._fast_path = compile_fast_path(self.schema, type(self._validator))

    def coerce(self, arguments: Any) -> tuple[Any, tuple[Coercion, ...]]:
        """Only the coercion step: the rewritten arguments (a copy; the input is never
        changed) and what was rewritten. Non-objects come back as they are."""
        if not isinstance(arguments, dict):
            return arguments, ()
        if self._nothing_to_coerce(arguments):
            return dict(arguments), ()
        coercions: list[Coercion] = []
        coerced = self._coerce(arguments, self.schema, "", coercions)
        return coerced, tuple(coercions)

    def _nothing_to_coerce(self, arguments: dict[str, Any]) -> bool:
        """True when the walk would rewrite nothing, known without it: only strings
        are ever rewritten, so arguments of scalars, and of strings where the schema
        lets a string stay a string, are the common case of a call (``{}``, a path,
        a pattern, a number) decided in one pass over the top level."""
        kept = self._strings_kept
        if kept is None:
            kept = self._strings_kept = self._properties_keeping_strings()
        for key, value in arguments.items():
            kind = type(value)
            if kind is str:
                if key not in kept:
                    return False
            elif not (kind is int or kind is float or kind is bool or value is None):
                return False  # an object or array: the walk looks inside
        return True

    def _properties_keeping_strings(self) -> frozenset[str]:
        """The root's properties where the walk leaves a string as it is."""
        branches = [b for b in self._branches(self.schema) if _may_be(b, "object")]
        names = {n for b in branches for n in (b.get("properties") or {})}
        kept = set()
        for name in names:
            allowed = self._allowed_types(_property_schema(branches, name))
            if allowed is None or "string" in allowed:
                kept.add(name)
        return frozenset(kept)

    # -- the coercion walk ---------------------------------------------------------

    def _resolve(self, schema: Any) -> Any:
        """Follow local ``$ref``s (``#/$defs/Name``), the kind pydantic emits."""
        seen = 0
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            ref: str = schema["$ref"]
            if not ref.startswith("#") or seen > 32:
                return schema
            node: Any = self.schema
            for part in ref[1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                node = node.get(part) if isinstance(node, dict) else None
            schema, seen = node, seen + 1
        return schema

    def _branches(self, schema: Any) -> Iterator[dict[str, Any]]:
        """The schema and the subschemas it combines (allOf / anyOf / oneOf), resolved."""
        schema = self._resolve(schema)
        if not isinstance(schema, dict):
            return
        yield schema
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in schema.get(key, ()):
                yield from self._branches(sub)

    def _allowed_types(self, schema: Any) -> set[str] | None:
        """The JSON types a (sub)schema names; None when some branch leaves it open."""
        types: set[str] = set()
        typed = False
        for branch in self._branches(schema):
            declared = branch.get("type")
            if isinstance(declared, str):
                types.add(declared)
                typed = True
            elif isinstance(declared, list):
                types.update(t for t in declared if isinstance(t, str))
                typed = True
        return types if typed else None

    def _coerce(self, value: Any, schema: Any, path: str, out: list[Coercion]) -> Any:
        if isinstance(value, str):
            allowed = self._allowed_types(schema)
            # A string is left alone where a string is allowed or nothing is said.
            if allowed is not None and "string" not in allowed:
                for to_type in _COERCIBLE:
                    if to_type in allowed:
                        new = coerce_string(value, to_type)
                        if new is not _NO_VALUE:
                            out.append(Coercion(path or "(arguments)", to_type))
                            value = new
                            break
        if isinstance(value, dict):
            return self._coerce_object(value, schema, path, out)
        if isinstance(value, list):
            return self._coerce_array(value, schema, path, out)
        return value

    def _coerce_object(
        self, value: dict[str, Any], schema: Any, path: str, out: list[Coercion]
    ) -> dict[str, Any]:
        branches = [b for b in self._branches(schema) if _may_be(b, "object")]
        result = dict(value)
        for key, item in value.items():
            sub = _property_schema(branches, key)
            if sub is not None:
                result[key] = self._coerce(item, sub, f"{path}.{key}" if path else key, out)
        return result

    def _coerce_array(
        self, value: list[Any], schema: Any, path: str, out: list[Coercion]
    ) -> list[Any]:
        branches = [b for b in self._branches(schema) if _may_be(b, "array")]
        result = list(value)
        for i, item in enumerate(value):
            sub = _item_schema(branches, i)
            if sub is not None:
                result[i] = self._coerce(item, sub, f"{path}[{i}]", out)
        return result


def _may_be(branch: Mapping[str, Any], json_type: str) -> bool:
    declared = branch.get("type")
    if declared is None:
        return True
    return declared == json_type or (isinstance(declared, list) and json_type in declared)


def _property_schema(branches: list[dict[str, Any]], key: str) -> Any:
    """The first subschema that describes property ``key``, if any."""
    for branch in branches:
        props = branch.get("properties")
        if isinstance(props, dict) and key in props:
            return props[key]
    for branch in branches:
        for pattern, sub in (branch.get("patternProperties") or {}).items():
            if re.search(pattern, key):
                return sub
    for branch in branches:
        extra = branch.get("additionalProperties")
        if isinstance(extra, dict):
            return extra
    return None


def _item_schema(branches: list[dict[str, Any]], index: int) -> Any:
    """The first subschema that describes array element ``index``, if any."""
    for branch in branches:
        prefix = branch.get("prefixItems")
        if isinstance(prefix, list) and index < len(prefix):
            return prefix[index]
        items = branch.get("items")
        if isinstance(items, dict):
            return items
        if isinstance(items, list) and index < len(items):  # draft 4-7 tuple form
            return items[index]
    return None


def _sorted(errors: Iterator[ValidationError]) -> list[ValidationError]:
    return sorted(errors, key=lambda e: ([str(p) for p in e.absolute_path], e.message))


def _describe(error: ValidationError) -> str:
    """One line per problem, naming the field the way the model wrote it."""
    where = format_path(error.absolute_path)
    message: str = error.message
    return f"{where}: {message}" if where else message


def format_path(parts: Any) -> str:
    """``["a", 0, "b"]`` → ``a[0].b``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


# -- the compiled fast path ----------------------------------------------------------
#
