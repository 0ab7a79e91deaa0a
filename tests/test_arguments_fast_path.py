"""SPEC P5: the compiled fast path never changes a verdict.

fastjsonschema's code may only say "valid" where jsonschema finds no problem in the
coerced arguments; everything else is jsonschema's report, as before. The property
tests draw arguments (mostly near the schema, often just wrong) for every built-in
tool, the MCP fixture's tools and hand-written schemas chosen to break it, and compare
each check with what jsonschema alone makes of the same arguments.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import fastjsonschema
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from toolpool import tool
from toolpool.arguments import ArgumentCheck, ArgumentChecker, format_path
from toolpool.errors import ToolDefinitionError
from toolpool.tools import BUILTIN_TOOLS

# -- the oracle: P5 with jsonschema alone -------------------------------------------


def jsonschema_alone(schema: dict[str, Any], checker: ArgumentChecker, args: Any) -> ArgumentCheck:
    """What check returned before the fast path: the coerced arguments and every
    problem jsonschema finds in them, sorted by field, then message."""
    if not isinstance(args, dict):
        return checker.check(args)  # never reaches a validator
    coerced, coercions = checker.coerce(args)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(
        cls(schema).iter_errors(coerced),
        key=lambda e: ([str(p) for p in e.absolute_path], e.message),
    )
    problems = tuple(
        f"{format_path(e.absolute_path)}: {e.message}" if e.absolute_path else e.message
        for e in errors
    )
    return ArgumentCheck(coerced, problems, coercions)


def outcome(run: Callable[..., ArgumentCheck], *args: Any) -> ArgumentCheck | type[Exception]:
    """What ``run(*args)`` returns, or the type of what it raises."""
    try:
        return run(*args)
    except Exception as exc:
        return type(exc)


# -- arguments near a schema ----------------------------------------------------------

TRICKY_STRINGS = st.sampled_from(
    ["", "0", "12", "-3", "1.5", "3.0", "1e3", "true", "False", "null", "[1, 2]", '["a"]',
     '{"a": 1}', "{}", "abc", "abc\n", "a\n", "ab", "x-1", "y", "red", "auto", "count"]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 3.0, -0.0, 2.5, 100.0]),
    TRICKY_STRINGS,
    st.text(max_size=6),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(TRICKY_STRINGS, st.text(max_size=3)), inner, max_size=3),
    ),
    max_leaves=6,
)
# Not what JSON decodes to, but what an in-process caller may pass: fastjsonschema
# counts a tuple as an array, jsonschema does not. The compiled code must not see them.
NOT_JSON = st.one_of(st.tuples(st.text(max_size=2)), st.just(Decimal("1.5")), st.just(b"bytes"))


def as_json_text(value: Any) -> str:
    """The string a model would send for ``value`` (what coercion reads back)."""
    return json.dumps(value, default=repr)


def resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.split("/")[1:]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def near(schema: Any, root: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that often fit ``schema`` and often just miss it."""
    if depth > 5 or not isinstance(schema, dict):
        return JSON
    options: list[st.SearchStrategy[Any]] = []
    if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
        options.append(st.deferred(lambda: near(resolve(root, schema["$ref"]), root, depth + 1)))
    if "enum" in schema:
        options.append(st.sampled_from(schema["enum"]))
    if "const" in schema:
        options.append(st.just(schema["const"]))
    for key in ("anyOf", "oneOf", "allOf"):
        options += [near(sub, root, depth + 1) for sub in schema.get(key, ())]
    for key in ("then", "else"):
        if key in schema:
            options.append(near(schema[key], root, depth + 1))
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if not types and ("properties" in schema or "additionalProperties" in schema):
        types = ["object"]
    if not types and ("items" in schema or "contains" in schema):
        types = ["array"]
    for kind in types:
        options.append(_near_type(kind, schema, root, depth))
    return mostly(st.one_of(options), st.one_of(JSON, NOT_JSON)) if options else JSON


