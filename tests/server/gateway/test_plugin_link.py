"""The side channel between the gateway and the scheduler plugin, both halves real: the
plugin's KV publisher and hint inbox (``engines/vllm/kv_status``, ``hints``: they import
no vLLM) on ZMQ ipc sockets, the gateway's ``PluginLink`` in a served gateway."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV as TOKEN_ENV
from agentmars.sdk.events import (
    AnyEvent,
    Event,
    KVPin,
    KVStats,
    SessionEnd,
    SessionPause,
    SessionResume,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    ToolStats,
    WindowUpdate,
    decode_event,
    encode_jsonl,
)
from agentmars.server.engines.vllm.hints import HintInbox
from agentmars.server.engines.vllm.kv_status import KVStatusPublisher
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.policies.capabilities import PolicyRefused
from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import AdmissionView, SessionView
from agentmars.server.web.serving import serve_in_subprocess
from tests.server.gateway.conftest import AUTH, MODEL, TOKEN, Engine, Gateway, GatewayFactory


class ListeningAdmission(AdmissionHalf):
    """Records every event it is handed; answers an engine's pause with a window."""

    def __init__(self) -> None:
        self.seen: list[AnyEvent] = []

    def on_event(self, event: AnyEvent) -> None:
        self.seen.append(event)
        if isinstance(event, SessionPause):
            reason = f"{event.session_id} paused"
            self.publish(WindowUpdate(window=1, previous=2, reason=reason, source="gateway"))

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        return queue


@register
class Listening(Policy):
    """Test policy: its admission half listens to the engine half's events."""

    name = "test-listening"

    def admission(self) -> ListeningAdmission:
        return ListeningAdmission()


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
    """Samples by (name, state or reason label or "")."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            label = sample.labels.get("state") or sample.labels.get("reason", "")
            samples[sample.name, label] = sample.value
    return samples


def _post(url: str, *events: Event) -> None:
    body = encode_jsonl(events)
    assert httpx.post(f"{url}/v1/events", content=body, headers=AUTH).status_code == 200


def _eventually(check: Callable[[], Any], timeout_s: float = 3.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return result


def _receive(inbox: HintInbox, count: int, settle_s: float = 0.3) -> list[AnyEvent]:
    """What the plugin's inbox gets: ``count`` events, and whatever else follows within
    ``settle_s`` (an event that should not have come shows up there)."""
    received: list[AnyEvent] = []

    def enough() -> bool:
        received.extend(inbox.drain())
        return len(received) >= count

    assert _eventually(enough), received
    time.sleep(settle_s)
    return received + inbox.drain()


def _figures(free: int, total: int, used: int = 0, pinned: int = 0, **more: Any) -> KVStats:
    """A ``kv_stats`` event as the plugin's snapshot makes it."""
    return KVStats(
        source="engine",
        total_blocks=total,
        free_blocks=free,
        used_blocks=used,
        pinned_blocks=pinned,
        **more,
    )


def _spy(half: AdmissionHalf) -> list[AnyEvent]:
    """The events the gateway hands ``half`` from now on (it still gets them)."""
    seen: list[AnyEvent] = []
    handle = half.on_event

    def on_event(event: AnyEvent) -> None:
        seen.append(event)
        handle(event)

    half.on_event = on_event  # type: ignore[method-assign]
    return seen


def _read_stream(url: str, want: int, out: list[AnyEvent], ready: threading.Event) -> None:
    with httpx.stream("GET", f"{url}/v1/events/stream", headers=AUTH, timeout=5) as response:
        for line in response.iter_lines():
            ready.set()  # the opening comment: subscribed
            if line.startswith("data: "):
                out.append(decode_event(line[6:]))
                if len(out) == want:
                    return


def _chat(session: str) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "session_id": session}


