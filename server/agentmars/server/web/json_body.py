"""A request body that must be a JSON object: the gateway's and the twin's one reading of
it (each answers the ``BadBody`` with its own error, of the ``BadBody``'s status).

Parsing is bounded before it starts (issue 38): a body of 32 MiB could otherwise hold
eleven million empty objects, a gigabyte once parsed, and ``json.loads`` holds the GIL
all the while. A body holding more than ``MAX_JSON_CONTAINERS`` objects and arrays or
``MAX_JSON_VALUES`` values is refused with 413 (``BodyTooComplex``) without being parsed.
Nesting is bounded by the parser itself (a ``RecursionError`` past about 1,000 levels on
CPython 3.11, 1,500 on 3.12, is a 400 like any malformed body)."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_CONTAINERS = 100_000
"""Ours: the most objects and arrays a request body may hold. A message is one object
(its content parts and tool calls a few more): by our estimate a 5,000-message
conversation with its tools' schemas holds about 20,000. Parsed, 100,000 small objects
take about 25 MB and 0.1 s (100,000 two-key messages, on this project's 2-core machine)."""
MAX_JSON_VALUES = 300_000
"""Ours: the most values (objects, arrays, strings, numbers, literals; keys not counted;
an empty object or array counts as holding one) a request body may hold: by our
estimate a 5,000-message conversation holds about 50,000, and a prompt of token ids as
long as the longest context a shipped profile serves (262,144 tokens) fits. Parsed,
300,000 numbers take about 11 MB and 0.06 s."""
EXACT_COUNT_STRINGS = 100_000
"""A body whose quick count (its ``{``, ``[`` and ``,`` bytes, strings included) passes
a limit is counted again outside its strings (text full of braces and commas is not
structure), unless it holds more strings than this: such a body is refused on the quick
count."""
CHUNK_BYTES = 1 << 20
"""Bytes counted at a time: the quick count stops at the first chunk past a limit."""

_STRING = re.compile(rb'"[^"]*"')
"""A JSON string, once the escaped backslashes and quotes are gone (a one-byte class:
the regex engine's fast loop)."""


class BadBody(ValueError):
    """The body is not a JSON object; the message says why, ``status`` is the answer's."""

    status = 400


class BodyTooComplex(BadBody):
    """The body holds more objects, arrays or values than a request may (413)."""

    status = 413


def _marks(raw: bytes, start: int, end: int) -> tuple[int, int]:
    """The container-opening and value-separating bytes of ``raw[start:end]``."""
    return raw.count(b"{", start, end) + raw.count(b"[", start, end), raw.count(b",", start, end)


def _past_limits(containers: int, commas: int) -> str | None:
    if containers > MAX_JSON_CONTAINERS:
        return (
            f"request body holds more JSON objects and arrays than the {MAX_JSON_CONTAINERS} "
            f"a request may (agentmars' limit; a message is one)"
        )
    # values <= 1 + commas + containers: each value but a container's first follows a comma.
    if 1 + commas + containers > MAX_JSON_VALUES:
        return (
            f"request body holds more JSON values than the {MAX_JSON_VALUES} a request "
            f"may (agentmars' limit)"
        )
    return None


def _quick_count(raw: bytes) -> tuple[str | None, int]:
    """Why the body is past a limit, counting its marks wherever they are, and the end of
    the chunk where the count passed it; (None, its length) if it is within them."""
    containers = commas = 0
    for start in range(0, len(raw), CHUNK_BYTES):
        opened, separated = _marks(raw, start, start + CHUNK_BYTES)
        containers, commas = containers + opened, commas + separated
        if refusal := _past_limits(containers, commas):
            return refusal, start + CHUNK_BYTES
    return None, len(raw)


def _outside_strings(raw: bytes) -> bytes | None:
    """The bytes of a UTF-8 JSON text outside its strings, up to a string not closed
    (where the parser stops; a piece of a text cut inside a string, where the cut is);
    None if it holds more than ``EXACT_COUNT_STRINGS`` strings. In UTF-8, ``"`` and
    ``\\`` are only ever themselves, and within a string a run of backslashes is
    escaped pairs, the last one escaping the next byte if the run is odd."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    if text.count(b'"') > 2 * EXACT_COUNT_STRINGS:
        return None
    return _STRING.sub(b"", text).partition(b'"')[0]


def past_limits(raw: bytes) -> str | None:
    """Why a JSON body holds more than a request may (``MAX_JSON_CONTAINERS``,
    ``MAX_JSON_VALUES``), found without parsing it; None if it does not.

    First a quick count of the bytes that open a container or separate values, wherever
    they are: never fewer than the parser would build (in UTF-8, -16 and -32, which
    ``json.loads`` reads, each ``{``, ``[`` and ``,`` has its byte). Past a limit, a
    UTF-8 body with at most ``EXACT_COUNT_STRINGS`` strings is counted outside its
    strings, as the parser reads it: first the part up to where the quick count passed
    the limit (a part cut inside a string counts less than it holds, so past the limit
    it is past for the whole), then, if that did not settle it, the whole."""
    # A body of L bytes holds at most L / 2 containers and (L + 1) / 2 values.
    if len(raw) <= 2 * MAX_JSON_CONTAINERS:
        return None
    quick, passed_at = _quick_count(raw)
    if quick is None or json.detect_encoding(raw) != "utf-8":
        return quick
    for end in (passed_at, len(raw)) if passed_at < len(raw) else (len(raw),):
        bare = _outside_strings(raw[:end])
        if bare is None:
            return quick
        refusal, _ = _quick_count(bare)
        if refusal is not None:
            return refusal
    return None


def json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; ``BadBody`` (400) if it is not one, ``BodyTooComplex``
    (413) past ``MAX_JSON_CONTAINERS`` or ``MAX_JSON_VALUES``, checked before parsing."""
    refusal = past_limits(raw)
    if refusal is not None:
        raise BodyTooComplex(refusal)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadBody(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadBody("request body must be a JSON object")
    return body