def mostly(right: st.SearchStrategy[Any], wrong: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``right`` seven times in eight: a call with a few fields is still often valid."""
    return st.integers(0, 7).flatmap(lambda i: wrong if i == 0 else right)


def _near_type(kind: str, schema: dict[str, Any], root: Any, depth: int) -> st.SearchStrategy[Any]:
    if kind == "string":
        longest = schema.get("maxLength", 12)
        if "pattern" in schema:  # search semantics: "^a$" gives "a" and "a\n" alike
            fits = st.from_regex(schema["pattern"]).filter(lambda s: len(s) <= longest)
        else:
            fits = st.text(max_size=longest)
        return mostly(fits, TRICKY_STRINGS)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -3))
        high = schema.get("maximum", schema.get("exclusiveMaximum", 110))
        edges = [b + d for b in (low, high) for d in (-1, -0.5, 0, 0.5, 1)]
        inside = st.integers(math.ceil(low), math.floor(high))
        if kind == "number":
            inside = st.one_of(inside, st.floats(low, high))
        fits = st.one_of(inside, inside.map(str), inside.map(float))
        return mostly(fits, st.sampled_from(edges).flatmap(lambda v: st.sampled_from([v, str(v)])))
    if kind == "boolean":
        return mostly(
            st.one_of(st.booleans(), st.sampled_from(["true", "False"])),
            st.sampled_from(["yes", "1", 0, 1]),
        )
    if kind == "null":
        return st.none()
    if kind == "array":
        items = schema.get("items", schema.get("contains", True))
        lists = st.lists(near(items, root, depth + 1), max_size=4)
        return st.one_of(lists, lists.map(as_json_text), lists.map(lambda v: v + v[:1]))
    if kind == "object":
        return objects_near(schema, root, depth).flatmap(
            lambda v: st.sampled_from([v, as_json_text(v)])
        )
    return JSON


def objects_near(schema: dict[str, Any], root: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    props = schema.get("properties", {})
    optional = {name: near(sub, root, depth + 1) for name, sub in props.items()}
    extra_keys = [*schema.get("required", ()), "x-1", "y", "zz", "-A"]
    extras = mostly(st.just({}), st.dictionaries(st.sampled_from(extra_keys), JSON, max_size=2))
    return st.builds(lambda a, b: {**b, **a}, st.fixed_dictionaries({}, optional=optional), extras)


# -- the schemas ----------------------------------------------------------------------


class Point(BaseModel):
    x: int
    y: Annotated[float, Field(ge=0, lt=100)] = 0.0


class Shape(BaseModel):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=8)]
    points: list[Point]
    tags: set[str] = set()


@tool
def draw(
    shape: Shape,
    color: Literal["red", "green", 3] = "red",
    scale: int | None = None,
    origin: Point | None = None,
    meta: dict[str, int] | None = None,
    mode: Literal[True, "auto"] = "auto",
) -> str:
    """Draw a shape (a schema as pydantic writes it: $defs, anyOf with null, enums)."""
    return ""


@functools.cache
def mcp_fixture_schemas() -> dict[str, dict[str, Any]]:
    """The input schemas tests/mcp_fixture_server.py's tools publish, as MCP imports them
    (none without the mcp extra)."""
    try:
        from tests.mcp_fixture_server import server
    except ImportError:
        return {}
    listed = asyncio.run(server.list_tools())
    return {f"mcp {t.name}": t.model_dump(by_alias=True)["inputSchema"] for t in listed}


def obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


# name → (schema, takes the fast path)
HANDWRITTEN: dict[str, tuple[dict[str, Any], bool]] = {
    "combinators": (
        obj(
            a={"anyOf": [{"type": "integer", "minimum": 3}, {"type": "string", "maxLength": 2}]},
            o={"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
            al={"allOf": [{"type": "number"}, {"maximum": 10}, {"exclusiveMinimum": -1}]},
            e={"enum": [1, "a", True, None, 2.5, [], {}]},
            c={"const": 0},
            cb={"const": False},
            n={"not": {"type": ["null", "boolean"]}},
        ),
        True,
    ),
    "refs and their siblings (2020-12)": (
        {
            **obj(
                name={"$ref": "#/$defs/Name", "maxLength": 3},
                pair={"$ref": "#/$defs/Pair"},
                p0={"$ref": "#/properties/pair"},
                root={"$ref": "#/$defs/Pair/properties/left"},
            ),
            "$defs": {
                "Name": {"type": "string", "minLength": 1},
                "Pair": {
                    **obj(left={"$ref": "#/$defs/Name"}, right={"type": "integer"}),
                    "required": ["left"],
                    "additionalProperties": False,
                },
            },
        },
        True,
    ),
    "patterns": (
        {
            **obj(
                word={"type": "string", "pattern": "^[a-z]+$"},
                digit={"type": "string", "pattern": r"\d"},
                ab={"pattern": "^a|b$"},
            ),
            "patternProperties": {"^x-": {"type": "integer"}, "^y": {"type": "boolean"}},
            "additionalProperties": {"type": "string"},
            "propertyNames": {"maxLength": 5},
        },
        True,
    ),
    "closed object": (
        {
            **obj(path={"type": "string"}, mode={"enum": ["r", "w"]}, n={"type": "integer"}),
            "required": ["path", "mode"],
            "additionalProperties": False,
            "minProperties": 2,
            "maxProperties": 3,
        },
        True,
    ),
    "nested arrays": (
        obj(
            grid={
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "array",
                    "uniqueItems": True,
                    "items": {**obj(v={"type": "number"}), "required": ["v"]},
                },
            },
            any_ints={"type": "array", "contains": {"type": "integer"}},
            none={"type": "array", "items": False},
            anything={"items": True, "uniqueItems": True},
        ),
        True,
    ),
    "if then else": (
        {
            **obj(kind={"enum": ["file", "dir"]}, size={"type": "integer"}),
            "if": {**obj(kind={"const": "file"}), "required": ["kind"]},
            "then": {"required": ["size"]},
            "else": {"not": {"required": ["size"]}},
        },
        True,
    ),
    "boolean subschemas": (
        {**obj(yes=True, no=False), "additionalProperties": True},
        True,
    ),
    "draft-07: a $ref's siblings are ignored": (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            **obj(s={"$ref": "#/definitions/S", "maxLength": 1}, t={"type": "integer"}),
            "definitions": {"S": {"type": "string", "minLength": 2}},
        },
        True,
    ),
    "draft-06: if is not a keyword yet": (
        {
            "$schema": "http://json-schema.org/draft-06/schema#",
            **obj(n={"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}}),
        },
        True,
    ),
    "draw (pydantic, via @tool)": (dict(draw.schema), True),
    "unknown keywords": (
        {**obj(a={"type": "integer", "x-unit": "s", "nullable": True}), "discriminator": "a"},
        True,
    ),
    # -- no fast path ----------------------------------------------------------------
    "prefixItems": (obj(t={"type": "array", "prefixItems": [{"type": "integer"}]}), False),
    "unevaluatedProperties": (
        {"type": "object", "allOf": [obj(a={})], "unevaluatedProperties": False},
        False,
    ),
    "dependentRequired": (
        {**obj(a={}, b={}), "dependentRequired": {"a": ["b"]}},
        False,
    ),
    "minContains": (
        obj(xs={"type": "array", "contains": {"type": "integer"}, "minContains": 2}),
        False,
    ),
    "$dynamicRef": (
        {
            **obj(node={"$dynamicRef": "#node"}),
            "$defs": {"n": {"$dynamicAnchor": "node", "type": "integer"}},
        },
        False,
    ),
    "multipleOf": (obj(n={"type": "number", "multipleOf": 0.01}), False),
    "recursive $ref": (
        {
            **obj(tree={"$ref": "#/$defs/Tree"}),
            "$defs": {"Tree": {**obj(kids={"type": "array", "items": {"$ref": "#/$defs/Tree"}})}},
        },
        False,
    ),
    "a pattern's $ under not": (obj(s={"not": {"pattern": "^a$"}}), False),
    "a pattern's $ inside": (obj(s={"type": "string", "pattern": "^a$|^b"}), False),
    "a pattern's $ under a lookahead": (obj(s={"pattern": "^abc(?!x)$"}), False),
    "uniqueItems under oneOf": (
        obj(xs={"oneOf": [{"uniqueItems": True}, {"type": "array", "maxItems": 1}]}),
        False,
    ),
    "draft-04": (
        {"$schema": "http://json-schema.org/draft-04/schema#", **obj(n={"type": "integer"})},
        False,
    ),
    # "#/$defs/C" inside A means A's C (an integer), not the document's (a string)
    "an $id in $defs": (
        {
            **obj(b={"$ref": "#/$defs/A/properties/b"}),
            "$defs": {
                "A": {
                    "$id": "urn:a",
                    **obj(b={"$ref": "#/$defs/C"}),
                    "$defs": {"C": {"type": "integer"}},
                },
                "C": {"type": "string"},
            },
        },
        False,
    ),
    "a backslash in a property name": (obj(**{"a\\b": {"type": "integer"}}), False),
    "required but not allowed (fastjsonschema will not compile it)": (
        {**obj(a={}), "required": ["b"], "additionalProperties": False},
        False,
    ),
}

BUILTINS = {f"built-in {t.name}": dict(t.schema) for t in BUILTIN_TOOLS}


def all_schemas() -> dict[str, dict[str, Any]]:
    return {
        **BUILTINS,
        **mcp_fixture_schemas(),
        **{name: schema for name, (schema, _) in HANDWRITTEN.items()},
    }


SCHEMAS = all_schemas()
CHECKERS = {name: ArgumentChecker(schema) for name, schema in SCHEMAS.items()}


# -- the tests ------------------------------------------------------------------------


@pytest.mark.spec("P5")
@pytest.mark.parametrize("name", [*BUILTINS, *mcp_fixture_schemas()])
def test_P5_every_built_in_and_mcp_fixture_schema_takes_the_fast_path(name: str) -> None:
    # Given a fresh checker, nothing is compiled until the first check
    checker = ArgumentChecker(SCHEMAS[name])
    assert checker.fast_path == "pending"
    # When it checks once
    checker.check({})
    # Then it has compiled code
    assert checker.fast_path == "compiled", checker.fast_path


@pytest.mark.spec("P5")
@pytest.mark.parametrize(("name", "compiled"), [(n, c) for n, (_, c) in HANDWRITTEN.items()])
def test_P5_only_schemas_that_mean_the_same_to_both_are_compiled(name: str, compiled: bool) -> None:
    checker = ArgumentChecker(SCHEMAS[name])
    checker.check({})
    assert (checker.fast_path == "compiled") is compiled, checker.fast_path
    assert repr(checker) == f"<ArgumentChecker fast path: {checker.fast_path}>"


@pytest.mark.spec("P5", "H2")
@pytest.mark.parametrize("name", list(SCHEMAS))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_P5_the_fast_path_never_changes_a_verdict(name: str, data: st.DataObject) -> None:
    # Given arguments near the schema (valid, or a little wrong, or not JSON at all)
    schema, checker = SCHEMAS[name], CHECKERS[name]
    args = data.draw(objects_near(schema, schema))
    # When they are checked, Then the result is what jsonschema alone makes of them:
    # the same verdict, the same problems in the same order, the same coercions (or the
    # same exception: jsonschema cannot divide a Decimal by a float multipleOf)
    assert outcome(checker.check, args) == outcome(jsonschema_alone, schema, checker, args)


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    ("name", "args", "problems"),
    [
        (
            "read",
            {"path": 7, "offset": 0, "limit": "many", "extra": True},
            (
                "Additional properties are not allowed ('extra' was unexpected)",
                "limit: 'many' is not of type 'integer'",
                "offset: 0 is less than the minimum of 1",
                "path: 7 is not of type 'string'",
            ),
        ),
        (
            "grep",
            {"output_mode": "lines", "-A": -1, "-i": "yes", "head_limit": "0"},
            (
                "'pattern' is a required property",
                "-A: -1 is less than the minimum of 0",
                "-i: 'yes' is not of type 'boolean'",
                "head_limit: 0 is less than the minimum of 1",
                "output_mode: 'lines' is not one of ['files_with_matches', 'content', 'count']",
            ),
        ),
        (
            "edit",
            {"path": ["a.py"], "old_string": None, "replace_all": "sometimes"},
            (
                "'new_string' is a required property",
                "old_string: None is not of type 'string'",
                "path: ['a.py'] is not of type 'string'",
                "replace_all: 'sometimes' is not of type 'boolean'",
            ),
        ),
        (
            "bash",
            {"command": "ls", "timeout": "0", "description": 5},
            (
                "description: 5 is not of type 'string'",
                "timeout: 0 is less than or equal to the minimum of 0",
            ),
        ),
        ("ls", {"ignore": ["*.pyc", 3]}, ("ignore[1]: 3 is not of type 'string'",)),
    ],
)
def test_P5_an_invalid_calls_problems_are_those_reported_before(
    name: str, args: dict[str, Any], problems: tuple[str, ...]
) -> None:
    # (the problems as the checker wrote them before it had a fast path)
    checker = CHECKERS[f"built-in {name}"]
    assert checker.check(args).problems == problems
    assert checker.fast_path == "compiled"  # (compiled at its first check, by now)


@pytest.mark.spec("P5")
def test_P5_a_valid_call_does_not_reach_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a compiled checker, and jsonschema made to fail loudly
    checker = ArgumentChecker(BUILTINS["built-in grep"])
    checker.check({})

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("jsonschema ran for a valid call")

    monkeypatch.setattr(jsonschema.Draft202012Validator, "iter_errors", boom)
    # When valid arguments (with a coercion) are checked, Then the compiled code decides
    check = checker.check({"pattern": "def", "-A": "2", "output_mode": "count"})
    assert check.ok and check.arguments["-A"] == 2
    assert [c.path for c in check.coercions] == ["-A"]


@pytest.mark.spec("P5")
def test_P5_the_schema_is_compiled_once_at_the_first_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled: list[Any] = []
    real = fastjsonschema.compile

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiled.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(fastjsonschema, "compile", counting)
    checker = ArgumentChecker(BUILTINS["built-in read"])
    assert compiled == []  # not at construction
    for i in range(5):
        assert checker.check({"path": f"f{i}"}).ok
    assert len(compiled) == 1
    # what was compiled has no annotations, and no $ref for fastjsonschema to resolve
    assert "description" not in json.dumps(compiled[0])


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    ("name", "args", "problem"),
    [
        ("prefixItems", {"t": ["1"]}, None),  # coerced to [1], valid
        ("prefixItems", {"t": ["x"]}, "t[0]: 'x' is not of type 'integer'"),
        (
            "unevaluatedProperties",
            {"a": 1, "b": 2},
            "Unevaluated properties are not allowed ('b' was unexpected)",
        ),
        ("dependentRequired", {"a": 1}, "'b' is a dependency of 'a'"),
        (
            "minContains",
            {"xs": [1, "a"]},
            "xs: Too few items match the given schema (expected at least 2 but only 1 matched)",
        ),
        ("multipleOf", {"n": 19.01}, "n: 19.01 is not a multiple of 0.01"),
        ("an $id in $defs", {"b": "x"}, "b: 'x' is not of type 'integer'"),
    ],
)
def test_P5_a_2020_12_only_schema_falls_back_and_still_rejects(
    name: str, args: dict[str, Any], problem: str | None
) -> None:
    checker = CHECKERS[name]
    check = checker.check(args)
    assert checker.fast_path.startswith("no fast path")
    assert check.problems == ((problem,) if problem else ())


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    ("name", "args", "ok"),
    [
        # fastjsonschema reads `$` as \Z and rejects; jsonschema (re.search) accepts
        ("patterns", {"word": "abc\n"}, True),
        ("patterns", {"word": "ab1"}, False),
        # drafts 6-7 ignore a $ref's siblings; 2020-12 applies them
        ("draft-07: a $ref's siblings are ignored", {"s": "abc"}, True),
        ("refs and their siblings (2020-12)", {"name": "abcd"}, False),
        ("draft-06: if is not a keyword yet", {"n": 9}, True),
        # True is no 1, 1.0 is 1
        ("combinators", {"e": 1.0, "c": 0.0}, True),
        ("combinators", {"e": False}, False),
        ("combinators", {"cb": 0}, False),
        ("combinators", {"o": 5}, False),  # both branches match
        ("nested arrays", {"grid": [[{"v": 1}, {"v": 1.0}]]}, False),  # not unique
        ("nested arrays", {"anything": [1, True]}, True),  # unique: True is no 1
        # jsonschema's sort leaves the two [1] apart and calls them unique; jsonschema decides
        ("nested arrays", {"anything": [[1], [True], [1]]}, True),
    ],
)
def test_P5_where_the_two_validators_differ_jsonschema_decides(
    name: str, args: dict[str, Any], ok: bool
) -> None:
    checker = CHECKERS[name]
    assert checker.check(args).ok is ok
    assert checker.fast_path == "compiled"


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    "value", [("a", "b"), ["a", Decimal("1")], ["a", b"b"]], ids=["tuple", "decimal", "bytes"]
)
def test_P5_values_that_are_not_json_never_meet_the_compiled_code(value: Any) -> None:
    # jsonschema: a tuple is no array, bytes no string; fastjsonschema counts a tuple
    checker = CHECKERS["built-in ls"]
    check = checker.check({"ignore": value})
    assert not check.ok
    assert (
        check.problems
        == jsonschema_alone(BUILTINS["built-in ls"], checker, {"ignore": value}).problems
    )


@pytest.mark.spec("P5")
def test_P5_a_remote_ref_gets_no_fast_path_and_is_never_fetched() -> None:
    checker = ArgumentChecker(obj(x={"$ref": "https://example.invalid/schema.json"}))
    assert checker.check({}).ok  # jsonschema has nothing to resolve for {}
    assert checker.fast_path.startswith("no fast path: $ref 'https://")


@pytest.mark.spec("P5")
def test_P5_the_compiled_code_is_not_written_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fastjsonschema.compile execs its code in memory; nothing lands in the cwd or TMPDIR
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    checker = ArgumentChecker(dict(draw.schema))
    assert checker.check({"shape": {"name": "a", "points": []}}).ok
    assert checker.fast_path == "compiled"
    assert list(tmp_path.iterdir()) == []


# -- random schemas -------------------------------------------------------------------

PATTERNS = ["^a$", "a$", "^[a-z]+$", r"\d", "^x-", "b", "^(?!b)", "^a|b$", "", "[$]"]
NAMES = ["a", "b", "x-1", "n"]
SMALL = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from([0.0, 1.0, 2.5, "a", "", "1"])
)
SMALL_JSON = st.recursive(
    SMALL,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(NAMES), inner, max_size=2)
    ),
    max_leaves=3,
)
TYPES = st.sampled_from(["null", "boolean", "object", "array", "number", "integer", "string"])
BOUNDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]
SIZES = ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"]


def random_subschemas(refs: bool) -> st.SearchStrategy[Any]:
    leaves = [
        st.booleans(),
        st.builds(
            lambda t: {"type": t}, st.one_of(TYPES, st.lists(TYPES, min_size=1, unique=True))
        ),
        st.builds(lambda v: {"enum": v}, st.lists(SMALL_JSON, min_size=1, max_size=3)),
        st.builds(lambda v: {"const": v}, SMALL_JSON),
        st.builds(lambda p: {"pattern": p}, st.sampled_from(PATTERNS)),
        st.builds(lambda k, n: {k: n}, st.sampled_from(SIZES), st.integers(0, 2)),
        st.builds(lambda k, n: {k: n}, st.sampled_from(BOUNDS), st.sampled_from([0, 1, 1.5, -1])),
        st.builds(
            lambda r: {"required": r}, st.lists(st.sampled_from(NAMES), max_size=2, unique=True)
        ),
        st.just({"uniqueItems": True}),
        st.just({"description": "x", "format": "email", "x-unit": 1}),
    ]
    if refs:
        leaves.append(st.sampled_from([{"$ref": "#/$defs/D0"}, {"$ref": "#/$defs/D1"}]))

    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.builds(
                lambda k, xs: {k: xs},
                st.sampled_from(["anyOf", "oneOf", "allOf"]),
                st.lists(inner, min_size=1, max_size=3),
            ),
            st.builds(lambda s: {"not": s}, inner),
            st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, inner, inner, inner),
            st.builds(
                lambda p: {"properties": p},
                st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
            ),
            st.builds(
                lambda p: {"patternProperties": p},
                st.dictionaries(st.sampled_from(PATTERNS[:6]), inner, max_size=2),
            ),
            st.builds(
                lambda k, s: {k: s},
                st.sampled_from(["additionalProperties", "items", "contains", "propertyNames"]),
                inner,
            ),
            # two subschemas in one: a $ref among siblings, patterns beside properties…
            st.builds(
                lambda a, b: {**a, **b} if isinstance(a, dict) and isinstance(b, dict) else a,
                inner,
                inner,
            ),
        )

    return st.recursive(st.one_of(leaves), extend, max_leaves=8)


@st.composite
def random_schemas(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(random_subschemas(refs=True))
    schema: dict[str, Any] = {
        **(body if isinstance(body, dict) else {"allOf": [body]}),
        "type": "object",
        "$defs": {"D0": draw(random_subschemas(refs=False)), "D1": {"$ref": "#/$defs/D0"}},
    }
    dialect = draw(
        st.sampled_from(
            [
                None,
                "http://json-schema.org/draft-07/schema#",
                "http://json-schema.org/draft-06/schema#",
            ]
        )
    )
    return {**schema, "$schema": dialect} if dialect else schema


INSTANCES = st.recursive(
    st.one_of(SMALL, st.sampled_from(["a\n", "ab", "x-1", "bb", "a1", "12"]), st.floats(-3, 3)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from([*NAMES, "x-2", "yy", "b\n"]), inner, max_size=3),
    ),
    max_leaves=6,
)


@pytest.mark.spec("P5")
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    schema=random_schemas(),
    calls=st.lists(st.dictionaries(st.sampled_from(NAMES), INSTANCES, max_size=3), max_size=6),
)
def test_P5_random_schemas_get_the_verdicts_jsonschema_gives(
    schema: dict[str, Any], calls: list[dict[str, Any]]
) -> None:
    # Given any schema built from the keywords the fast path may compile (and a few
    # it may not: a `$` in a pattern under not, uniqueItems under oneOf…)
    try:
        checker = ArgumentChecker(schema)
    except ToolDefinitionError:
        return  # not a schema jsonschema accepts
    for args in calls:
        # When a call is checked, Then it is what jsonschema alone makes of it
        assert outcome(checker.check, args) == outcome(jsonschema_alone, schema, checker, args), (
            checker.fast_path
        )
