"""The collector's bounds (issue 10): the hub's bytes, one event's size, slow clients of
the collector's own process."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import Sequence

import httpx
import pytest

from agentmars.sdk.events import AnyEvent, SessionStart
from agentmars.sdk.http_guard import HEADER_TIMEOUT_S
from agentmars.server.web.ingest import (
    EVENTS_PATH,
    MAX_EVENT_BYTES,
    TOKEN_ENV,
    EventHub,
    create_collector_app,
    kept_size,
)
from agentmars.server.web.serving import serve_in_subprocess, serve_in_thread

TOKEN = "bounds-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _blob_event(number: int, size: int) -> SessionStart:
    return SessionStart(session_id=f"s{number:03d}", metadata={"blob": "x" * size})


def test_the_hub_keeps_no_more_bytes_than_its_bound_and_counts_everything() -> None:
    events = [_blob_event(i, 10_000) for i in range(50)]
    bound = 10 * kept_size(events[0])
    hub = EventHub(max_bytes=bound)
    for event in events:
        hub.publish([event])
    assert hub.count == 50
    assert hub.events() == events[-10:]
    assert hub.kept_bytes == 10 * kept_size(events[0]) <= bound


def test_the_hub_bounds_events_by_count_and_by_bytes_whichever_comes_first() -> None:
    hub = EventHub(max_events=3, max_bytes=10**9)
    hub.publish([_blob_event(i, 10) for i in range(5)])
    assert [e.session_id for e in hub.events()] == ["s002", "s003", "s004"]


def test_an_event_larger_than_the_hub_reaches_subscribers_but_is_not_kept() -> None:
    hub = EventHub(max_bytes=5_000)
    seen: list[Sequence[AnyEvent]] = []
    hub.subscribe(seen.append)
    big = _blob_event(0, 10_000)
    hub.publish([big])
    assert seen == [[big]]
    assert hub.events() == [] and hub.kept_bytes == 0 and hub.count == 1


def test_the_hub_rejects_a_useless_byte_bound() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        EventHub(max_bytes=0)


def test_the_collector_answers_413_to_an_event_past_the_limit() -> None:
    hub = EventHub()
    fits = _blob_event(0, MAX_EVENT_BYTES - 1_000)
    too_big = _blob_event(1, MAX_EVENT_BYTES)
    with serve_in_thread(create_collector_app(TOKEN, hub=hub)) as url:
        refused = httpx.post(f"{url}{EVENTS_PATH}", content=too_big.to_json(), headers=AUTH)
        accepted = httpx.post(f"{url}{EVENTS_PATH}", content=fits.to_json(), headers=AUTH)
    assert refused.status_code == 413
    assert f"over the limit of {MAX_EVENT_BYTES} bytes per event" in refused.json()["detail"]
    assert accepted.json() == {"accepted": 1}
    assert hub.events() == [fits]


def test_the_collector_process_closes_a_connection_whose_headers_never_end() -> None:
    argv = [sys.executable, "-m", "agentmars.server.web.ingest"]
    with serve_in_subprocess(argv, env={TOKEN_ENV: TOKEN}) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=HEADER_TIMEOUT_S + 10) as sock:
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: c\r\n")  # and never the end
            started = time.monotonic()
            with contextlib.suppress(ConnectionResetError):  # closed, unread bytes or not
                assert sock.recv(1) == b""
            held = time.monotonic() - started
    assert HEADER_TIMEOUT_S - 1 < held < HEADER_TIMEOUT_S + 5
