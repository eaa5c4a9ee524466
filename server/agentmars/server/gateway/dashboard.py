"""The operator's live dashboard, served by the gateway (no build step, nothing from a
CDN): ``GET /dashboard`` is a page of plain HTML, CSS and JavaScript
(``static/dashboard.*``, package data) that draws the gateway's ``OperatorSnapshot``
(``operator_state.py``, the fold of the event stream ``/metrics`` reads too) as
``GET /dashboard/snapshots`` pushes it, one Server-Sent Event a second.

The token: the snapshots are guarded by the gateway's bearer token, as the event
stream is. A browser's ``EventSource`` cannot send an ``Authorization`` header, so the
page reads the token from the URL's fragment (``/dashboard#token=...``, which a browser
never sends to a server: it stays out of access logs, proxies and ``Referer``), keeps
it in the tab's ``sessionStorage``, drops it from the address bar, and reads the feed
with ``fetch`` and a stream reader, the token in the header. No cookie, so no request
another site makes carries it (nothing to forge, no CSRF), and another origin cannot
read the feed (no CORS headers; a cross-origin request with ``Authorization`` fails its
preflight). The page itself is code without data (like ``/docs``): served to anyone
who can reach the gateway (loopback by default), under a Content-Security-Policy that
runs only its own script and allows no framing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from agentmars.sdk.auth import UNAUTHORISED, bearer_matches, check_token
from agentmars.server.gateway.events import STOP_CHECK_S, OpenStreams
from agentmars.server.gateway.operator_state import OperatorSnapshot
from agentmars.server.web.client_watch import ClosingStreamingResponse

DASHBOARD_PATH = "/dashboard"
SNAPSHOTS_PATH = "/dashboard/snapshots"
SNAPSHOT_INTERVAL_S = 1.0
MAX_FEEDS = 16
"""Feeds open at once (ours: each takes a snapshot a second; a few people watching)."""
"""How often the feed sends a snapshot (a person watching reads no faster)."""
STATIC = Path(__file__).with_name("static")
"""The page's files (package data), found beside this module as the project's other
package data is (``importlib.resources`` fails on these namespace packages when they are
installed in editable mode)."""
ASSETS = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    # Only the page's own files, the feed from the same origin; no framing (clickjacking).
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> Response:
    body = (STATIC / name).read_bytes()
    return Response(body, media_type=ASSETS[name], headers=PAGE_HEADERS)


async def _snapshots(
    snapshot: Callable[[], OperatorSnapshot], stopping: Callable[[], bool]
) -> AsyncIterator[str]:
    """``data: <snapshot JSON>`` every ``SNAPSHOT_INTERVAL_S`` until the server stops
    (looked at every ``STOP_CHECK_S``, so an open page does not hold up shutdown)."""
    due = time.monotonic()
    while not stopping():
        now = time.monotonic()
        if now >= due:
            due = now + SNAPSHOT_INTERVAL_S  # a slow reader gets fewer, not a burst
            yield f"data: {snapshot().model_dump_json()}\n\n"
        await asyncio.sleep(min(STOP_CHECK_S, due - time.monotonic()))


def dashboard_router(
    snapshot: Callable[[], OperatorSnapshot],
    token: str,
    stopping: Callable[[], bool] = lambda: False,
) -> APIRouter:
    """``GET /dashboard`` (the page and its script and style) and ``GET
    /dashboard/snapshots`` (``snapshot()`` as SSE, bearer token)."""
    expected = check_token(token)
    router = APIRouter()
    feeds = OpenStreams(MAX_FEEDS)

    @router.get(DASHBOARD_PATH, summary="The live dashboard (open as /dashboard#token=...)")
    def page() -> Response:
        return _asset("dashboard.html")

    @router.get(DASHBOARD_PATH + "/dashboard.js", include_in_schema=False)
    def script() -> Response:
        return _asset("dashboard.js")

    @router.get(DASHBOARD_PATH + "/dashboard.css", include_in_schema=False)
    def style() -> Response:
        return _asset("dashboard.css")

    @router.get(SNAPSHOTS_PATH, summary="The operator's snapshot every second (SSE)")
    async def snapshots(request: Request) -> StreamingResponse:
        if not bearer_matches(request.headers.get("authorization", ""), expected):
            raise HTTPException(401, UNAUTHORISED, headers={"WWW-Authenticate": "Bearer"})
        if not feeds.open():
            raise HTTPException(429, f"{MAX_FEEDS} dashboard feeds are open; retry when one ends")
        return ClosingStreamingResponse(
            _snapshots(snapshot, stopping),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
            on_close=feeds.close,
        )

    return router
