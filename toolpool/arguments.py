"""Argument checking for P5: lenient coercion, then JSON Schema validation.

Weak models (and some providers) send numbers, booleans, arrays and objects as
strings: ``"119"`` for ``119``, ``'["a","b"]'`` for a list. When such a string is an
unambiguous encoding of the type the schema expects, it is rewritten before the
schema judges; anything ambiguous is left alone and reported. Every problem is
reported in one pass, so the model can fix them all in one retry.

An ``ArgumentChecker`` is compiled once per tool and reused for every call. Valid
arguments are usually accepted by code that fastjsonschema generates from the schema
(a few µs, where jsonschema takes tens); jsonschema stays the authority and writes the
report of every call the compiled code does not accept (see ``_FastPathBuilder``).
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

from toolpool.errors import ToolDefinitionError

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
        if self._fast is not None and _accepted_by(self._fast, coerced):
            return ArgumentCheck(coerced, (), coercions)
        # Rejected (or no fast path): jsonschema decides, and reports every problem. It
        # may find none where the compiled code rejected (fastjsonschema's stricter `$`
        # in patterns, uniqueItems): then the call is valid.
        problems = tuple(_describe(e) for e in _sorted(self._validator.iter_errors(coerced)))
        return ArgumentCheck(coerced, problems, coercions)

    def _compile_fast_path(self) -> None:
        validator = type(self._validator)
        if validator not in _DIALECTS:
            self._fast_path = f"no fast path: {validator.__name__}"
            return
        try:
            translated = _FastPathBuilder(self.schema, validator).build()
        except _NoFastPath as exc:
            self._fast_path = f"no fast path: {exc}"
            return
        except Exception as exc:  # a schema check_schema passed but the walk cannot read
            self._fast_path = f"no fast path: {type(exc).__name__}: {exc}"
            return
        import fastjsonschema  # here: only processes that check arguments load it

        try:
            self._fast = fastjsonschema.compile(
                translated, use_default=False, use_formats=False, detailed_exceptions=False
            )
        except Exception as exc:  # a regex Python rejects, nesting too deep for exec…
            self._fast_path = f"no fast path: fastjsonschema: {type(exc).__name__}: {exc}"
            return
        self._fast_path = "compiled"

    def coerce(self, arguments: Any) -> tuple[Any, tuple[Coercion, ...]]:
        """Only the coercion step: the rewritten arguments (a copy; the input is never
        changed) and what was rewritten. Non-objects come back as they are."""
        if not isinstance(arguments, dict):
            return arguments, ()
        coercions: list[Coercion] = []
        coerced = self._coerce(arguments, self.schema, "", coercions)
        return coerced, tuple(coercions)

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
# fastjsonschema (drafts 4-7) and jsonschema (2020-12 unless a schema names another
# draft) do not agree on everything, and compiled code that accepts what jsonschema
# rejects would let an invalid call through. So the compiled code only ever decides
# "valid", and a schema gets it only when every keyword reachable from its root (through
# its local $refs) means the same to both. What is compiled is a translation:
#
# - Annotations (title, description, default, format…) are dropped: jsonschema does not
#   assert them (toolpool's validators have no format checker), fastjsonschema would
#   assert some (format, contentEncoding) and copies the rest into its code.
# - Local $refs are inlined (2019-09 and 2020-12 apply a $ref beside its siblings, as an
#   allOf; drafts 6-7 in place of them), so that fastjsonschema resolves nothing: no
#   fetch of a remote schema, no two refs whose generated functions get one name (it
#   folds case and punctuation). A recursive $ref means no fast path.
# - const becomes a one-value enum, and an enum with booleans or numbers is split by
#   JSON type, because fastjsonschema before 2.22 compares with Python's == (True == 1).
# - Any other keyword jsonschema acts on (prefixItems, unevaluated*, dependent*,
#   multipleOf, minContains, $dynamicRef, $id, $anchor…) means no fast path; a key that
#   is no keyword of any draft is ignored by both and dropped.
#
# Two keywords are only *stricter* in fastjsonschema: a pattern's `$` becomes `\Z`
# ("abc\n" fails "^abc$"), and uniqueItems on values jsonschema's sort misorders. Where a
# subschema failing can only fail the whole, stricter is harmless (the rejected call goes
# on to jsonschema); under not, oneOf and if, a stricter subschema can make the whole
# *accept*, so there (exact=True) they mean no fast path. And the instance side:
# fastjsonschema counts a tuple as an array, jsonschema does not; the compiled code only
# ever sees plain JSON values (_is_plain_json).

_PENDING = "pending"

# The jsonschema validators whose schemas may be compiled, and whether a $ref's siblings
# apply beside it (2019-09 on) or are ignored (drafts 6-7).
_DIALECTS: dict[type[Any], bool] = {
    jsonschema.Draft202012Validator: True,
    jsonschema.Draft201909Validator: True,
    jsonschema.Draft7Validator: False,
    jsonschema.Draft6Validator: False,
}
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    "$comment", "format", "contentEncoding", "contentMediaType", "contentSchema",
})  # fmt: skip
_COPIED = frozenset({
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minItems", "maxItems", "minProperties", "maxProperties",
})  # fmt: skip
# Keywords of some draft (or of $ref resolution) that the translation does not carry.
_UNSUPPORTED = frozenset({
    "$id", "id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveAnchor",
    "$recursiveRef", "$vocabulary", "$schema", "prefixItems", "additionalItems",
    "unevaluatedItems", "unevaluatedProperties", "dependentRequired", "dependentSchemas",
    "dependencies", "minContains", "maxContains", "multipleOf", "extends", "disallow",
    "divisibleBy",
})  # fmt: skip
_JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
_LOCAL_REF = re.compile(r"#(?:/[A-Za-z0-9_.$-]+)*")
# fastjsonschema's rewrite of a pattern's `$` into `\Z` (draft04.DOLLAR_FINDER).
_DOLLAR = re.compile(r"(?<!\\)\$")
# Older fastjsonschema escape only `"` in the property names they write into code.
_UNSAFE_NAME = re.compile(r"[\\\x00-\x1f\x7f]")
_MAX_NODES = 5000
_DRAFT_07 = "http://json-schema.org/draft-07/schema#"


class _NoFastPath(Exception):
    """Why a schema is left to jsonschema alone."""


class _FastPathBuilder:
    """The schema fastjsonschema compiles for ``root``, or _NoFastPath."""

    def __init__(self, root: dict[str, Any], validator: type[Any]) -> None:
        self._root = root
        self._keywords = frozenset(validator.VALIDATORS)
        self._ref_siblings = _DIALECTS[validator]
        self._inlining = [id(root)]
        self._nodes = 0
        self._dollar_patterns: set[str] = set()
        self._pattern_keys: set[str] = set()

    def build(self) -> dict[str, Any]:
        if _has_id(self._root):
            # Where a $ref stands inside a resource with its own $id, "#/…" points into
            # that resource, not the document: the inlining would read the wrong node.
            raise _NoFastPath("an $id in the schema")
        translated = self._schema(self._root, exact=False)
        clash = self._dollar_patterns & self._pattern_keys
        if clash:
            # fastjsonschema keeps one compiled regex per pattern text: the `\Z` one of
            # the pattern would also decide which keys the patternProperty matches.
            raise _NoFastPath(f"pattern {min(clash)!r} is also a patternProperties key")
        if not isinstance(translated, dict):
            raise _NoFastPath("the root is a boolean schema")
        return {"$schema": _DRAFT_07, **translated}

    def _schema(self, node: Any, exact: bool) -> Any:
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise _NoFastPath("a subschema is not an object")
        self._nodes += 1
        if self._nodes > _MAX_NODES:
            raise _NoFastPath(f"more than {_MAX_NODES} subschemas")
        ref = node.get("$ref")
        if ref is not None and not self._ref_siblings:
            return self._inline(ref, exact)  # drafts 6-7 ignore what stands beside it
        out: dict[str, Any] = {}
        also: list[Any] = []  # subschemas that join the node's allOf
        for key, value in node.items():
            self._keyword(out, also, node, key, value, exact)
        if "additionalProperties" in node:
            self._check_joinable(node.get("patternProperties") or {})
        if ref is not None:
            also.append(self._inline(ref, exact))
        if also:
            out["allOf"] = [*out.get("allOf", ()), *also]
        return out

    def _keyword(
        self,
        out: dict[str, Any],
        also: list[Any],
        node: dict[str, Any],
        key: str,
        value: Any,
        exact: bool,
    ) -> None:
        # Six cases: dropped, copied, subschemas, the if/then/else triple, the keywords
        # translated on their own, and the rest (no fast path).
        if key in _ANNOTATIONS or key in ("$ref", "$defs", "definitions", "then", "else"):
            return
        if key == "$schema" and node is self._root:
            return
        if key == "type":
            types = [value] if isinstance(value, str) else value
            if not isinstance(types, list) or not all(t in _JSON_TYPES for t in types):
                raise _NoFastPath(f"type {value!r}")
            out[key] = list(types) if isinstance(value, list) else value
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise _NoFastPath(f"required {value!r}")
            out[key] = list(value)
        elif key in _COPIED:
            if type(value) not in (int, float) or not math.isfinite(value):
                raise _NoFastPath(f"{key} {value!r}")
            out[key] = value
        elif key == "properties":
            unsafe = [name for name in value if _UNSAFE_NAME.search(name)]
            if unsafe:
                raise _NoFastPath(f"property name {unsafe[0]!r}")
            out[key] = {name: self._schema(sub, exact) for name, sub in value.items()}
        elif key == "patternProperties":
            self._pattern_keys.update(value)
            out[key] = {pattern: self._schema(sub, exact) for pattern, sub in value.items()}
        elif key in ("allOf", "anyOf", "oneOf"):
            # oneOf counts matches: one branch stricter can turn two matches into one.
            out[key] = [self._schema(sub, exact or key == "oneOf") for sub in value]
        elif key in ("not", "additionalProperties", "contains", "propertyNames", "items"):
            if key == "items" and isinstance(value, list):
                raise _NoFastPath("items as an array")
            out[key] = self._schema(value, exact or key == "not")
        elif key == "if":
            if key not in self._keywords:  # draft 6: not a keyword yet
                return
            out[key] = self._schema(value, exact=True)
            for branch in ("then", "else"):
                if branch in node:
                    out[branch] = self._schema(node[branch], exact)
        elif key in ("enum", "const"):
            also.append(_enum(value if key == "enum" else [value]))
        elif key == "pattern":
            out[key] = self._pattern(value, exact)
        elif key == "uniqueItems":
            if value is True and exact:
                raise _NoFastPath("uniqueItems under not, oneOf or if")
            if value is True:
                out[key] = True
        elif key in _UNSUPPORTED or key in self._keywords:
            raise _NoFastPath(f"uses {key!r}")
        # Anything else is no keyword of any draft: both ignore it.

    def _inline(self, ref: Any, exact: bool) -> Any:
        if not isinstance(ref, str) or not _LOCAL_REF.fullmatch(ref):
            raise _NoFastPath(f"$ref {ref!r} is not a plain local JSON pointer")
        target: Any = self._root
        for part in ref.split("/")[1:]:
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise _NoFastPath(f"$ref {ref!r} does not resolve")
        if id(target) in self._inlining:
            raise _NoFastPath(f"$ref {ref!r} is recursive")
        self._inlining.append(id(target))
        try:
            return self._schema(target, exact)
        finally:
            self._inlining.pop()

    def _pattern(self, pattern: Any, exact: bool) -> Any:
        if not isinstance(pattern, str):
            raise _NoFastPath(f"pattern {pattern!r}")
        dollars = [m.start() for m in _DOLLAR.finditer(pattern)]
        if not dollars:
            return pattern
        # One `$`, the last character, and no lookaround, atomic group, conditional or
        # inline flag: then `\Z` there can only match fewer strings than `$`.
        stricter_only = dollars == [len(pattern) - 1] and "(?" not in pattern.replace("(?:", "")
        if exact or not stricter_only:
            raise _NoFastPath(f"pattern {pattern!r}: fastjsonschema reads its $ as \\Z")
        self._dollar_patterns.add(pattern)
        return pattern

    @staticmethod
    def _check_joinable(patterns: dict[str, Any]) -> None:
        # jsonschema finds additional properties with the patterns joined by "|"; that
        # is the same as trying each only when no pattern numbers groups or sets flags.
        if len(patterns) > 1:
            for pattern in patterns:
                if "(?" in pattern.replace("(?:", "") or re.search(r"\\[1-9g]", pattern):
                    raise _NoFastPath(f"patternProperties {pattern!r} beside others")


def _enum(values: Any) -> dict[str, Any]:
    """An enum that fastjsonschema's equality (Python's ==) reads as jsonschema does."""
    if not isinstance(values, list) or not all(_is_plain_json(v) for v in values):
        raise _NoFastPath("an enum or const with a value that is not plain JSON")
    by_type: dict[str, list[Any]] = {"plain": [], "boolean": [], "number": []}
    for value in values:
        if type(value) is bool:
            by_type["boolean"].append(value)
        elif type(value) in (int, float):
            by_type["number"].append(value)
        elif _has_number(value):
            raise _NoFastPath("an enum or const with an array or object of numbers")
        else:
            by_type["plain"].append(value)  # strings, null, and arrays/objects of them
    branches = [
        {"enum": group} if kind == "plain" else {"type": kind, "enum": group}
        for kind, group in by_type.items()
        if group
    ]
    if len(branches) == 1:
        return branches[0]
    return {"anyOf": branches} if branches else {"enum": []}


def _has_id(node: Any) -> bool:
    if isinstance(node, dict):
        if isinstance(node.get("$id"), str):
            return True
        return any(_has_id(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_id(v) for v in node)
    return False


def _has_number(value: Any) -> bool:
    """Whether a number or boolean is anywhere in an array or object."""
    if isinstance(value, dict):
        return any(_has_number(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_number(v) for v in value)
    return type(value) in (bool, int, float)


def _is_plain_json(value: Any) -> bool:
    """Only the types JSON decodes to (exactly), string keys, finite numbers."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _is_plain_json(item):
                return False
        return True
    if kind is list:
        return all(_is_plain_json(item) for item in value)
    return False


def _accepted_by(validate: Callable[[Any], Any], value: Any) -> bool:
    try:
        if not _is_plain_json(value):
            return False
        validate(value)
    except Exception:  # its JsonSchemaValueException, or whatever the generated code raises
        return False
    return True
