"""The bounds on a JSON request body, checked before it is parsed (issue 38): the quick
count of its marks, the count outside its strings that settles a quick count past a
limit, and what each refuses, against the counts of the parsed document."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentmars.server.web import json_body
from agentmars.server.web.json_body import (
    MAX_JSON_CONTAINERS,
    MAX_JSON_VALUES,
    BadBody,
    BodyTooComplex,
    json_object,
    past_limits,
)


def _messages(count: int, message: bytes = b"{}") -> bytes:
    return b'{"model":"m","messages":[' + b",".join([message] * count) + b"]}"


def test_a_million_empty_messages_are_refused_unparsed() -> None:
    with pytest.raises(BodyTooComplex, match=f"than the {MAX_JSON_CONTAINERS} a request"):
        json_object(_messages(1_000_000))
    assert BodyTooComplex.status == 413 and BadBody.status == 400


def test_the_limits_are_exact_for_objects_and_arrays() -> None:
    # The body itself and its list of messages are two of them.
    assert json_object(_messages(MAX_JSON_CONTAINERS - 2))["model"] == "m"
    with pytest.raises(BodyTooComplex):
        json_object(_messages(MAX_JSON_CONTAINERS - 1))


def test_values_past_the_limit_are_refused() -> None:
    # 1 (the body) + 2 members + the list's items: an empty container counts as one.
    within = b'{"model":"m","ids":[' + b",".join([b"7"] * (MAX_JSON_VALUES - 3)) + b"]}"
    assert len(json_object(within)["ids"]) == MAX_JSON_VALUES - 3
    with pytest.raises(BodyTooComplex, match=f"than the {MAX_JSON_VALUES} a request"):
        json_object(within.replace(b"[", b"[7,", 1))


def test_braces_and_commas_in_strings_are_text_not_structure() -> None:
    text = '{[,"\\\\"\\"' * (MAX_JSON_CONTAINERS + 1)  # escaped quotes and backslashes too
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    assert json_object(body.encode())["messages"][0]["content"] == text
    # ... also as one of many strings, and unescaped (ensure_ascii=False: raw UTF-8).
    many = {"m": ["é{[,"] * 1000 + [text]}
    assert json_object(json.dumps(many, ensure_ascii=False).encode()) == many


def test_past_as_many_strings_as_are_counted_exactly_the_quick_count_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(json_body, "EXACT_COUNT_STRINGS", 10)
    body = json.dumps({"m": ["{"] * (MAX_JSON_CONTAINERS + 1)}).encode()
    with pytest.raises(BodyTooComplex):
        json_object(body)


def test_other_encodings_are_counted_quickly_and_bounded_alike() -> None:
    # json.loads reads UTF-16 and -32 too: every { still has its byte.
    for encoding in ("utf-16", "utf-32-le"):
        with pytest.raises(BodyTooComplex):
            json_object(_messages(MAX_JSON_CONTAINERS).decode().encode(encoding))


def test_an_unclosed_string_ends_the_count_where_the_parser_stops() -> None:
    body = b'{"model":"m","x":"' + b"[" * (2 * MAX_JSON_CONTAINERS)
    with pytest.raises(BadBody, match="not valid JSON: Unterminated string") as refused:
        json_object(body)
    assert not isinstance(refused.value, BodyTooComplex)
    # What comes before it is counted: the parser builds that much before it fails.
    with pytest.raises(BodyTooComplex):
        json_object(_messages(MAX_JSON_CONTAINERS)[:-2] + b',"' + b"[" * 100)


def test_nesting_is_bounded_by_the_parser() -> None:
    deep = b'{"x":' + b"[" * 5_000 + b"]" * 5_000 + b"}"
    with pytest.raises(BadBody, match="maximum recursion depth"):
        json_object(deep)


# --- against the parsed document --------------------------------------------------------

LIMITS = {"MAX_JSON_CONTAINERS": 6, "MAX_JSON_VALUES": 14, "CHUNK_BYTES": 7}
"""Small limits and chunks, so that generated documents fall on both sides of them and
a count stops, and a part is cut, anywhere in a body."""

texts = st.text(st.sampled_from('{}[],:"\\ aé\n\u2028') | st.characters(codec="utf-8"), max_size=8)
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts, inner, max_size=5),
    max_leaves=30,
)


def _counts(value: Any) -> tuple[int, int]:
    """(objects and arrays, values) of a parsed document, as the bounds count them: an
    empty object or array counts as holding one value."""
    if isinstance(value, dict | list):
        items = list(value.values() if isinstance(value, dict) else value)
        parts = [_counts(item) for item in items]
        containers = 1 + sum(c for c, _ in parts)
        values = 1 + max(len(items), 1) - len(items) + sum(v for _, v in parts)
        return containers, values
    return 0, 1


@settings(max_examples=300)
@given(
    document=st.dictionaries(texts, documents, max_size=6),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
)
def test_a_body_is_refused_exactly_when_its_document_is_past_a_limit(
    document: dict[str, Any], ascii_only: bool, indent: int | None
) -> None:
    raw = json.dumps(document, ensure_ascii=ascii_only, indent=indent).encode()
    containers, values = _counts(document)
    past = containers > LIMITS["MAX_JSON_CONTAINERS"] or values > LIMITS["MAX_JSON_VALUES"]
    with pytest.MonkeyPatch.context() as patch:
        for name, limit in LIMITS.items():
            patch.setattr(json_body, name, limit)
        assert (past_limits(raw) is not None) == past, (containers, values)
