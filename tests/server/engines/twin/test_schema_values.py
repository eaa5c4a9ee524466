"""The generator of JSON values a schema accepts (the twin's tool-call arguments and
structured answers): each keyword it reads, and the schemas it refuses."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from agentmars.server.engines.twin.schema_values import (
    MAX_DEPTH,
    SchemaError,
    json_for,
    value_for,
)


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "string"}, "lorem"),
        ({"type": "integer"}, 1),
        ({"type": "number"}, 1.5),
        ({"type": "boolean"}, True),
        ({"type": "null"}, None),
        ({"type": "array", "items": {"type": "integer"}}, [1]),
        ({"type": "array"}, ["lorem"]),
        ({"type": ["integer", "null"]}, 1),
        ({"enum": ["b", "a"], "type": "string"}, "b"),
        ({"const": {"k": [1]}}, {"k": [1]}),
        ({"anyOf": [{"type": "boolean"}, {"type": "null"}]}, True),
        ({"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}),
        ({}, "lorem"),
        (True, "lorem"),
    ],
)
def test_each_keyword_gives_a_value_of_its_kind(schema: object, value: Any) -> None:
    assert value_for(schema) == value
    assert type(value_for(schema)) is type(value)  # 1 is no True, 1.5 no 1


def test_an_object_holds_its_required_properties_nested_and_nothing_else() -> None:
    schema = {
        "type": "object",
        "properties": {
            "where": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
                "required": ["path", "line"],
            },
            "mode": {"type": "string", "enum": ["insert", "replace"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "optional": {"type": "string"},
        },
        "required": ["where", "mode", "tags"],
    }
    assert value_for(schema) == {
        "where": {"path": "lorem", "line": 1},
        "mode": "insert",
        "tags": ["lorem"],
    }


class Color(StrEnum):
    RED = "red"
    GREEN = "green"


class Where(BaseModel):
    path: str
    line: int


class Edit(BaseModel):
    where: Where
    color: Color
    mode: Literal["insert", "replace"]
    tags: list[Where]
    dry_run: bool
    ratio: float
    limit: int | None


def test_a_pydantic_models_schema_gets_a_value_the_model_accepts() -> None:
    # pydantic writes nested models and enums as $defs behind $ref, Optional as anyOf.
    schema = Edit.model_json_schema()
    assert "$defs" in schema
    edit = Edit.model_validate_json(json_for(schema))
    assert (edit.where, edit.color, edit.mode) == (Where(path="lorem", line=1), Color.RED, "insert")


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "widget"}, "unknown JSON schema type"),
        ({"enum": []}, "'enum' must be a non-empty list"),
        ({"anyOf": {"type": "string"}}, "'anyOf' must be a non-empty list"),
        ({"type": "object", "properties": [], "required": []}, "'properties' must be an object"),
        ({"type": "object", "required": "a"}, "'required' must be a list"),
        ({"$ref": "https://example.com/s.json"}, "only local '$ref's"),
        ({"$ref": "#/$defs/Missing"}, "points at nothing"),
        ({"type": "array", "items": [{"type": "string"}]}, "a schema must be an object"),
        (False, "a schema must be an object or true"),
        (["string"], "a schema must be an object or true"),
        ({"$ref": "#"}, f"deeper than {MAX_DEPTH}"),
        # A node that requires itself has no finite value.
        ({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}, "deeper"),
    ],
)
def test_a_schema_without_a_value_is_refused_with_a_reason(schema: object, says: str) -> None:
    with pytest.raises(SchemaError, match=says.replace("$", r"\$").replace("(", r"\(")):
        value_for(schema)


def test_references_that_fan_out_are_refused_before_they_blow_up() -> None:
    # Ten required references to a schema of ten required references, 10 levels deep
    # (well within the depth bound): 10**10 values if generated.
    defs = {
        f"L{i}": {
            "type": "object",
            "properties": {f"p{k}": {"$ref": f"#/$defs/L{i + 1}"} for k in range(10)},
            "required": [f"p{k}" for k in range(10)],
        }
        for i in range(10)
    }
    defs["L10"] = {"type": "string"}
    with pytest.raises(SchemaError, match="over 10000 values"):
        value_for({"$ref": "#/$defs/L0", "$defs": defs})


def test_a_value_no_json_text_holds_is_refused() -> None:
    with pytest.raises(SchemaError, match="cannot be written as JSON"):
        json_for({"const": float("nan")})
    assert json.loads(json_for({"type": "object"})) == {}
