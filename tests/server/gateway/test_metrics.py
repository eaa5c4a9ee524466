"""``/metrics``: the gateway's figures in its own Prometheus registry."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.events import (
    Event,
    KVStats,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    WindowUpdate,
    encode_jsonl,
)
from tests.server.gateway.conftest import AUTH, MODEL, Gateway


def _scrape(url: str) -> dict[str, float]:
    """Samples by name, each checked to carry the fcfs policy label."""
    text = httpx.get(f"{url}/metrics").text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("agentmars_") and "status" not in sample.labels:
                assert sample.labels == {"policy": "fcfs"}, sample
                samples[sample.name] = sample.value
    return samples


def _post(url: str, *events: Event) -> None:
    body = encode_jsonl(events)
    assert httpx.post(f"{url}/v1/events", content=body, headers=AUTH).status_code == 200


def test_metrics_start_at_zero_with_no_window(gateway: Gateway) -> None:
    figures = _scrape(gateway.url)
    assert figures["agentmars_window"] == -1  # fcfs has no window
    for name in ("admission_queue", "active_sessions", "active_tools", "kv_free_blocks"):
        assert figures[f"agentmars_{name}"] == 0


def test_metrics_follow_sessions_tools_kv_and_window(gateway: Gateway) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "session_id": "s"}
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat).is_success
    _post(
        gateway.url,
        ToolEnqueue(session_id="s", call_id="t1", tool="pytest"),
        ToolEnqueue(session_id="s", call_id="t2", tool="ls"),
        ToolStart(session_id="s", call_id="t1", tool="pytest"),
        KVStats(total_blocks=100, free_blocks=60, used_blocks=40, pinned_blocks=8),
        WindowUpdate(window=7, previous=8),
    )
    assert gateway.hub.wait_for_count(7, 2.0)
    figures = _scrape(gateway.url)
    assert figures["agentmars_active_sessions"] == 1  # "s" stays admitted between calls
    assert figures["agentmars_active_tools"] == 1
    assert figures["agentmars_queued_tools"] == 1
    assert (figures["agentmars_kv_total_blocks"], figures["agentmars_kv_free_blocks"]) == (100, 60)
    assert (figures["agentmars_kv_used_blocks"], figures["agentmars_kv_pinned_blocks"]) == (40, 8)
    assert figures["agentmars_window"] == 7
    _post(gateway.url, ToolEnd(session_id="s", call_id="t1", tool="pytest", duration_s=2.0))
    assert gateway.hub.wait_for_count(8, 2.0)
    assert _scrape(gateway.url)["agentmars_active_tools"] == 0


def test_calls_are_counted_by_outcome(gateway: Gateway) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    httpx.post(f"{gateway.url}/v1/chat/completions", json=chat)
    httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": MODEL})  # engine's 400
    text = httpx.get(f"{gateway.url}/metrics").text
    assert 'agentmars_llm_calls_total{policy="fcfs",status="ok"} 1.0' in text
    assert 'agentmars_llm_calls_total{policy="fcfs",status="error"} 1.0' in text
