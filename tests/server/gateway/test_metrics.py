"""``/metrics`` of the gateway as a Prometheus client parses it: the contract's series
(docs/observability.md), each typed and documented and labelled with the policy and the
served model, figures that follow a scripted session's events, the operator's snapshot
equal to the gauges, and the engine's series merged in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.events import (
    Event,
    KVStats,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    WindowUpdate,
    encode_jsonl,
)
from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.gateway.operator_state import OperatorSnapshot
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost, load_profile
from agentmars.server.web.serving import serve_in_thread
from tests.server.gateway.conftest import AUTH, MODEL, Engine, Gateway, GatewayFactory
from tests.server.gateway.test_admission import WindowOfOne

SERIES = {
    "agentmars_admission_window_sessions": "gauge",
    "agentmars_admission_queue_sessions": "gauge",
    "agentmars_sessions": "gauge",
    "agentmars_kv_blocks": "gauge",
    "agentmars_kv_pinned_sessions": "gauge",
    "agentmars_kv_pins_released": "counter",
    "agentmars_tool_calls": "gauge",
    "agentmars_tool_cores": "gauge",
    "agentmars_llm_calls": "counter",
    "agentmars_engine_metrics_up": "gauge",
    "agentmars_admission_wait_seconds": "histogram",
    "agentmars_llm_time_to_first_token_seconds": "histogram",
    "agentmars_llm_request_duration_seconds": "histogram",
    "agentmars_session_duration_seconds": "histogram",
    "agentmars_tool_queue_wait_seconds": "histogram",
    "agentmars_tool_duration_seconds": "histogram",
}


class Scrape:
    """One ``/metrics`` answer, parsed."""

    def __init__(self, url: str) -> None:
        text = httpx.get(f"{url}/metrics", timeout=5).text
        self.families: dict[str, Any] = {}
        for family in text_string_to_metric_families(text):
            assert family.name not in self.families, f"{family.name} written twice"
            self.families[family.name] = family

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample ``name`` with ``labels`` (None: no such sample)."""
        found = [
            sample.value
            for family in self.families.values()
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        ]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else None

    def states(self, name: str) -> dict[str, float]:
        return {s.labels["state"]: s.value for s in self.families[name].samples}


def _post(url: str, *events: Event) -> None:
    body = encode_jsonl(events)
    assert httpx.post(f"{url}/v1/events", content=body, headers=AUTH).status_code == 200


def _chat(session: str, *, stream: bool = False, max_tokens: int = 2) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "session_id": session,
        "stream": stream,
        "max_tokens": max_tokens,
    }


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@pytest.fixture
def windowed(engine: Engine, make_gateway: GatewayFactory) -> Iterator[Gateway]:
    """One session admitted at a time (``WindowOfOne``)."""
    with make_gateway(engine.url, policy=WindowOfOne.name) as gw:
        yield gw


def test_every_series_is_typed_documented_and_labelled(gateway: Gateway) -> None:
    scrape = Scrape(gateway.url)
    for name, kind in SERIES.items():
        family = scrape.families[name]
        assert (family.type, bool(family.documentation)) == (kind, True), name
    for family in scrape.families.values():
        for sample in family.samples:
            assert sample.labels["policy"] == "fcfs", sample
            assert sample.labels["model_name"] == MODEL, sample  # learned from the engine
    # No sentinels: fcfs has no window, and the engine has sent no KV figures.
    for name in ("agentmars_admission_window_sessions", "agentmars_kv_blocks"):
        assert scrape.families[name].samples == [], name
    assert scrape.states("agentmars_sessions") == {"waiting": 0, "engine": 0, "tool": 0, "idle": 0}
    assert scrape.value("agentmars_llm_calls_total", status="error") == 0
    # The scripted engine has no /metrics of its own to merge.
    assert scrape.value("agentmars_engine_metrics_up") == 0


