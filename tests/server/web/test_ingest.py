"""The collector's ingest route and the EventHub behind it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentmars.sdk.events import AnyEvent, SessionStart, ToolStats, encode_jsonl
from agentmars.server.web.ingest import (
    EVENTS_PATH,
    EventHub,
    create_collector_app,
    ingest_router,
)

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def hub() -> EventHub:
    return EventHub()


@pytest.fixture
def client(hub: EventHub) -> Iterator[TestClient]:
    with TestClient(create_collector_app(TOKEN, hub=hub, max_body_bytes=4096)) as test_client:
        yield test_client


def _events(n: int) -> list[ToolStats]:
    return [ToolStats(active=i) for i in range(n)]


def _post(client: TestClient, body: bytes | str, headers: dict[str, Any] | None = None) -> Any:
    return client.post(EVENTS_PATH, content=body, headers=AUTH if headers is None else headers)


# --- authentication ----------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong-token"},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": b"Bearer \xff\xfe-not-ascii"},
    ],
    ids=["missing", "wrong", "other-scheme", "longer", "non-ascii"],
)
def test_requests_without_the_token_are_refused(
    client: TestClient, hub: EventHub, headers: dict[str, Any]
) -> None:
    response = _post(client, encode_jsonl(_events(2)), headers)
    assert response.status_code == 401
    assert "bearer token" in response.json()["detail"]
    assert response.headers["www-authenticate"] == "Bearer"
    assert hub.count == 0


def test_the_scheme_is_case_insensitive(client: TestClient, hub: EventHub) -> None:
    response = _post(client, encode_jsonl(_events(1)), {"authorization": f"bearer {TOKEN}"})
    assert response.status_code == 200
    assert hub.count == 1


def test_an_unusable_token_is_refused_at_setup(hub: EventHub) -> None:
    for token in ("", "has space", "tab\there"):
        with pytest.raises(ValueError, match="token"):
            ingest_router(hub, token)


# --- accepting ----------------------------------------------------------------------------


def test_a_jsonl_batch_is_accepted_whole(client: TestClient, hub: EventHub) -> None:
    events = _events(3)
    response = _post(client, encode_jsonl(events))
    assert response.status_code == 200
    assert response.json() == {"accepted": 3}
    assert hub.events() == events


def test_a_json_array_batch_is_accepted(client: TestClient, hub: EventHub) -> None:
    events = _events(2)
    body = "[" + ",".join(e.to_json() for e in events) + "]"
    response = _post(client, body)
    assert response.json() == {"accepted": 2}
    assert hub.events() == events


def test_blank_lines_and_crlf_are_tolerated(client: TestClient, hub: EventHub) -> None:
    events = _events(2)
    body = "\r\n\r\n".join(e.to_json() for e in events) + "\r\n"
    assert _post(client, body).json() == {"accepted": 2}
    assert hub.events() == events


def test_an_empty_batch_accepts_nothing(client: TestClient, hub: EventHub) -> None:
    assert _post(client, b"").json() == {"accepted": 0}
    assert hub.count == 0


def test_text_with_unicode_line_separators_is_one_event(client: TestClient, hub: EventHub) -> None:
    event = SessionStart(session_id="s", metadata={"note": "a\u2028b\u0085c"})
    assert _post(client, event.to_json().encode()).json() == {"accepted": 1}
    assert hub.events() == [event]


def test_healthz_reports_the_count(client: TestClient) -> None:
    _post(client, encode_jsonl(_events(4)))
    assert client.get("/healthz").json() == {"status": "ok", "events": 4}


# --- rejecting ----------------------------------------------------------------------------


def test_malformed_lines_are_named_and_nothing_is_ingested(
    client: TestClient, hub: EventHub
) -> None:
    good = _events(2)
    body = "\n".join(
        [good[0].to_json(), '{"v": 1, "kind": "tool_start"}', "not json", good[1].to_json()]
    )
    response = _post(client, body)

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "line 2" in detail["message"]
    assert "none were ingested" in detail["message"]
    assert [item["line"] for item in detail["malformed"]] == [2, 3]
    assert "session_id" in detail["malformed"][0]["error"]
    assert "not valid JSON" in detail["malformed"][1]["error"]
    assert detail["unknown_versions"] == []
    assert hub.count == 0


def test_unknown_versions_are_reported_separately(client: TestClient, hub: EventHub) -> None:
    newer = json.loads(_events(1)[0].to_json()) | {"v": 99}
    body = "\n".join([_events(1)[0].to_json(), json.dumps(newer)])
    response = _post(client, body)

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail["malformed"] == []
    [unknown] = detail["unknown_versions"]
    assert (unknown["line"], unknown["version"]) == (2, 99)
    assert "unknown event schema version 99" in unknown["error"]
    assert hub.count == 0


def test_bad_items_of_an_array_are_named_by_position(client: TestClient, hub: EventHub) -> None:
    body = "[" + _events(1)[0].to_json() + ', {"v": 1}, 7]'
    detail = _post(client, body).json()["detail"]
    assert [item["item"] for item in detail["malformed"]] == [2, 3]
    assert "item 2" in detail["message"]
    assert hub.count == 0


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2",
        b'{"v": 1, "kind": "tool_stats", "active": ' + b"1" * 5000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b"{" * 3000,
        b'{"v": 1, "kind": "tool_stats", "active": 1, "source": "\xff"}',
        b"\x00\x01\x02",
    ],
    ids=["truncated-array", "huge-int", "deep-array", "deep-object", "bad-utf8", "binary"],
)
def test_hostile_bodies_are_client_errors(hub: EventHub, body: bytes) -> None:
    with TestClient(create_collector_app(TOKEN, hub=hub)) as roomy:
        response = _post(roomy, body)
    assert response.status_code == 400
    assert isinstance(response.json()["detail"], dict | str)
    assert hub.count == 0


def test_an_oversized_body_is_refused(client: TestClient, hub: EventHub) -> None:
    body = encode_jsonl(_events(200))
    assert len(body) > 4096
    response = _post(client, body)
    assert response.status_code == 413
    assert "4096 bytes" in response.json()["detail"]
    assert hub.count == 0


def test_an_oversized_chunked_body_is_refused(client: TestClient, hub: EventHub) -> None:
    # No Content-Length: the limit must hold while reading.
    def chunks() -> Iterator[bytes]:
        for event in _events(200):
            yield (event.to_json() + "\n").encode()

    response = client.post(EVENTS_PATH, content=chunks(), headers=AUTH)
    assert response.status_code == 413
    assert hub.count == 0


async def test_a_client_vanishing_mid_body_is_not_a_server_error() -> None:
    app = create_collector_app(TOKEN)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": EVENTS_PATH,
        "raw_path": EVENTS_PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", AUTH["authorization"].encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"v": 1', "more_body": True},
        {"type": "http.disconnect"},
    ]
    incoming = iter(messages)
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(incoming)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 400


# --- the hub ---------------------------------------------------------------------------


def test_the_hub_keeps_the_latest_events_and_counts_all() -> None:
    hub = EventHub(max_events=3)
    events = _events(5)
    hub.publish(events[:2])
    hub.publish(events[2:])
    assert hub.count == 5
    assert hub.events() == events[2:]


def test_subscribers_get_each_batch_until_they_unsubscribe() -> None:
    hub = EventHub()
    seen: list[Sequence[AnyEvent]] = []
    unsubscribe = hub.subscribe(seen.append)
    first, second = _events(2), _events(1)
    hub.publish(first)
    unsubscribe()
    hub.publish(second)
    assert seen == [first]


def test_a_failing_subscriber_does_not_stop_the_others() -> None:
    hub = EventHub()
    seen: list[Sequence[AnyEvent]] = []

    def broken(events: Sequence[AnyEvent]) -> None:
        raise RuntimeError("consumer bug")

    hub.subscribe(broken)
    hub.subscribe(seen.append)
    hub.publish(_events(1))
    assert hub.count == 1
    assert len(seen) == 1


def test_wait_for_count_times_out_when_nothing_arrives() -> None:
    hub = EventHub()
    hub.publish(_events(1))
    assert not hub.wait_for_count(2, timeout_s=0.01)


def test_wait_for_count_wakes_as_soon_as_the_events_arrive() -> None:
    hub = EventHub()
    waiting = threading.Event()
    outcome: list[tuple[bool, float]] = []

    def wait() -> None:
        waiting.set()
        started = time.monotonic()
        outcome.append((hub.wait_for_count(2, timeout_s=30), time.monotonic() - started))

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiting.wait()
    hub.publish(_events(2))
    waiter.join()
    [(arrived, waited_s)] = outcome
    assert arrived
    assert waited_s < 5


def test_the_hub_rejects_a_useless_bound() -> None:
    with pytest.raises(ValueError, match="max_events"):
        EventHub(max_events=0)
