"""The gateway benchmark produces complete, sane figures (its target is not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmars.bench.gateway import _client, run
from agentmars.sdk.http_guard import Receive, Scope, Send
from agentmars.server.web.serving import serve_in_thread


def test_gateway_figures_are_complete_and_the_proxied_paths_are_the_longer(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gateway.json"
    result = run(30, out)
    assert json.loads(out.read_text()) == result
    assert (result["calls"], result["engine"], result["connections"]) == (
        30, "scripted", "keep-alive"
    )  # fmt: skip
    for proxy in ("gateway", "pass_through"):
        phase = result[proxy]
        for path in ("direct_ms", "through_ms"):
            assert 0 < phase[path]["p50"] <= phase[path]["p90"] <= phase[path]["p99"]
        # One more loopback hop and a proxy cannot be faster than going straight there.
        added = phase["through_ms"]["p50"] - phase["direct_ms"]["p50"]
        assert added > 0
        assert phase["added_p50_ms"] == pytest.approx(added)
    assert result["added_p50_ms"] == result["gateway"]["added_p50_ms"]
    assert result["passed"] == (result["added_p50_ms"] <= result["target_added_p50_ms"])


def test_an_engine_latency_shows_in_every_direct_call() -> None:
    result = run(20, None, engine_latency_ms=5)
    assert result["engine_latency_ms"] == 5
    for proxy in ("gateway", "pass_through"):
        phase = result[proxy]
        assert phase["direct_ms"]["p50"] >= 5
        assert phase["through_ms"]["p50"] > phase["direct_ms"]["p50"]


async def _client_port(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(scope["client"][1]).encode()})


@pytest.mark.parametrize(("fresh_connections", "connections"), [(False, 1), (True, 5)])
def test_calls_reuse_one_connection_unless_fresh_ones_are_asked_for(
    fresh_connections: bool, connections: int
) -> None:
    with serve_in_thread(_client_port) as url, _client(fresh_connections) as client:
        assert len({client.get(url).text for _ in range(5)}) == connections