async def test_the_series_follow_a_scripted_session(windowed: Gateway) -> None:
    url = windowed.url
    operator = windowed.app.state.gateway.operator
    scrape = lambda: Scrape(url)  # noqa: E731
    chat = f"{url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=10) as client:
        _post(url, SessionStart(session_id="a"))
        # "a" streams a long answer: in the engine; "b" waits behind the window of one.
        a = asyncio.create_task(client.post(chat, json=_chat("a", stream=True, max_tokens=64)))
        await _until(lambda: scrape().states("agentmars_sessions")["engine"] == 1, "a in engine")
        b = asyncio.create_task(client.post(chat, json=_chat("b")))
        await _until(lambda: scrape().states("agentmars_sessions")["waiting"] == 1, "b waits")
        b_waits = time.monotonic()
        assert scrape().value("agentmars_admission_queue_sessions") == 1
        assert (await a).status_code == 200
        await _until(lambda: scrape().states("agentmars_sessions")["idle"] == 1, "a idle")
        # "a" runs a tool: queued, then running on a core, then done.
        _post(url, ToolEnqueue(session_id="a", call_id="t1", tool="pytest"))
        await _until(lambda: scrape().states("agentmars_sessions")["tool"] == 1, "a at a tool")
        assert scrape().states("agentmars_tool_calls") == {"queued": 1, "running": 0}
        _post(url, ToolStart(session_id="a", call_id="t1", tool="pytest", queue_wait_s=0.25))
        await _until(lambda: scrape().states("agentmars_tool_calls")["running"] == 1, "running")
        assert scrape().states("agentmars_tool_cores")["busy"] == 1
        # The sandbox and the SDK both report the end: one tool call.
        ends = [
            ToolEnd(session_id="a", call_id="t1", tool="pytest", duration_s=2.0, source=source)
            for source in ("sandbox", "sdk")
        ]
        _post(url, *ends)
        await _until(lambda: scrape().states("agentmars_sessions")["idle"] == 1, "a idle again")
        # Nothing moves now: the snapshot (read from here) and a scrape see the same.
        assert_snapshot_is_the_gauges(operator.snapshot(), scrape())
        # "a" ends: "b" is let in and answered.
        _post(url, SessionEnd(session_id="a", turns=1))
        b_waited = time.monotonic() - b_waits
        assert (await asyncio.wait_for(b, 5)).status_code == 200

    final = scrape()
    assert final.states("agentmars_sessions") == {"waiting": 0, "engine": 0, "tool": 0, "idle": 1}
    count = final.value
    assert count("agentmars_llm_calls_total", status="ok") == 2
    assert count("agentmars_llm_request_duration_seconds_count") == 2
    assert count("agentmars_llm_time_to_first_token_seconds_count") == 1  # a's stream only
    assert count("agentmars_admission_wait_seconds_count") == 2
    # "b" waited at least from when it was seen waiting to when "a" ended.
    assert (count("agentmars_admission_wait_seconds_sum") or 0) >= b_waited
    assert count("agentmars_session_duration_seconds_count") == 1
    assert count("agentmars_tool_queue_wait_seconds_count", tool="pytest") == 1
    assert count("agentmars_tool_queue_wait_seconds_sum", tool="pytest") == 0.25
    assert count("agentmars_tool_duration_seconds_count", tool="pytest") == 1
    assert count("agentmars_tool_duration_seconds_sum", tool="pytest") == 2.0
    percentiles = operator.snapshot().admission_wait_s
    assert percentiles.count == 2 and percentiles.p50 is not None


def assert_snapshot_is_the_gauges(snapshot: OperatorSnapshot, scrape: Scrape) -> None:
    """What the snapshot says is what the gauges say (taken while nothing moves)."""
    assert snapshot.sessions == scrape.states("agentmars_sessions")
    assert snapshot.tool_calls == scrape.states("agentmars_tool_calls")
    assert snapshot.tool_cores == scrape.states("agentmars_tool_cores")
    assert snapshot.admission_queue == scrape.value("agentmars_admission_queue_sessions")
    assert snapshot.ttft_s.count == scrape.value("agentmars_llm_time_to_first_token_seconds_count")
    assert snapshot.llm_calls == {
        status: scrape.value("agentmars_llm_calls_total", status=status)
        for status in snapshot.llm_calls
    }


def test_kv_and_window_follow_the_stream(gateway: Gateway) -> None:
    _post(
        gateway.url,
        KVStats(total_blocks=100, free_blocks=60, used_blocks=40, pinned_blocks=8, pins=2),
        WindowUpdate(window=7, previous=8),
    )
    assert gateway.hub.wait_for_count(2, 2.0)
    deadline = time.monotonic() + 5
    while (scrape := Scrape(gateway.url)).value("agentmars_admission_window_sessions") != 7:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert scrape.states("agentmars_kv_blocks") == {"free": 60, "used": 32, "pinned": 8}
    assert scrape.value("agentmars_kv_pinned_sessions") == 2
    snapshot = gateway.app.state.gateway.operator.snapshot()
    assert snapshot.kv_blocks == scrape.states("agentmars_kv_blocks")
    assert (snapshot.window, snapshot.kv_pinned_sessions) == (7, 2)


def test_calls_are_counted_by_outcome(gateway: Gateway) -> None:
    httpx.post(f"{gateway.url}/v1/chat/completions", json=_chat("s"))
    httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": MODEL})  # engine's 400
    scrape = Scrape(gateway.url)
    assert scrape.value("agentmars_llm_calls_total", status="ok") == 1
    assert scrape.value("agentmars_llm_calls_total", status="error") == 1
    assert scrape.value("agentmars_llm_calls_total", status="cancelled") == 0
    assert scrape.value("agentmars_llm_request_duration_seconds_count") == 2


@pytest.fixture
def twin_url() -> Iterator[str]:
    profile = load_profile("cpu-tiny").model_copy(
        update={"cost": FittedCost(c0=1e-3, c1=0.0, c2=0.0, c3=0.0, c4=0.0)}
    )
    with serve_in_thread(create_live_app(LiveEngine(profile, make_policy("fcfs")))) as url:
        yield url


def test_the_engines_series_come_with_the_gateways(
    twin_url: str, make_gateway: GatewayFactory
) -> None:
    with make_gateway(twin_url) as gateway:
        body = {"model": "cpu-tiny", "prompt": "hi", "max_tokens": 3, "stream": True}
        assert httpx.post(f"{gateway.url}/v1/completions", json=body).is_success
        scrape = Scrape(gateway.url)
    assert scrape.value("agentmars_engine_metrics_up", model_name="cpu-tiny") == 1
    assert scrape.families["vllm:time_to_first_token_seconds"].type == "histogram"
    assert scrape.value("vllm:time_to_first_token_seconds_count") == 1
    assert scrape.value("agentmars_llm_time_to_first_token_seconds_count") == 1
    # The engine's first token comes before the gateway relays it.
    engine_ttft = scrape.value("vllm:time_to_first_token_seconds_sum") or 0
    assert 0 < engine_ttft <= (scrape.value("agentmars_llm_time_to_first_token_seconds_sum") or 0)
