"""SPEC P5: lenient coercion and all-at-once schema validation, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from toolpool.arguments import ArgumentChecker, coerce_string

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "name": {"type": "string"},
        "ids": {"type": "array", "items": {"type": "integer"}},
        "opts": {
            "type": "object",
            "properties": {
                "depth": {"type": "integer"},
                "inner": {
                    "type": "object",
                    "properties": {"on": {"type": "boolean"}, "xs": {"type": "array"}},
                },
            },
        },
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "either": {"type": ["integer", "string"]},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]},
        "limits": {"type": "object", "additionalProperties": {"type": "number"}},
        "model": {"$ref": "#/$defs/Model"},
        "anything": {},
    },
    "$defs": {"Model": {"type": "object", "properties": {"size": {"type": "integer"}}}},
    "additionalProperties": False,
}

CHECKER = ArgumentChecker(SCHEMA)


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    ("given", "expected", "coerced"),
    [
        # scalars from unambiguous strings
        ({"count": "119"}, {"count": 119}, ["count"]),
        ({"count": " -7 "}, {"count": -7}, ["count"]),
        ({"ratio": "1.5"}, {"ratio": 1.5}, ["ratio"]),
        ({"ratio": "3"}, {"ratio": 3}, ["ratio"]),
        ({"ratio": "2e3"}, {"ratio": 2000.0}, ["ratio"]),
        ({"flag": "true"}, {"flag": True}, ["flag"]),
        ({"flag": "False"}, {"flag": False}, ["flag"]),
        # arrays and objects from JSON strings, coerced again inside
        ({"ids": "[1, 2, 3]"}, {"ids": [1, 2, 3]}, ["ids"]),
        ({"ids": '["1", "2"]'}, {"ids": [1, 2]}, ["ids", "ids[0]", "ids[1]"]),
        ({"ids": ["4", 5]}, {"ids": [4, 5]}, ["ids[0]"]),
        ({"opts": '{"depth": 2}'}, {"opts": {"depth": 2}}, ["opts"]),
        (
            {"opts": {"depth": "3", "inner": '{"on": "true", "xs": "[1]"}'}},
            {"opts": {"depth": 3, "inner": {"on": True, "xs": [1]}}},
            ["opts.depth", "opts.inner", "opts.inner.on", "opts.inner.xs"],
        ),
        # combinators, tuples, maps and $ref
        ({"maybe": "12"}, {"maybe": 12}, ["maybe"]),
        ({"pair": '["1", "true"]'}, {"pair": [1, True]}, ["pair", "pair[0]", "pair[1]"]),
        ({"limits": {"cpu": "0.5"}}, {"limits": {"cpu": 0.5}}, ["limits.cpu"]),
        ({"model": {"size": "9"}}, {"model": {"size": 9}}, ["model.size"]),
        # already right: untouched
        ({"count": 3, "name": "3"}, {"count": 3, "name": "3"}, []),
        # where a string is allowed, or nothing is said, a string stays a string
        ({"either": "5"}, {"either": "5"}, []),
        ({"anything": "[1]"}, {"anything": "[1]"}, []),
    ],
)
def test_P5_unambiguous_strings_are_coerced(
    given: dict[str, Any], expected: dict[str, Any], coerced: list[str]
) -> None:
    check = CHECKER.check(given)
    assert check.ok, check.problems
    assert check.arguments == expected
    assert [c.path for c in check.coercions] == coerced


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"count": "12abc"}, "count: '12abc' is not of type 'integer'"),
        ({"count": "1e999"}, "count: '1e999' is not of type 'integer'"),
        ({"count": "1.0"}, "count: '1.0' is not of type 'integer'"),
        ({"count": ""}, "count: '' is not of type 'integer'"),
        ({"ratio": "1e999"}, "ratio: '1e999' is not of type 'number'"),
        ({"ratio": "nan"}, "ratio: 'nan' is not of type 'number'"),
        ({"ratio": "1_000"}, "ratio: '1_000' is not of type 'number'"),
        ({"flag": "yes"}, "flag: 'yes' is not of type 'boolean'"),
        ({"flag": "1"}, "flag: '1' is not of type 'boolean'"),
        ({"ids": "[1, 2"}, "ids: '[1, 2' is not of type 'array'"),
        ({"ids": '{"a": 1}'}, "ids: '{\"a\": 1}' is not of type 'array'"),
        ({"opts": "[1]"}, "opts: '[1]' is not of type 'object'"),
        ({"ids": ["x"]}, "ids[0]: 'x' is not of type 'integer'"),
    ],
)
def test_P5_ambiguous_values_are_not_coerced_and_are_reported(
    given: dict[str, Any], problem: str
) -> None:
    check = CHECKER.check(given)
    assert not check.ok
    assert check.problems == (problem,)
    assert check.coercions == ()


@pytest.mark.spec("P5")
def test_P5_every_problem_is_reported_in_one_pass() -> None:
    checker = ArgumentChecker(
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "mode": {"type": "string"},
                "n": {"type": "integer"},
                "deep": {"type": "object", "properties": {"k": {"type": "boolean"}}},
            },
            "required": ["path", "mode"],
            "additionalProperties": False,
        }
    )
    check = checker.check({"n": "many", "deep": {"k": "maybe"}, "extra": 1})
    assert set(check.problems) == {
        "'path' is a required property",
        "'mode' is a required property",
        "Additional properties are not allowed ('extra' was unexpected)",
        "n: 'many' is not of type 'integer'",
        "deep.k: 'maybe' is not of type 'boolean'",
    }


@pytest.mark.spec("P5")
def test_P5_the_original_arguments_are_never_changed() -> None:
    given = {"opts": {"depth": "3"}, "ids": ["1"]}
    check = CHECKER.check(given)
    assert check.arguments == {"opts": {"depth": 3}, "ids": [1]}
    assert given == {"opts": {"depth": "3"}, "ids": ["1"]}


@pytest.mark.spec("P5")
def test_P5_arguments_must_be_an_object() -> None:
    assert CHECKER.check(["a"]).problems == ("arguments must be a JSON object, got list",)


@pytest.mark.spec("P5")
@pytest.mark.parametrize(
    ("text", "to_type", "value"),
    [
        ("007", "integer", 7),
        ("+5", "integer", 5),
        ("9" * 5000, "integer", None),  # beyond int()'s digit limit: left alone
        (".5", "number", 0.5),
        ("-1e-3", "number", -0.001),
        ("inf", "number", None),
        ("TRUE", "boolean", True),
        ("null", "boolean", None),
        ("[]", "array", []),
        ("{}", "object", {}),
        ("{}", "array", None),
    ],
)
def test_P5_string_coercion_rules(text: str, to_type: str, value: Any) -> None:
    from toolpool.arguments import _NO_VALUE

    result = coerce_string(text, to_type)
    assert (None if result is _NO_VALUE else result) == value
