"""The side channel between the gateway and the scheduler plugin, both halves real: the
plugin's KV publisher and hint inbox (``engines/vllm/kv_status``, ``hints``: they import
no vLLM) on ZMQ ipc sockets, the gateway's ``PluginLink`` in a served gateway."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.events import (
    Event,
    KVStats,
    SessionEnd,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    ToolStats,
    encode_jsonl,
)
from agentmars.server.engines.vllm.hints import HintInbox
from agentmars.server.engines.vllm.kv_status import KVStatusPublisher
from agentmars.server.gateway.app import TOKEN_ENV
from agentmars.server.web.serving import serve_in_subprocess
from tests.server.gateway.conftest import AUTH, TOKEN, Engine, Gateway, GatewayFactory


@pytest.fixture
def addresses(tmp_path: Path) -> tuple[str, str]:
    return f"ipc://{tmp_path}/kv", f"ipc://{tmp_path}/hints"


@pytest.fixture
def linked(
    engine: Engine, make_gateway: GatewayFactory, addresses: tuple[str, str]
) -> Iterator[Gateway]:
    kv, hints = addresses
    with make_gateway(
        engine.url, policy="continuum", plugin_kv_address=kv, plugin_hints_address=hints
    ) as gateway:
        yield gateway


def _scrape(url: str) -> dict[tuple[str, str], float]:
    """Samples by (name, reason label or "")."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            samples[sample.name, sample.labels.get("reason", "")] = sample.value
    return samples


def _post(url: str, *events: Event) -> None:
    body = encode_jsonl(events)
    assert httpx.post(f"{url}/v1/events", content=body, headers=AUTH).status_code == 200


def _eventually(check: Callable[[], Any], timeout_s: float = 3.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return result


def test_kv_figures_reach_the_gateway_metrics(linked: Gateway, addresses: tuple[str, str]) -> None:
    figures = {"free": 50, "pinned": 6, "used": 13, "total": 63, "pins": 2}
    figures["released"] = {"expired": 3, "session_end": 1}
    publisher = KVStatusPublisher(lambda: figures, path=None, address=addresses[0], hz=20)
    try:
        scraped = _eventually(
            lambda: (s := _scrape(linked.url))[("agentmars_kv_total_blocks", "")] and s
        )
        assert scraped[("agentmars_kv_free_blocks", "")] == 50
        assert scraped[("agentmars_kv_used_blocks", "")] == 13
        assert scraped[("agentmars_kv_pinned_blocks", "")] == 6
        assert scraped[("agentmars_kv_pins", "")] == 2
        assert scraped[("agentmars_kv_pins_released_total", "expired")] == 3
        assert scraped[("agentmars_kv_pins_released_total", "session_end")] == 1
        # The admission's view reads the same figures (a window policy's input).
        view = linked.app.state.gateway.admission.view
        assert (view.total_blocks, view.free_blocks, view.pinned_blocks) == (63, 50, 6)
        figures["free"] = 40
        assert _eventually(lambda: _scrape(linked.url)[("agentmars_kv_free_blocks", "")] == 40)
    finally:
        publisher.stop()


def test_session_events_go_to_the_plugin_in_order_and_others_do_not(
    linked: Gateway, addresses: tuple[str, str]
) -> None:
    # The gateway is up before the plugin binds (as when vLLM restarts): its events
    # wait in the link's queue until the plugin's socket is there.
    sent = [
        ToolEnqueue(session_id="s", call_id="t1", tool="pytest"),
        ToolStart(session_id="s", call_id="t1", tool="pytest"),
        ToolStats(active=1),
        KVStats(total_blocks=10, free_blocks=10, used_blocks=0, pinned_blocks=0),
        ToolEnd(session_id="s", call_id="t1", tool="pytest", duration_s=1.5),
        SessionEnd(session_id="s", turns=3),
    ]
    _post(linked.url, *sent)
    assert linked.hub.wait_for_count(len(sent), 2.0)
    inbox = HintInbox(addresses[1])
    received: list[Any] = []

    def four_received() -> bool:
        received.extend(inbox.drain())
        return len(received) >= 4

    try:
        assert _eventually(four_received)
    finally:
        inbox.stop()
    # One socket keeps the order: a forwarded tool_stats or kv_stats would sit between.
    assert received == [sent[0], sent[1], sent[4], sent[5]]


def test_the_inbox_drops_what_is_no_event(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/hints"
    inbox = HintInbox(address)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(address)
    try:
        push.send(b"{not json")
        good = ToolEnd(session_id="s", call_id="t", tool="ls", duration_s=0.1)
        push.send(good.to_json().encode())
        events = _eventually(lambda: inbox.drain())
        assert events == [good]
        assert inbox.rejected == 1
    finally:
        push.close(linger=0)
        inbox.stop()
    assert not inbox.running


def test_the_gateway_process_links_to_the_plugin_by_its_flags(
    engine: Engine, addresses: tuple[str, str]
) -> None:
    kv, hints = addresses
    argv = [sys.executable, "-m", "agentmars.server.gateway.app", "--upstream", engine.url]
    argv += ["--plugin-kv-addr", kv, "--plugin-hints-addr", hints, "--block-size", "128"]
    figures = {"free": 7, "pinned": 0, "used": 0, "total": 7, "pins": 0}
    publisher = KVStatusPublisher(lambda: figures, path=None, address=kv, hz=20)
    inbox = HintInbox(hints)
    try:
        with serve_in_subprocess(argv, env={TOKEN_ENV: TOKEN}) as url:
            assert _eventually(lambda: _scrape(url)[("agentmars_kv_free_blocks", "")] == 7)
            _post(url, SessionEnd(session_id="s", turns=1))
            assert [e.kind for e in _eventually(inbox.drain)] == ["session_end"]
    finally:
        publisher.stop()
        inbox.stop()
