"""Bearer tokens shared by the agentmars HTTP endpoints and their clients."""

from __future__ import annotations

import hmac

GATEWAY_TOKEN_ENV = "AGENTMARS_GATEWAY_TOKEN"
"""The gateway's token for its event and control endpoints, for the gateway and the
clients that post to it."""

UNAUTHORISED = "missing or invalid bearer token: send 'Authorization: Bearer <token>'"


def check_token(token: str | None) -> bytes:
    """A token travels in a header: non-empty printable ASCII without spaces."""
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("token must be a non-empty string of printable ASCII without spaces")
    return token.encode("ascii")


def bearer_matches(authorization: str, expected: bytes) -> bool:
    """Constant-time check of an ``Authorization: Bearer <token>`` header value."""
    scheme, _, given = authorization.partition(" ")
    # Headers arrive latin-1 decoded; comparing bytes keeps compare_digest from
    # raising on non-ASCII input and stays constant-time.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("latin-1"), expected
    )
