"""JSON Schema → the OpenAPI subset Gemini accepts in ``FunctionDeclaration.parameters``.

Gemini's ``Schema`` (ai.google.dev/api/caching#Schema) is a select subset of OpenAPI
3.0: no ``$ref``/``$defs``, no ``additionalProperties``, ``enum`` only on strings,
few ``format`` values, and it refuses an OBJECT whose ``properties`` is empty or whose
``required`` names a property it does not have. The conversion:

- inlines local ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``); a reference to
  a definition it is already inside (a recursive type) becomes that definition's
  bare type, without its properties;
- merges ``allOf`` members; turns ``oneOf`` into ``anyOf``; a ``null`` branch, a
  ``null`` in a type list, or ``None`` in an ``enum`` becomes ``nullable: true``;
- keeps ``enum`` on strings only (a non-string enum, or ``const``, is told in the
  description instead) and ``format`` only where Gemini supports it;
- drops every other keyword (``additionalProperties``, ``default``, ``title``,
  ``examples``, ``exclusiveMinimum``…).

A looser schema is safe because the model's arguments still meet the tool's full JSON
Schema at P5: what Gemini was not told is checked and reported there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from toolpool.models import JSONObject

# Which keywords Gemini keeps, per JSON Schema type.
_KEYWORDS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "string": ("minLength", "maxLength", "pattern"),
    "number": ("minimum", "maximum"),
    "integer": ("minimum", "maximum"),
    "array": ("minItems", "maxItems"),
    "object": ("minProperties", "maxProperties"),
    "boolean": (),
}
# The formats Gemini supports; any other makes it refuse the whole request.
_FORMATS = {
    "string": ("enum", "date-time"),
    "number": ("float", "double"),
    "integer": ("int32", "int64"),
}


def gemini_parameters(schema: Mapping[str, Any]) -> JSONObject | None:
    """The ``parameters`` of a function declaration; None when the tool takes none.

    Raises ValueError for a ``$ref`` that is not local to the schema.
    """
    converted = _Converter(schema).convert(schema, "schema", frozenset())
    return converted if converted.get("properties") else None


class _Converter:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.targets: dict[str, Any] = {"#": root}
        for section in ("$defs", "definitions"):
            for name, target in (root.get(section) or {}).items():
                self.targets[f"#/{section}/{_escape(name)}"] = target

    def convert(self, node: Any, where: str, inside: frozenset[str]) -> JSONObject:
        # Three layers, outermost first: references, combinators, then the node itself.
        if not isinstance(node, Mapping):
            return {}  # a boolean schema says nothing Gemini can express
        if isinstance(node.get("$ref"), str):
            return self._reference(node, where, inside)
        if isinstance(node.get("allOf"), list):
            rest = {k: v for k, v in node.items() if k != "allOf"}
            members = [
                self.convert(member, f"{where}.allOf[{i}]", inside)
                for i, member in enumerate(node["allOf"])
            ]
            return _merged([self.convert(rest, where, inside), *members])
        key = "anyOf" if isinstance(node.get("anyOf"), list) else "oneOf"
        if isinstance(node.get(key), list):
            return self._alternatives(node, key, where, inside)
        return self._plain(node, where, inside)

    def _reference(self, node: Mapping[str, Any], where: str, inside: frozenset[str]) -> JSONObject:
        ref = node["$ref"]
        if ref not in self.targets:
            raise ValueError(
                f"{where}.$ref is {ref!r}: only references into the schema's own $defs "
                "can be inlined for Gemini"
            )
        target = self.targets[ref]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if ref in inside:
            bare = {k: v for k, v in target.items() if k in ("type", "description")}
            return self.convert({**bare, **siblings}, where, inside)
        return self.convert({**target, **siblings}, where, inside | {ref})

    def _alternatives(
        self, node: Mapping[str, Any], key: str, where: str, inside: frozenset[str]
    ) -> JSONObject:
        branches = node[key]
        kept = [(i, b) for i, b in enumerate(branches) if not _is_null(b)]
        rest = self.convert({k: v for k, v in node.items() if k != key}, where, inside)
        converted = [self.convert(b, f"{where}.{key}[{i}]", inside) for i, b in kept]
        # Optional[X] is the common case: one real branch, folded into the node.
        out = {**rest, "anyOf": converted} if len(converted) > 1 else _merged([rest, *converted])
        if len(kept) < len(branches):
            out["nullable"] = True
        return out

    def _plain(self, node: Mapping[str, Any], where: str, inside: frozenset[str]) -> JSONObject:
        kind, nullable = _type_of(node)
        if isinstance(kind, list):  # several types: one branch per type
            branches = [self._plain({**node, "type": k}, where, inside) for k in kind]
            out: JSONObject = {"anyOf": branches}
            if nullable:
                out["nullable"] = True
            return out
        out = {}
        if kind is not None:
            out["type"] = kind.upper()
        if nullable:
            out["nullable"] = True
        description = node.get("description")
        values = _enum_values(node)
        if values is not None:
            choices = [v for v in values if v is not None]
            if None in values:
                out["nullable"] = True
            if kind == "string" and all(isinstance(v, str) for v in choices):
                out["enum"] = choices
            else:
                told = ", ".join(json.dumps(v) for v in choices)
                description = (
                    f"{description} (one of: {told})" if description else f"One of: {told}."
                )
        if isinstance(description, str) and description:
            out["description"] = description
        if node.get("format") in _FORMATS.get(kind or "", ()):
            out["format"] = node["format"]
        if kind == "object":
            self._object(node, out, where, inside)
        if kind == "array" and isinstance(node.get("items"), Mapping):
            out["items"] = self.convert(node["items"], f"{where}.items", inside)
        for keyword in _KEYWORDS_BY_TYPE.get(kind or "", ()):
            if keyword in node:
                out[keyword] = node[keyword]
        return out

    def _object(
        self, node: Mapping[str, Any], out: JSONObject, where: str, inside: frozenset[str]
    ) -> None:
        properties = {
            name: self.convert(sub, f"{where}.properties.{name}", inside)
            for name, sub in (node.get("properties") or {}).items()
        }
        if not properties:
            return  # Gemini refuses an empty properties map
        out["properties"] = properties
        required = [name for name in node.get("required") or () if name in properties]
        if required:
            out["required"] = required


def _type_of(node: Mapping[str, Any]) -> tuple[str | list[str] | None, bool]:
    """The node's type (several, one, or none) and whether null is allowed."""
    declared = node.get("type")
    if isinstance(declared, list):
        kinds = [k for k in declared if k != "null" and k in _KEYWORDS_BY_TYPE]
        nullable = "null" in declared
        if len(kinds) == 1:
            return kinds[0], nullable
        return (kinds or None), nullable
    if declared in _KEYWORDS_BY_TYPE:
        return declared, False
    if declared == "null":
        return None, True
    # Untyped nodes: infer what the other keywords make certain (Gemini accepts an
    # enum only on a STRING and properties only on an OBJECT).
    if "properties" in node:
        return "object", False
    if "items" in node:
        return "array", False
    values = _enum_values(node)
    if values and all(isinstance(v, str) for v in values if v is not None):
        return "string", False
    return None, False


def _enum_values(node: Mapping[str, Any]) -> list[Any] | None:
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    if "const" in node:
        return [node["const"]]
    return None


def _is_null(branch: Any) -> bool:
    return isinstance(branch, Mapping) and branch.get("type") == "null"


def _merged(parts: Sequence[JSONObject]) -> JSONObject:
    """Converted schemas combined: properties and required united, else first wins."""
    out: JSONObject = {}
    for part in parts:
        for key, value in part.items():
            if key == "properties" and key in out:
                out[key] = {**out[key], **value}
            elif key == "required" and key in out:
                out[key] = [*out[key], *(n for n in value if n not in out[key])]
            else:
                out.setdefault(key, value)
    return out


def _escape(name: str) -> str:
    """A definition name as it appears in a JSON pointer (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")
