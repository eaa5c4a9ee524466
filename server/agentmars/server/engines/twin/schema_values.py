"""A JSON value that a JSON schema accepts: the twin's synthetic tool-call arguments and
structured (``response_format``) answers.

The value is the smallest that the schema's shape asks for: an object holds its
``required`` properties only, an array one item, a string ``STRING``; ``const`` and
``enum`` (its first value) win over ``type``; of ``anyOf`` / ``oneOf`` / ``allOf`` the
first branch is taken; a local ``$ref`` (``#/$defs/...``, as pydantic writes nested
models) is followed. NOTE: ours — keywords that bound a value (``minimum``,
``minLength``, ``pattern``, ``minItems``, ...) are not read, so a schema that narrows a
type that way may get a value it refuses; agents' tool schemas (OpenHands', pydantic's)
ask for types, enums and nesting only. This is a generator, not a validator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

STRING = "lorem"
"""Every generated string (the first word of the twin's synthetic vocabulary)."""
SCALARS: dict[str, Any] = {
    "string": STRING,
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "null": None,
}
MAX_DEPTH = 32
"""Deepest nesting (``$ref`` hops count): a recursive schema that requires itself has no
finite value, and a client's schema must not exhaust the stack."""
MAX_VALUES = 10_000
"""Most values in one generated document: ``$ref``s can fan out exponentially (ten
required references to a schema of ten required references, ...)."""


class SchemaError(ValueError):
    """The schema is malformed, or no value can be made for it within the bounds."""


def value_for(schema: object) -> Any:
    """A JSON value (``json.dumps``-able) that ``schema`` accepts; ``SchemaError`` if
    none can be made."""
    return _Generator(schema).value(schema, 0)


def json_for(schema: object) -> str:
    """``value_for(schema)`` as JSON text."""
    value = value_for(schema)
    try:
        # A client's const or enum value may be NaN (Python's JSON reader takes it) or
        # nest too deep to write back: no JSON text holds either.
        return json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError) as error:
        raise SchemaError(f"the schema's value cannot be written as JSON: {error}") from None


class _Generator:
    def __init__(self, root: object) -> None:
        self.root = root
        self.budget = MAX_VALUES

    def value(self, schema: object, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SchemaError(f"the schema nests deeper than {MAX_DEPTH} levels")
        self.budget -= 1
        if self.budget < 0:
            raise SchemaError(f"the schema's smallest value holds over {MAX_VALUES} values")
        if schema is True:
            schema = {}
        if not isinstance(schema, Mapping):
            raise SchemaError(f"a schema must be an object or true, got {schema!r:.80}")
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return _first(schema["enum"], "enum")
        for branches in ("anyOf", "oneOf", "allOf"):
            if branches in schema:
                return self.value(_first(schema[branches], branches), depth + 1)
        kind = _type(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return [self.value(schema.get("items", True), depth + 1)]
        return SCALARS[kind]

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, Mapping):
            raise SchemaError("'properties' must be an object")
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise SchemaError("'required' must be a list of property names")
        return {name: self.value(properties.get(name, True), depth + 1) for name in required}

    def _resolve(self, ref: object) -> object:
        """The schema a local reference (``#``, ``#/$defs/Name``) points at."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local '$ref's ('#/...') are followed, got {ref!r:.80}")
        target = self.root
        for part in filter(None, ref[1:].split("/")):
            key = part.replace("~1", "/").replace("~0", "~")  # JSON pointer escapes
            if not isinstance(target, Mapping) or key not in target:
                raise SchemaError(f"'$ref' {ref!r:.80} points at nothing")
            target = target[key]
        return target


def _type(schema: Mapping[str, Any]) -> str:
    """The schema's type (the first of a list); without one, what its keywords imply."""
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        kind = kind[0]
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind not in ("object", "array", *SCALARS):
        raise SchemaError(f"unknown JSON schema type {kind!r:.80}")
    return str(kind)


def _first(options: object, keyword: str) -> Any:
    if not isinstance(options, list) or not options:
        raise SchemaError(f"'{keyword}' must be a non-empty list")
    return options[0]
