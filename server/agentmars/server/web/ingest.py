"""Event ingestion over HTTP: the receiving end of ``HttpSink``.

``ingest_router`` serves ``POST /v1/events`` (JSONL, or a JSON array of events)
into an ``EventHub``; ``create_collector_app`` wraps it into a standalone
collector. A batch is all-or-nothing: if any line fails to decode, none of it
is ingested and the 400 response lists every bad line, so a sender can fix and
resend the whole batch without creating duplicates; a body past
``DEFAULT_MAX_BODY_BYTES`` or an event past ``MAX_EVENT_BYTES`` is a 413, again with
nothing ingested. The hub keeps at most ``MAX_EVENTS`` events and ``MAX_KEPT_BYTES``.
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
from agentmars.sdk.http_guard import RequestGuard, guarded_server

log = logging.getLogger("agentmars.server")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""A ``POST /v1/events`` body's limit (413 past it): an ``HttpSink`` batch is far smaller."""
EVENTS_PATH = "/v1/events"

Subscriber = Callable[[Sequence[AnyEvent]], None]
"""Called with each accepted batch, on the thread that ingested it."""


MAX_EVENTS = 100_000
"""Events the hub keeps at most (the oldest go first)."""
MAX_KEPT_BYTES = 64 * 1024 * 1024
"""Bytes of events the hub keeps at most (``kept_size``; the oldest go first)."""
MAX_EVENT_BYTES = 1024 * 1024
"""Our choice: the largest event ``POST /v1/events`` takes (its JSON; a batch holding a
larger one is refused whole with 413). The schema's events are a few hundred bytes; a
megabyte leaves room for long error texts and metadata."""
EVENT_OVERHEAD_BYTES = 1024
"""What a kept event holds besides its JSON's bytes: the Python objects around it
(measured: a 240-byte ``tool_start`` takes about 1.5 KB as a decoded event)."""


def kept_size(event: AnyEvent) -> int:
    """What keeping ``event`` costs the hub, in bytes: its JSON plus the overhead."""
    return len(event.to_json()) + EVENT_OVERHEAD_BYTES


class EventTooLarge(ValueError):
    """An event posted from outside is larger than ``MAX_EVENT_BYTES``."""


class EventHub:
    """Thread-safe store of received events: keeps the latest ``max_events`` whose
    ``kept_size`` adds up to at most ``max_bytes`` (an event larger than that on its own
    is handed to the subscribers but not kept), counts all of them, and hands every
    accepted batch to its subscribers.

    Subscribers run outside the hub's store lock, on the publishing thread, one
    batch at a time: a batch reaches every subscriber before the next batch reaches
    any, so all of them see the stream in the order the hub stored it (a policy half's
    reaction, published from a subscriber on another thread, never overtakes its
    cause). One that raises is logged and does not affect ingestion or the others.
    """

    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = MAX_KEPT_BYTES) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._events: deque[tuple[AnyEvent, int]] = deque()
        self._kept_bytes = 0
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

    @property
    def kept_bytes(self) -> int:
        """The ``kept_size`` of the kept events, added up."""
        return self._kept_bytes

    def events(self) -> list[AnyEvent]:
        """A snapshot of the kept events, oldest first."""
        with self._lock:
            return [event for event, _ in self._events]

    def publish(self, events: Sequence[AnyEvent], sizes: Sequence[int] | None = None) -> None:
        """Keep and deliver ``events`` (``sizes``: their ``kept_size``, if known)."""
        if sizes is None:
            sizes = [kept_size(event) for event in events]
        with self._delivering:
            with self._lock:
                self._keep(events, sizes)
                self._count += len(events)
                subscribers = self._subscribers
                self._grew.notify_all()
            for subscriber in subscribers:
                try:
                    subscriber(events)
                except Exception:  # one bad consumer must not break ingestion
                    log.exception("agentmars event subscriber %r failed", subscriber)

    def _keep(self, events: Sequence[AnyEvent], sizes: Sequence[int]) -> None:
        for event, size in zip(events, sizes, strict=True):
            self._events.append((event, size))
            self._kept_bytes += size
        while len(self._events) > self.max_events or self._kept_bytes > self.max_bytes:
            self._kept_bytes -= self._events.popleft()[1]

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


def _sized(events: list[AnyEvent]) -> list[int]:
    """Each event's ``kept_size``; ``EventTooLarge`` if one is past ``MAX_EVENT_BYTES``."""
    sizes = [kept_size(event) for event in events]
    for number, size in enumerate(sizes, start=1):
        if size - EVENT_OVERHEAD_BYTES > MAX_EVENT_BYTES:
            raise EventTooLarge(
                f"event {number} of the batch is {size - EVENT_OVERHEAD_BYTES} bytes of JSON, "
                f"over the limit of {MAX_EVENT_BYTES} bytes per event; none were ingested"
            )
    return sizes


def _ingest(hub: EventHub, body: bytes) -> int:
    try:
        events = decode_batch(body)
        sizes = _sized(events)
    except BatchRejected as exc:
        raise HTTPException(status_code=400, detail=exc.detail) from None
    except EventTooLarge as exc:
        raise HTTPException(status_code=413, detail=str(exc)) from None
    hub.publish(events, sizes)
    return len(events)


def ingest_router(hub: EventHub, token: str) -> APIRouter:
    """``POST /v1/events``: authenticated, all-or-nothing batch ingestion. The body's
    size is bounded by the ``RequestGuard`` in front of the app (``create_collector_app``
    and the gateway put one there, ``DEFAULT_MAX_BODY_BYTES``), which reads no more."""
    expected = check_token(token)
    router = APIRouter()

    @router.post(EVENTS_PATH)
    async def ingest_events(request: Request) -> dict[str, int]:
        _check_bearer(request, expected)
        body = await request.body()
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
    """A standalone collector: ``POST /v1/events`` into ``app.state.hub`` and ``GET /healthz``;
    a request body past ``max_body_bytes`` gets 413 (``RequestGuard``)."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if hub is None:
        hub = EventHub()
    app = FastAPI(title="agentmars collector", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hub = hub
    app.include_router(ingest_router(hub, token))
    app.add_middleware(RequestGuard, max_body_bytes=max_body_bytes)
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

    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.web.ingest", description=main.__doc__
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback default)")
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        parser.error(f"set {TOKEN_ENV} to the token senders must present")
    guarded_server(create_collector_app(token), host=args.host, port=args.port).run()


if __name__ == "__main__":
    main()
