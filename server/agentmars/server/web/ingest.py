"""Event ingestion over HTTP: the receiving end of ``HttpSink``.

``ingest_router`` serves ``POST /v1/events`` (JSONL, or a JSON array of events)
into an ``EventHub``; ``create_collector_app`` wraps it into a standalone
collector. A batch is all-or-nothing: if any line fails to decode, none of it
is ingested and the 400 response lists every bad line, so a sender can fix and
resend the whole batch without creating duplicates.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from agentmars.sdk.auth import UNAUTHORISED, bearer_matches, check_token
from agentmars.sdk.events import (
    AnyEvent,
    DecodedStream,
    EventError,
    LineError,
    UnknownEventVersion,
    decode_event,
    decode_jsonl,
)

log = logging.getLogger("agentmars.server")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
EVENTS_PATH = "/v1/events"

Subscriber = Callable[[Sequence[AnyEvent]], None]
"""Called with each accepted batch, on the thread that ingested it."""


class EventHub:
    """Thread-safe store of received events: keeps the latest ``max_events``,
    counts all of them, and hands every accepted batch to its subscribers.

    Subscribers run outside the hub's store lock, on the publishing thread, one
    batch at a time: a batch reaches every subscriber before the next batch reaches
    any, so all of them see the stream in the order the hub stored it (a policy half's
    reaction, published from a subscriber on another thread, never overtakes its
    cause). One that raises is logged and does not affect ingestion or the others.
    """

    def __init__(self, max_events: int = 100_000) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self._events: deque[AnyEvent] = deque(maxlen=max_events)
        self._count = 0
        self._subscribers: tuple[Subscriber, ...] = ()
        self._lock = threading.Lock()
        self._grew = threading.Condition(self._lock)
        # Reentrant: a subscriber may publish (a half's reaction) on the same thread.
        self._delivering = threading.RLock()

    @property
    def count(self) -> int:
        """Events received since the hub was made (including ones no longer kept)."""
        return self._count

    def events(self) -> list[AnyEvent]:
        """A snapshot of the kept events, oldest first."""
        with self._lock:
            return list(self._events)

    def publish(self, events: Sequence[AnyEvent]) -> None:
        with self._delivering:
            with self._lock:
                self._events.extend(events)
                self._count += len(events)
                subscribers = self._subscribers
                self._grew.notify_all()
            for subscriber in subscribers:
                try:
                    subscriber(events)
                except Exception:  # one bad consumer must not break ingestion
                    log.exception("agentmars event subscriber %r failed", subscriber)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it again."""
        with self._lock:
            self._subscribers = (*self._subscribers, subscriber)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

        return unsubscribe

    def wait_for_count(self, count: int, timeout_s: float) -> bool:
        """Block until ``count`` events have been received; False on timeout."""
        with self._lock:
            return self._grew.wait_for(lambda: self._count >= count, timeout_s)


# --- decoding -------------------------------------------------------------------


class BatchRejected(Exception):
    """A request body that cannot be ingested; ``detail`` becomes the 400 body."""

    def __init__(self, detail: dict[str, Any]) -> None:
        super().__init__(detail["message"])
        self.detail = detail


def _decode_array(body: bytes) -> DecodedStream:
    try:
        items = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BatchRejected({"message": f"body is not a valid JSON array: {exc}"}) from None
    if not isinstance(items, list):
        raise BatchRejected({"message": "body is not a JSON array"})
    result = DecodedStream()
    for number, item in enumerate(items, start=1):
        try:
            result.events.append(decode_event(item))
        except EventError as exc:
            result.errors.append(LineError(number, exc))
    return result


def _describe_errors(stream: DecodedStream, unit: str) -> dict[str, Any]:
    unknown = stream.unknown_versions
    malformed = [e for e in stream.errors if not isinstance(e.error, UnknownEventVersion)]
    first = stream.errors[0]
    return {
        "message": (
            f"{len(stream.errors)} of {len(stream.events) + len(stream.errors)} events "
            f"could not be decoded, so none were ingested; first: {unit} {first.line}: "
            f"{first.error}"
        ),
        "malformed": [{unit: e.line, "error": str(e.error)} for e in malformed],
        "unknown_versions": [
            # The version came out of the request's JSON, so it serializes back as is.
            {unit: e.line, "version": getattr(e.error, "version", None), "error": str(e.error)}
            for e in unknown
        ],
    }


def decode_batch(body: bytes) -> list[AnyEvent]:
    """Every event of a JSONL body (or JSON array body), or ``BatchRejected`` if any is bad."""
    is_array = body.lstrip()[:1] == b"["
    stream = _decode_array(body) if is_array else decode_jsonl(body)
    if stream.errors:
        raise BatchRejected(_describe_errors(stream, "item" if is_array else "line"))
    return stream.events


# --- HTTP -----------------------------------------------------------------------


def _check_bearer(request: Request, expected: bytes) -> None:
    if not bearer_matches(request.headers.get("authorization", ""), expected):
        raise HTTPException(401, UNAUTHORISED, headers={"WWW-Authenticate": "Bearer"})


def _too_large(limit: int) -> HTTPException:
    return HTTPException(status_code=413, detail=f"request body exceeds {limit} bytes")


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        return int(declared)
    except ValueError:
        raise HTTPException(status_code=400, detail="invalid Content-Length header") from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    # The declared length is only a hint (chunked bodies have none): count as we read.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _ingest(hub: EventHub, body: bytes) -> int:
    try:
        events = decode_batch(body)
    except BatchRejected as exc:
        raise HTTPException(status_code=400, detail=exc.detail) from None
    hub.publish(events)
    return len(events)


def ingest_router(
    hub: EventHub, token: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> APIRouter:
    """``POST /v1/events``: authenticated, size-limited, all-or-nothing batch ingestion."""
    expected = check_token(token)
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    router = APIRouter()

    @router.post(EVENTS_PATH)
    async def ingest_events(request: Request) -> dict[str, int]:
        _check_bearer(request, expected)
        body = await _read_body(request, max_body_bytes)
        # Decoding a large batch takes milliseconds of CPU: keep it off the event loop.
        accepted = await run_in_threadpool(_ingest, hub, body)
        return {"accepted": accepted}

    return router


async def _client_disconnected(request: Request, exc: Exception) -> JSONResponse:
    # Nobody reads this answer; it only keeps a vanished client from logging a 500.
    return JSONResponse(status_code=400, content={"detail": "client disconnected"})


def install_error_handlers(app: FastAPI) -> None:
    """Answer input-caused errors that escape a route with 4xx instead of 500: a
    client that goes away mid-body makes ``request.stream()`` raise."""
    app.add_exception_handler(ClientDisconnect, _client_disconnected)


def create_collector_app(
    token: str,
    *,
    hub: EventHub | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """A standalone collector: ``POST /v1/events`` into ``app.state.hub`` and ``GET /healthz``."""
    if hub is None:
        hub = EventHub()
    app = FastAPI(title="agentmars collector", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hub = hub
    app.include_router(ingest_router(hub, token, max_body_bytes=max_body_bytes))
    install_error_handlers(app)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "events": hub.count}

    return app


TOKEN_ENV = "AGENTMARS_COLLECTOR_TOKEN"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentmars.server.web.ingest``: a standalone collector process. The
    token comes from the environment, not the command line, where ``ps`` shows it."""
    import argparse
    import os

    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.web.ingest", description=main.__doc__
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback default)")
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        parser.error(f"set {TOKEN_ENV} to the token senders must present")
    uvicorn.run(create_collector_app(token), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