def test_kv_figures_reach_the_gateway_metrics(linked: Gateway, addresses: tuple[str, str]) -> None:
    released = {"expired": 3, "session_end": 1}
    figures = [_figures(50, 63, used=13, pinned=6, pins=2, released=released)]
    publisher = KVStatusPublisher(lambda: figures[0], path=None, address=addresses[0], hz=20)
    try:
        scraped = _eventually(
            lambda: (s := _scrape(linked.url)).get(("agentmars_kv_blocks", "free")) and s
        )
        assert scraped[("agentmars_kv_blocks", "free")] == 50
        assert scraped[("agentmars_kv_blocks", "used")] == 13 - 6  # the pinned apart
        assert scraped[("agentmars_kv_blocks", "pinned")] == 6
        assert scraped[("agentmars_kv_pinned_sessions", "")] == 2
        assert scraped[("agentmars_kv_pins_released_total", "expired")] == 3
        assert scraped[("agentmars_kv_pins_released_total", "session_end")] == 1
        # The admission half's view reads the same figures (a window policy's input).
        kv = linked.app.state.gateway.admission.view.kv
        assert (kv.total_blocks, kv.free_blocks, kv.pinned_blocks) == (63, 50, 6)
        figures[0] = figures[0].model_copy(update={"free_blocks": 40})
        assert _eventually(lambda: _scrape(linked.url)[("agentmars_kv_blocks", "free")] == 40)
    finally:
        publisher.stop()


def test_events_go_to_the_plugin_in_order_but_kv_figures_and_its_own_do_not(
    linked: Gateway, addresses: tuple[str, str]
) -> None:
    # The gateway is up before the plugin binds (as when vLLM restarts): its events
    # wait in the link's queue until the plugin's socket is there.
    sent = [
        ToolEnqueue(session_id="s", call_id="t1", tool="pytest"),
        ToolStart(session_id="s", call_id="t1", tool="pytest"),
        ToolStats(active=1),
        KVStats(total_blocks=10, free_blocks=10, used_blocks=0, pinned_blocks=0),
        SessionPause(session_id="other", source="engine", reason="thrashing"),
        ToolEnd(session_id="s", call_id="t1", tool="pytest", duration_s=1.5),
        SessionEnd(session_id="s", turns=3),
    ]
    _post(linked.url, *sent)
    assert linked.hub.wait_for_count(len(sent), 2.0)
    inbox = HintInbox(addresses[1])
    try:
        received = _receive(inbox, 5)
    finally:
        inbox.stop()
    # One socket keeps the order: a forwarded kv_stats or engine event would sit between.
    assert received == [sent[0], sent[1], sent[2], sent[5], sent[6]]


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
    figures = _figures(7, 7)
    publisher = KVStatusPublisher(lambda: figures, path=None, address=kv, hz=20)
    inbox = HintInbox(hints)
    try:
        with serve_in_subprocess(argv, env={TOKEN_ENV: TOKEN}) as url:
            assert _eventually(lambda: _scrape(url).get(("agentmars_kv_blocks", "free")) == 7)
            _post(url, SessionEnd(session_id="s", turns=1))
            assert [e.kind for e in _eventually(inbox.drain)] == ["session_end"]
    finally:
        publisher.stop()
        inbox.stop()


def test_the_engine_halfs_events_reach_the_stream_and_the_admission_half(
    engine: Engine, make_gateway: GatewayFactory, addresses: tuple[str, str]
) -> None:
    kv, hints = addresses
    publisher = KVStatusPublisher(lambda: _figures(10, 10), path=None, address=kv, hz=20)
    inbox = HintInbox(hints)
    try:
        with make_gateway(
            engine.url, policy="test-listening", plugin_kv_address=kv, plugin_hints_address=hints
        ) as gateway:
            admission = gateway.app.state.gateway.admission
            # PUB drops what it sends before the link subscribes: the figures say it has.
            assert _eventually(lambda: admission.view.kv is not None)
            streamed: list[AnyEvent] = []
            ready = threading.Event()
            reader = threading.Thread(target=_read_stream, args=(gateway.url, 2, streamed, ready))
            reader.start()
            assert ready.wait(5)
            pause = SessionPause(session_id="old", source="engine", reason="thrashing")
            publisher.send_event(pause)  # as the engine half's publish does
            reader.join(5)
            # The stream carries the engine's event and the admission half's answer (in
            # either order: each publisher's thread hands its batch to the stream).
            assert sorted(e.kind for e in streamed) == ["session_pause", "window_update"]
            assert pause in streamed
            window = next(e for e in streamed if isinstance(e, WindowUpdate))
            assert (window.source, window.reason) == ("gateway", "old paused")
            assert gateway.hub.events() == [pause, window]
            half = admission.half
            assert _eventually(lambda: window in half.seen)
            assert half.seen == [pause, window]  # once each; kv_stats stay with the link
            end = SessionEnd(session_id="s")
            _post(gateway.url, end)
            received = _receive(inbox, 2)
    finally:
        publisher.stop()
        inbox.stop()
    # The engine's own pause does not go back to it; the window and the SDK's end do.
    assert received == [window, end]


