"""HttpSink against real collectors on 127.0.0.1: delivery, outages, retries, shutdown."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from agentmars.sdk.calls import LLMCall, ToolCall
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import Event, SessionEvent, ToolStats, decode_jsonl
from agentmars.sdk.session import Session
from agentmars.sdk.sinks import HttpSink, MemorySink
from agentmars.sdk.sinks.http import HttpSinkStats, backoff_delay
from agentmars.server.web.ingest import EVENTS_PATH, EventHub, create_collector_app
from agentmars.server.web.serving import serve_in_thread

TOKEN = "test-token"


@pytest.fixture
def hub() -> EventHub:
    return EventHub()


@pytest.fixture
def collector_url(hub: EventHub) -> Iterator[str]:
    with serve_in_thread(create_collector_app(TOKEN, hub=hub)) as base:
        yield base + EVENTS_PATH


@pytest.fixture
def closed_url() -> str:
    """A loopback URL nobody listens on: the port was just bound and released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{EVENTS_PATH}"


class ScriptedCollector:
    """Answers POSTs with the given statuses in turn (200 once they run out) and keeps
    the events of the accepted ones."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.posts = 0
        self.accepted: list[Event] = []
        self.lock = threading.Lock()
        self.app = FastAPI()
        self.app.post(EVENTS_PATH)(self.receive)

    async def receive(self, request: Request) -> Response:
        body = await request.body()
        with self.lock:
            self.posts += 1
            status = self.statuses.pop(0) if self.statuses else 200
            if status == 200:
                self.accepted.extend(decode_jsonl(body).events)
        return Response(status_code=status)


def _stats_event(index: int) -> ToolStats:
    return ToolStats(active=index)


def _run_session(emitter: Emitter, turns: int) -> str:
    with Session(agent="test", emitter=emitter) as session:
        for _ in range(turns):
            with LLMCall("model", expects_tool=True) as llm:
                llm.first_token()
            with ToolCall("terminal"):
                pass
    return session.session_id


def _ids_by_session(events: Sequence[Event]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for event in events:
        assert isinstance(event, SessionEvent)
        grouped.setdefault(event.session_id, []).append(event.event_id)
    return grouped


# --- delivery -------------------------------------------------------------------


def test_every_event_of_concurrent_sessions_arrives_in_order(
    collector_url: str, hub: EventHub
) -> None:
    # A small batch size forces many full batches plus a partial last one.
    sink = HttpSink(collector_url, token=TOKEN, batch_size=7)
    memory = MemorySink()
    emitter = Emitter([sink, memory])
    threads = [threading.Thread(target=_run_session, args=(emitter, 10)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sink.flush(timeout_s=10)
    sink.close()

    emitted = len(memory.events)
    assert emitted == 4 * (2 + 10 * 6)
    assert sink.stats() == HttpSinkStats(
        sent=emitted, dropped=0, retries=0, failed_batches=0, queued=0
    )
    assert hub.count == emitted
    assert _ids_by_session(hub.events()) == _ids_by_session(memory.events)


def test_a_partial_batch_goes_out_after_the_flush_interval(
    collector_url: str, hub: EventHub
) -> None:
    sink = HttpSink(collector_url, token=TOKEN, batch_size=1000, flush_interval_s=0.02)
    try:
        for index in range(3):
            sink.emit(_stats_event(index))
        assert hub.wait_for_count(3, timeout_s=5)
    finally:
        sink.close()


def test_a_full_batch_goes_out_without_waiting_for_the_interval(
    collector_url: str, hub: EventHub
) -> None:
    sink = HttpSink(collector_url, token=TOKEN, batch_size=10, flush_interval_s=60)
    try:
        for index in range(10):
            sink.emit(_stats_event(index))
        assert hub.wait_for_count(10, timeout_s=5)
    finally:
        sink.close(timeout_s=1)


def test_close_delivers_what_is_queued(collector_url: str, hub: EventHub) -> None:
    sink = HttpSink(collector_url, token=TOKEN, batch_size=1000, flush_interval_s=60)
    for index in range(25):
        sink.emit(_stats_event(index))
    sink.close()
    assert hub.count == 25
    assert sink.stats().sent == 25


def test_the_token_is_sent_as_a_bearer_header(collector_url: str, hub: EventHub) -> None:
    # The collector answers 401 to any other token: a wrong one gets nothing through.
    wrong = HttpSink(collector_url, token="not-the-token")
    wrong.emit(_stats_event(0))
    wrong.close()
    right = HttpSink(collector_url, token=TOKEN)
    right.emit(_stats_event(1))
    right.close()

    assert wrong.stats().sent == 0 and wrong.stats().dropped == 1
    assert right.stats().sent == 1
    assert [e.active for e in hub.events() if isinstance(e, ToolStats)] == [1]


# --- outages ------------------------------------------------------------------------


def test_emit_stays_fast_while_the_collector_is_unreachable(closed_url: str) -> None:
    sink = HttpSink(closed_url, backoff_s=0.005)
    events = [_stats_event(i) for i in range(10_000)]
    durations = []
    started = time.perf_counter()
    for event in events:
        before = time.perf_counter_ns()
        sink.emit(event)
        durations.append(time.perf_counter_ns() - before)
    total_s = time.perf_counter() - started
    sink.close(timeout_s=5)

    durations.sort()
    assert total_s < 0.5
    assert durations[int(len(durations) * 0.99)] < 1_000_000
    stats = sink.stats()
    assert (stats.sent, stats.dropped, stats.queued) == (0, 10_000, 0)
    assert stats.retries > 0
    assert stats.failed_batches > 0


def test_a_full_queue_drops_at_emit_time(closed_url: str) -> None:
    # A batch larger than the queue and a long interval: the worker takes nothing,
    # so the queue holds exactly max_queue events and the rest are dropped by emit.
    sink = HttpSink(closed_url, batch_size=1000, max_queue=100, flush_interval_s=60)
    for index in range(150):
        sink.emit(_stats_event(index))
    queued = sink.stats()
    sink.close(timeout_s=0.5)

    assert (queued.queued, queued.dropped, queued.sent) == (100, 50, 0)
    assert sink.stats().dropped == 150


def test_close_gives_up_at_its_deadline_during_backoff(closed_url: str) -> None:
    # Four batches: the first is in backoff when close() starts, three still queued.
    sink = HttpSink(closed_url, batch_size=5, max_retries=10, backoff_s=5.0)
    for index in range(20):
        sink.emit(_stats_event(index))
    assert not sink.flush(timeout_s=0.1)
    started = time.monotonic()
    sink.close(timeout_s=0.3)
    assert time.monotonic() - started < 1.0
    stats = sink.stats()
    assert (stats.dropped, stats.queued, stats.sent) == (20, 0, 0)


# --- retries ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [503, 429])
def test_a_batch_is_delivered_after_retryable_failures(status: int) -> None:
    collector = ScriptedCollector([status, status])
    with serve_in_thread(collector.app) as base:
        sink = HttpSink(base + EVENTS_PATH, backoff_s=0.01)
        events = [_stats_event(i) for i in range(5)]
        for event in events:
            sink.emit(event)
        assert sink.flush(timeout_s=10)
        sink.close()

    stats = sink.stats()
    assert stats.retries == 2
    assert (stats.sent, stats.dropped, stats.failed_batches) == (5, 0, 0)
    assert collector.posts == 3
    assert collector.accepted == events


def test_a_batch_is_dropped_after_max_retries() -> None:
    collector = ScriptedCollector([500] * 10)
    with serve_in_thread(collector.app) as base:
        sink = HttpSink(base + EVENTS_PATH, max_retries=2, backoff_s=0.01)
        sink.emit(_stats_event(0))
        assert sink.flush(timeout_s=10)
        sink.close()

    assert collector.posts == 3
    stats = sink.stats()
    assert (stats.retries, stats.failed_batches, stats.dropped, stats.sent) == (2, 1, 1, 0)


def test_a_client_error_is_not_retried_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    collector = ScriptedCollector([400, 400])
    with serve_in_thread(collector.app) as base:
        sink = HttpSink(base + EVENTS_PATH, batch_size=1, backoff_s=0.01)
        with caplog.at_level(logging.WARNING, logger="agentmars.sdk"):
            sink.emit(_stats_event(0))
            sink.emit(_stats_event(1))
            assert sink.flush(timeout_s=10)
            sink.close()

    assert collector.posts == 2
    stats = sink.stats()
    assert (stats.retries, stats.failed_batches, stats.dropped, stats.sent) == (0, 2, 2, 0)
    assert len([r for r in caplog.records if "HTTP 400" in r.getMessage()]) == 1


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (10, 2.0)]:
        delays = [backoff_delay(attempt, 0.1) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


# --- configuration and lifecycle -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://127.0.0.1/x"}, "must start with http:// or https://"),
        ({"url": "127.0.0.1:8080/v1/events"}, "must start with http:// or https://"),
        ({"url": "http:///v1/events"}, "has no host"),
        ({"url": "http://127.0.0.1:99999/"}, "invalid port"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"max_queue": -5}, "max_queue must be an integer >= 1"),
        ({"max_retries": -1}, "max_retries must be an integer >= 0"),
        ({"flush_interval_s": 0.0}, "flush_interval_s must be a finite number of seconds > 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be a finite number of seconds > 0"),
        ({"timeout_s": float("nan")}, "timeout_s must be a finite number of seconds > 0"),
        ({"backoff_s": -0.1}, "backoff_s must be a finite number of seconds >= 0"),
        ({"token": ""}, "token must be a non-empty string"),
        ({"token": "two words"}, "without spaces"),
        ({"token": "line\nbreak"}, "printable ASCII"),
    ],
)
def test_bad_arguments_are_rejected_clearly(kwargs: dict[str, object], message: str) -> None:
    url = kwargs.pop("url", "http://127.0.0.1:9/v1/events")
    with pytest.raises(ValueError, match=message):
        HttpSink(url, **kwargs)


def test_emit_after_close_is_counted_not_raised(closed_url: str) -> None:
    sink = HttpSink(closed_url)
    sink.close(timeout_s=0.5)
    sink.emit(_stats_event(0))
    sink.emit(_stats_event(1))
    sink.close()  # a second close is harmless too

    assert sink.stats().dropped == 2
    assert sink.flush(timeout_s=0.1)


def test_the_sink_fits_the_emitter_without_errors(collector_url: str, hub: EventHub) -> None:
    sink = HttpSink(collector_url, token=TOKEN)
    emitter = Emitter([sink])
    session_id = _run_session(emitter, 2)
    emitter.close()

    assert emitter.sink_errors == {}
    assert hub.count == 2 + 2 * 6
    assert {e.session_id for e in hub.events() if isinstance(e, SessionEvent)} == {session_id}


def test_a_given_client_is_used_and_left_open(collector_url: str, hub: EventHub) -> None:
    with httpx.Client() as client:
        sink = HttpSink(collector_url, token=TOKEN, client=client)
        sink.emit(_stats_event(0))
        sink.close()
        assert not client.is_closed
        assert client.post(collector_url, content=b"").status_code == 401  # still usable
    assert hub.count == 1
