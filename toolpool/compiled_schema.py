"""A compiled fast path for P5's schema check: fastjsonschema's generated code for a
translation of a tool's schema, given only to schemas whose every keyword means the
same to fastjsonschema and to jsonschema (which stays the authority: the compiled code
only ever decides "valid"; ``toolpool.arguments`` asks jsonschema for the rest).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

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


class NoFastPath(Exception):
    """Why a schema is left to jsonschema alone."""


class _FastPathBuilder:
    """The schema fastjsonschema compiles for ``root``, or NoFastPath."""

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
            raise NoFastPath("an $id in the schema")
        translated = self._schema(self._root, exact=False)
        clash = self._dollar_patterns & self._pattern_keys
        if clash:
            # fastjsonschema keeps one compiled regex per pattern text: the `\Z` one of
            # the pattern would also decide which keys the patternProperty matches.
            raise NoFastPath(f"pattern {min(clash)!r} is also a patternProperties key")
        if not isinstance(translated, dict):
            raise NoFastPath("the root is a boolean schema")
        return {"$schema": _DRAFT_07, **translated}

    def _schema(self, node: Any, exact: bool) -> Any:
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise NoFastPath("a subschema is not an object")
        self._nodes += 1
        if self._nodes > _MAX_NODES:
            raise NoFastPath(f"more than {_MAX_NODES} subschemas")
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
                raise NoFastPath(f"type {value!r}")
            out[key] = list(types) if isinstance(value, list) else value
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise NoFastPath(f"required {value!r}")
            out[key] = list(value)
        elif key in _COPIED:
            if type(value) not in (int, float) or not math.isfinite(value):
                raise NoFastPath(f"{key} {value!r}")
            out[key] = value
        elif key == "properties":
            unsafe = [name for name in value if _UNSAFE_NAME.search(name)]
            if unsafe:
                raise NoFastPath(f"property name {unsafe[0]!r}")
            out[key] = {name: self._schema(sub, exact) for name, sub in value.items()}
        elif key == "patternProperties":
            self._pattern_keys.update(value)
            out[key] = {pattern: self._schema(sub, exact) for pattern, sub in value.items()}
        elif key in ("allOf", "anyOf", "oneOf"):
            # oneOf counts matches: one branch stricter can turn two matches into one.
            out[key] = [self._schema(sub, exact or key == "oneOf") for sub in value]
        elif key in ("not", "additionalProperties", "contains", "propertyNames", "items"):
            if key == "items" and isinstance(value, list):
                raise NoFastPath("items as an array")
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
                raise NoFastPath("uniqueItems under not, oneOf or if")
            if value is True:
                out[key] = True
        elif key in _UNSUPPORTED or key in self._keywords:
            raise NoFastPath(f"uses {key!r}")
        # Anything else is no keyword of any draft: both ignore it.

    def _inline(self, ref: Any, exact: bool) -> Any:
        if not isinstance(ref, str) or not _LOCAL_REF.fullmatch(ref):
            raise NoFastPath(f"$ref {ref!r} is not a plain local JSON pointer")
        target: Any = self._root
        for part in ref.split("/")[1:]:
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise NoFastPath(f"$ref {ref!r} does not resolve")
        if id(target) in self._inlining:
            raise NoFastPath(f"$ref {ref!r} is recursive")
        self._inlining.append(id(target))
        try:
            return self._schema(target, exact)
        finally:
            self._inlining.pop()

    def _pattern(self, pattern: Any, exact: bool) -> Any:
        if not isinstance(pattern, str):
            raise NoFastPath(f"pattern {pattern!r}")
        dollars = [m.start() for m in _DOLLAR.finditer(pattern)]
        if not dollars:
            return pattern
        # One `$`, the last character, and no lookaround, atomic group, conditional or
        # inline flag: then `\Z` there can only match fewer strings than `$`.
        stricter_only = dollars == [len(pattern) - 1] and "(?" not in pattern.replace("(?:", "")
        if exact or not stricter_only:
            raise NoFastPath(f"pattern {pattern!r}: fastjsonschema reads its $ as \\Z")
        self._dollar_patterns.add(pattern)
        return pattern

    @staticmethod
    def _check_joinable(patterns: dict[str, Any]) -> None:
        # jsonschema finds additional properties with the patterns joined by "|"; that
        # is the same as trying each only when no pattern numbers groups or sets flags.
        if len(patterns) > 1:
            for pattern in patterns:
                if "(?" in pattern.replace("(?:", "") or re.search(r"\\[1-9g]", pattern):
                    raise NoFastPath(f"patternProperties {pattern!r} beside others")


def _enum(values: Any) -> dict[str, Any]:
    """An enum that fastjsonschema's equality (Python's ==) reads as jsonschema does."""
    if not isinstance(values, list) or not all(_is_plain_json(v) for v in values):
        raise NoFastPath("an enum or const with a value that is not plain JSON")
    by_type: dict[str, list[Any]] = {"plain": [], "boolean": [], "number": []}
    for value in values:
        if type(value) is bool:
            by_type["boolean"].append(value)
        elif type(value) in (int, float):
            by_type["number"].append(value)
        elif _has_number(value):
            raise NoFastPath("an enum or const with an array or object of numbers")
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


def accepted_by(validate: Callable[[Any], Any], value: Any) -> bool:
    try:
        if not _is_plain_json(value):
            return False
        validate(value)
    except Exception:  # its JsonSchemaValueException, or whatever the generated code raises
        return False
    return True


def compile_fast_path(
    schema: Mapping[str, Any], validator: type[Any]
) -> tuple[Callable[[Any], Any] | None, str]:
    """The code fastjsonschema generates for ``schema`` (checked by ``validator``'s
    draft) and ``"compiled"``; or None and why it has no fast path."""
    if validator not in _DIALECTS:
        return None, f"no fast path: {validator.__name__}"
    try:
        translated = _FastPathBuilder(dict(schema), validator).build()
    except NoFastPath as exc:
        return None, f"no fast path: {exc}"
    except Exception as exc:  # a schema check_schema passed but the walk cannot read
        return None, f"no fast path: {type(exc).__name__}: {exc}"
    import fastjsonschema  # here: only processes that check arguments load it

    try:
        compiled = fastjsonschema.compile(
            translated, use_default=False, use_formats=False, detailed_exceptions=False
        )
    except Exception as exc:  # a regex Python rejects, nesting too deep for exec…
        return None, f"no fast path: fastjsonschema: {type(exc).__name__}: {exc}"
    return compiled, "compiled"
