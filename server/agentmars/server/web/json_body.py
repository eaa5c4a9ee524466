"""A request body that must be a JSON object: the gateway's and the twin's one reading of
it (each answers the ``BadBody`` with its own 400)."""

from __future__ import annotations

import json
from typing import Any


class BadBody(ValueError):
    """The body is not a JSON object; the message says why."""


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadBody(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadBody("request body must be a JSON object")
    return body
