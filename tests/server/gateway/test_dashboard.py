"""The dashboard's routes on a real gateway (in front of the scripted engine): the page
and its files under a policy that runs only them, the snapshot feed behind the token,
about a second apart, following the gateway's traffic, and ending when the gateway
stops. The page in a real browser: ``test_dashboard_browser.py``."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from agentmars.server.gateway.dashboard import MAX_FEEDS, SNAPSHOT_INTERVAL_S, SNAPSHOTS_PATH
from agentmars.server.gateway.operator_state import OperatorSnapshot
from tests.server.gateway.conftest import AUTH, MODEL, Gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_the_page_is_served_with_its_script_and_style_and_nothing_else_runs(
    gateway: Gateway,
) -> None:
    page = httpx.get(f"{gateway.url}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "default-src 'none'" in policy
    # Its script and style are files of the same origin: no inline code, no CDN.
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(sources) == ["/dashboard/dashboard.css", "/dashboard/dashboard.js", "/metrics"]
    assert "<script>" not in page.text and "style=" not in page.text
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        asset = httpx.get(f"{gateway.url}/dashboard/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert asset.headers["x-content-type-options"] == "nosniff"
    missing = httpx.get(f"{gateway.url}/dashboard/other.js")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "route_not_found"


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": "x"}])
def test_the_snapshots_need_the_token(gateway: Gateway, headers: dict[str, str]) -> None:
    response = httpx.get(gateway.url + SNAPSHOTS_PATH, headers=headers)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


class Feed:
    """The snapshot feed, read in a thread; ``snapshots`` grows as they come."""

    def __init__(self, url: str) -> None:
        self.snapshots: list[OperatorSnapshot] = []
        self.arrived: list[float] = []
        self.ended = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._reader.start()

    def _read(self, url: str) -> None:
        with httpx.stream("GET", url + SNAPSHOTS_PATH, headers=AUTH, timeout=10) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.snapshots.append(OperatorSnapshot.model_validate_json(line[6:]))
                    self.arrived.append(time.monotonic())
        self.ended.set()

    def wait_for(self, count: int, timeout_s: float) -> list[OperatorSnapshot]:
        deadline = time.monotonic() + timeout_s
        while len(self.snapshots) < count:
            assert time.monotonic() < deadline, f"{len(self.snapshots)} of {count} snapshots"
            time.sleep(0.02)
        return self.snapshots[:count]


@pytest.fixture
def feed(gateway: Gateway) -> Iterator[Feed]:
    feed = Feed(gateway.url)
    yield feed
    gateway.app.state.gateway.stopping = lambda: True  # ends the feed, as at shutdown
    assert feed.ended.wait(5)


def test_a_snapshot_comes_every_second_and_follows_the_traffic(
    gateway: Gateway, feed: Feed
) -> None:
    first, second = feed.wait_for(2, timeout_s=5)
    assert first.policy == "fcfs" and first.llm_calls == {"ok": 0, "error": 0, "cancelled": 0}
    gap = feed.arrived[1] - feed.arrived[0]
    assert SNAPSHOT_INTERVAL_S * 0.8 <= gap <= SNAPSHOT_INTERVAL_S * 3, gap
    assert second.wall_s - first.wall_s >= SNAPSHOT_INTERVAL_S * 0.8
    body = {**CHAT, "stream": True, "session_id": "s"}
    httpx.post(f"{gateway.url}/v1/chat/completions", json=body).raise_for_status()
    seen = len(feed.snapshots)
    (*_, after) = feed.wait_for(seen + 1, timeout_s=5)
    assert after.llm_calls["ok"] == 1 and after.ttft_s.count == 1
    assert after.ttft_s.p50 is not None and after.ttft_s.p50 >= 0.02  # the engine's 20 ms
    assert after.sessions == {"waiting": 0, "engine": 0, "tool": 0, "idle": 1}
    # A call answered whole has no first token; its duration is counted all the same.
    httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "session_id": "s"})
    (*_, whole) = feed.wait_for(len(feed.snapshots) + 1, timeout_s=5)
    assert (whole.ttft_s.count, whole.llm_call_s.count) == (1, 2)
    assert whole.llm_call_s.p50 is not None and whole.llm_call_s.p50 >= 0.02


def test_an_open_feed_ends_when_the_gateway_stops(gateway: Gateway, feed: Feed) -> None:
    feed.wait_for(1, timeout_s=5)
    stopped = time.monotonic()
    gateway.app.state.gateway.stopping = lambda: True
    # Looked at every 0.25 s: the feed does not hold up a graceful shutdown.
    assert feed.ended.wait(2) and time.monotonic() - stopped < 1.0


def test_feeds_past_the_limit_get_429_until_one_closes(gateway: Gateway) -> None:
    with httpx.Client(headers=AUTH, timeout=10) as client:

        def open_feed() -> httpx.Response:
            request = client.build_request("GET", gateway.url + SNAPSHOTS_PATH)
            return client.send(request, stream=True)

        feeds = [open_feed() for _ in range(MAX_FEEDS)]
        assert [f.status_code for f in feeds] == [200] * MAX_FEEDS
        refused = open_feed()
        assert refused.status_code == 429 and str(MAX_FEEDS) in refused.read().decode()
        feeds.pop().close()
        deadline = time.monotonic() + 5
        while (again := open_feed()).status_code == 429:
            assert time.monotonic() < deadline, "a closed feed never freed its place"
        for feed in (*feeds, again):
            feed.close()