def test_thunderagent_holds_new_sessions_while_the_engine_has_one_paused(
    engine: Engine, make_gateway: GatewayFactory, addresses: tuple[str, str]
) -> None:
    # Two halves, two processes' worth of state: the engine half decides the pause and
    # the engine publishes it; the gateway's admission half only reads the stream.
    kv, hints = addresses
    publisher = KVStatusPublisher(lambda: _figures(100, 100), path=None, address=kv, hz=20)
    try:
        with (
            make_gateway(
                engine.url, policy="thunderagent", plugin_kv_address=kv, plugin_hints_address=hints
            ) as gateway,
            ThreadPoolExecutor(1) as pool,
        ):
            url = f"{gateway.url}/v1/chat/completions"
            admission = gateway.app.state.gateway.admission
            seen = _spy(admission.half)
            assert _eventually(lambda: admission.view.kv is not None)
            assert httpx.post(url, json=_chat("a"), timeout=2).status_code == 200
            pause = SessionPause(session_id="a", source="engine", reason="thrashing")
            publisher.send_event(pause)
            assert _eventually(lambda: pause in seen)
            call = pool.submit(httpx.post, url, json=_chat("b"), timeout=5)
            time.sleep(0.4)
            assert not call.done()  # "a" is paused: new programs wait
            assert list(admission.waiting) == ["b"]
            publisher.send_event(SessionResume(session_id="a", source="engine"))
            assert call.result(timeout=2).status_code == 200
            assert sorted(admission.admitted) == ["a", "b"]
    finally:
        publisher.stop()


def test_thunderagent_is_refused_at_start_without_kv_figures(
    engine: Engine, addresses: tuple[str, str]
) -> None:
    # Hints alone carry events to the engine but bring no KV figures back.
    for link in ({}, {"plugin_hints_address": addresses[1]}):
        config = GatewayConfig(upstream_url=engine.url, token=TOKEN, policy="thunderagent", **link)
        with pytest.raises(PolicyRefused, match="kv-figures"):
            create_gateway_app(config)
    argv = [sys.executable, "-m", "agentmars.server.gateway.app", "--upstream", engine.url]
    process = subprocess.run(
        [*argv, "--policy", "thunderagent"],
        env={**os.environ, TOKEN_ENV: TOKEN},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert process.returncode == 2
    assert "kv-figures" in process.stderr and "--plugin-kv-addr" in process.stderr


def test_an_event_queued_as_its_making_is_made_and_sent_by_the_publishers_thread(
    addresses: tuple[str, str],
) -> None:
    # The plugin hands the side channel the making of each kv_pin / kv_unpin (made on
    # the scheduler's thread, they cost schedule() time): the publisher's thread makes
    # and sends it under the event topic, with the figures and time given when queued.
    from agentmars.sdk.wire import EVENT_TOPIC

    kv, _ = addresses
    publisher = KVStatusPublisher(lambda: _figures(10, 10), path=None, address=kv, hz=20)
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, EVENT_TOPIC)
    subscriber.connect(kv)
    made_on: list[str] = []
    stamp = {"mono_ns": 5, "wall_ns": 7}

    def make() -> KVPin:
        made_on.append(threading.current_thread().name)
        return KVPin(session_id="s", blocks=3, source="engine", **stamp)

    try:
        deadline = time.monotonic() + 5
        # PUB drops what it sends before the subscription is seen: send until it is.
        while not subscriber.poll(100):
            assert time.monotonic() < deadline, "no event reached the subscriber"
            publisher.send_made(make)
        topic, payload = subscriber.recv_multipart()
    finally:
        subscriber.close(linger=0)
        publisher.stop()
    event = decode_event(payload)
    assert topic == EVENT_TOPIC and isinstance(event, KVPin)
    assert (event.session_id, event.blocks, event.mono_ns, event.wall_ns) == ("s", 3, 5, 7)
    assert set(made_on) == {"agentmars-kv-status"}
