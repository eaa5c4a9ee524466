"""The policy's admission at the gateway, and clients that leave mid-call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence

import httpx
import pytest

from agentmars.sdk.events import (
    AnyEvent,
    LLMEnd,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolStart,
)
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import AdmissionView, SessionView
from agentmars.server.web.serving import serve_in_thread
from tests.server.gateway.conftest import AUTH, MODEL, TOKEN, Engine, Gateway, GatewayFactory

LONG = 64
"""Tokens of a long reply: 20 ms + 63 x 10 ms = ~0.65 s on the scripted engine."""


class WindowOfOneAdmission(AdmissionHalf):
    """At most one admitted session at a time, first come first served."""

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        return list(queue[: max(0, 1 - view.active_sessions)])


@register
class WindowOfOne(Policy):
    """Test policy: its admission half lets in one session at a time."""

    name = "test-window-of-one"

    def admission(self) -> WindowOfOneAdmission:
        return WindowOfOneAdmission()


def _chat(session: str, max_tokens: int = 2, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": max_tokens,
        "session_id": session,
        "stream": stream,
    }


@pytest.fixture
def windowed(engine: Engine, make_gateway: GatewayFactory) -> Iterator[Gateway]:
    with make_gateway(engine.url, policy="test-window-of-one") as gw:
        yield gw


async def _end_session(client: httpx.AsyncClient, url: str, session: str) -> None:
    event = SessionEnd(session_id=session)
    response = await client.post(f"{url}/v1/events", content=event.to_json(), headers=AUTH)
    assert response.status_code == 200


async def test_fcfs_admits_every_session_at_once(gateway: Gateway) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        start = time.monotonic()
        calls = [
            client.post(f"{gateway.url}/v1/chat/completions", json=_chat(f"s{i}", LONG))
            for i in range(3)
        ]
        responses = await asyncio.gather(*calls)
    assert all(r.status_code == 200 for r in responses)
    assert time.monotonic() - start < 1.5  # concurrent: ~0.65 s, not 3 x 0.65 s


async def test_a_second_session_waits_until_the_first_ends(windowed: Gateway) -> None:
    url = windowed.url
    async with httpx.AsyncClient(timeout=5) as client:
        first = await client.post(f"{url}/v1/chat/completions", json=_chat("a"))
        assert first.status_code == 200
        second = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=_chat("b")))
        await asyncio.sleep(0.4)
        assert not second.done()  # "a" holds the window between its calls
        # "a"'s further calls go straight through: it is admitted
        again = await client.post(f"{url}/v1/chat/completions", json=_chat("a"))
        assert again.status_code == 200 and not second.done()
        await _end_session(client, url, "a")
        response = await asyncio.wait_for(second, 1.0)
        assert response.status_code == 200


async def test_a_sessionless_call_frees_the_window_when_it_ends(windowed: Gateway) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    async with httpx.AsyncClient(timeout=3) as client:
        for _ in range(2):  # the second would wait forever if the first held the window
            response = await client.post(f"{windowed.url}/v1/completions", json=body)
            assert response.status_code == 200


async def test_an_idle_session_is_let_go(engine: Engine, make_gateway: GatewayFactory) -> None:
    with make_gateway(engine.url, policy="test-window-of-one", session_idle_s=0.3) as gw:
        async with httpx.AsyncClient(timeout=3) as client:
            await client.post(f"{gw.url}/v1/chat/completions", json=_chat("a"))
            start = time.monotonic()
            response = await client.post(f"{gw.url}/v1/chat/completions", json=_chat("b"))
            assert response.status_code == 200
            # "a" idles out 0.3 s after its call; admission passes run every 0.1 s
            assert 0.15 <= time.monotonic() - start < 1.0
        # The gateway ended "a" itself, and says so on the stream for both halves.
        ends = [e for e in gw.hub.events() if isinstance(e, SessionEnd)]
        assert [(e.session_id, e.status, e.source) for e in ends] == [("a", "cancelled", "gateway")]
        assert "no call or tool for 0.3 s" in (ends[0].error or "")


async def test_a_client_leaving_mid_stream_aborts_the_engine_and_frees_the_window(
    engine: Engine, windowed: Gateway
) -> None:
    url = windowed.url
    async with httpx.AsyncClient(timeout=5) as client:
        request = client.build_request(
            "POST", f"{url}/v1/chat/completions", json=_chat("a", LONG, stream=True)
        )
        response = await client.send(request, stream=True)
        async for _ in response.aiter_lines():
            break  # one line of ~64, then hang up
        await response.aclose()
        start = time.monotonic()
        second = await client.post(f"{url}/v1/chat/completions", json=_chat("b"))
        assert second.status_code == 200
        assert time.monotonic() - start < 0.5  # well before "a"'s stream would have ended
    ends = [e for e in windowed.hub.events() if e.kind == "llm_end"]
    assert [(e.session_id, e.status) for e in ends] == [("a", "cancelled"), ("b", "ok")]
    # The agent is gone: the gateway ends its session on the stream (the engine's half
    # then forgets it and releases what it kept for it).
    over = [e for e in windowed.hub.events() if isinstance(e, SessionEnd)]
    assert [(e.session_id, e.status, e.source) for e in over] == [("a", "cancelled", "gateway")]
    await asyncio.sleep(0.8)  # past the end "a"'s stream would have had, had it run on
    # the engine started both completions and finished only "b"'s
    chat = "/v1/chat/completions"
    assert [p for p in engine.tracker.log.started if p == chat] == [chat, chat]
    assert [p for p in engine.tracker.log.finished if p == chat] == [chat]


async def test_a_client_leaving_while_it_waits_leaves_the_queue(windowed: Gateway) -> None:
    url = windowed.url
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(f"{url}/v1/chat/completions", json=_chat("a"))
        waiting = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=_chat("b")))
        await asyncio.sleep(0.3)
        admission = windowed.app.state.gateway.admission
        assert [w.session_id for w in admission.waiting.values()] == ["b"]
        waiting.cancel()
        await asyncio.sleep(0.3)
        assert admission.waiting == {}
        await _end_session(client, url, "a")
        response = await client.post(f"{url}/v1/chat/completions", json=_chat("c"))
        assert response.status_code == 200
        assert list(admission.admitted) == ["c"]


class RecordingAdmission(AdmissionHalf):
    """Admits everyone, remembers what it was shown."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []
        self.shown: list[tuple[str, str, int]] = []
        self.instances: list[tuple[str, str]] = []
        """Each session's agent instance and the text of its prompt."""

    @property
    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def on_event(self, event: AnyEvent) -> None:
        self.events.append(event)

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        self.shown += [(s.session_id, s.agent, s.prompt_tokens) for s in queue]
        self.instances += [(s.task_id, s.prompt_text) for s in queue]
        return queue


class Recording(Policy):
    """Test policy: its one admission half records what it sees (``half``)."""

    name = "test-recording"

    def __init__(self) -> None:
        self.half = RecordingAdmission()

    def admission(self) -> RecordingAdmission:
        return self.half


async def test_the_policy_sees_every_event_and_the_waiting_sessions(engine: Engine) -> None:
    policy = Recording()
    app = create_gateway_app(GatewayConfig(upstream_url=engine.url, token=TOKEN), policy=policy)
    with serve_in_thread(app) as url:
        async with httpx.AsyncClient(timeout=5) as client:
            start = SessionStart(session_id="s", agent="coder")
            await client.post(f"{url}/v1/events", content=start.to_json(), headers=AUTH)
            await client.post(f"{url}/v1/chat/completions", json=_chat("s"))
            await _end_session(client, url, "s")
            await client.get(f"{url}/healthz")  # the loop has run the queued callbacks
    assert policy.half.kinds == ["session_start", "llm_submit", "llm_end", "session_end"]
    # '[{"role": "user", "content": "go"}]' is 35 characters: 35 // 4 = 8 tokens
    assert policy.half.shown == [("s", "coder", 8)]
    assert policy.half.instances == [("s", "go")]  # no task: the session is its own


async def test_the_policy_sees_a_sessions_agent_instance_and_its_input(engine: Engine) -> None:
    policy = Recording()
    app = create_gateway_app(GatewayConfig(upstream_url=engine.url, token=TOKEN), policy=policy)
    body = _chat("t1.0") | {
        "messages": [
            {"role": "system", "content": "Verify each claim."},
            {"role": "user", "content": [{"type": "text", "text": "Claim 1. The sky is red."}]},
        ],
        "vllm_xargs": {"task_id": "t1"},
    }
    with serve_in_thread(app) as url:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.post(f"{url}/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert policy.half.instances == [("t1", "Verify each claim.\nClaim 1. The sky is red.")]


async def test_the_sdks_and_the_gateways_report_of_one_call_reach_the_policy_once(
    engine: Engine,
) -> None:
    # The SDK posts its own llm_submit / llm_end and names the call in vllm_xargs, so
    # the gateway records its events under the same call id: both reports go into the
    # stream, the admission half gets the first of each.
    policy = Recording()
    app = create_gateway_app(GatewayConfig(upstream_url=engine.url, token=TOKEN), policy=policy)
    ids = {"session_id": "s", "call_id": "c1", "turn": 0}
    with serve_in_thread(app) as url:
        async with httpx.AsyncClient(timeout=5) as client:
            submit = LLMSubmit(**ids, projected_prompt_tokens=8)
            await client.post(f"{url}/v1/events", content=submit.to_json(), headers=AUTH)
            body = {**_chat("s"), "vllm_xargs": {"call_id": "c1", "turn": 0}}
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            assert response.status_code == 200
            end = LLMEnd(**ids, output_tokens=2)
            await client.post(f"{url}/v1/events", content=end.to_json(), headers=AUTH)
            await _end_session(client, url, "s")
            await client.get(f"{url}/healthz")  # the loop has run the queued callbacks
    events = app.state.gateway.hub.events()
    assert [(e.kind, e.source, getattr(e, "call_id", None)) for e in events] == [
        ("llm_submit", "sdk", "c1"),
        ("llm_submit", "gateway", "c1"),
        ("llm_end", "gateway", "c1"),
        ("llm_end", "sdk", "c1"),
        ("session_end", "sdk", None),
    ]
    assert [(e.kind, e.source) for e in policy.half.events] == [
        ("llm_submit", "sdk"),
        ("llm_end", "gateway"),
        ("session_end", "sdk"),
    ]
    assert policy.half.events[0] == submit
    assert app.state.gateway.admission.feed.duplicates == 2


async def test_a_client_giving_up_on_a_whole_response_frees_the_window(
    windowed: Gateway,
) -> None:
    url = windowed.url
    async with httpx.AsyncClient(timeout=5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{url}/v1/chat/completions", json=_chat("a", LONG), timeout=0.2)
        start = time.monotonic()
        second = await client.post(f"{url}/v1/chat/completions", json=_chat("b"))
        assert second.status_code == 200
        assert time.monotonic() - start < 0.4  # "a"'s reply would take ~0.65 s
    ends = [e for e in windowed.hub.events() if e.kind == "llm_end"]
    assert [(e.session_id, e.status) for e in ends] == [("a", "cancelled"), ("b", "ok")]


async def test_a_session_stays_queued_while_one_of_its_calls_still_waits(
    windowed: Gateway,
) -> None:
    url = windowed.url
    admission = windowed.app.state.gateway.admission
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(f"{url}/v1/chat/completions", json=_chat("a"))
        calls = [
            asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=_chat("b")))
            for _ in range(2)
        ]
        await asyncio.sleep(0.3)
        calls[0].cancel()
        await asyncio.sleep(0.3)
        assert [(w.session_id, w.calls) for w in admission.waiting.values()] == [("b", 1)]
        await _end_session(client, url, "a")
        response = await asyncio.wait_for(calls[1], 1.0)
        assert response.status_code == 200


async def test_a_session_running_a_tool_does_not_idle_out(
    engine: Engine, make_gateway: GatewayFactory
) -> None:
    with make_gateway(engine.url, policy="test-window-of-one", session_idle_s=0.3) as gw:
        async with httpx.AsyncClient(timeout=5) as client:
            await client.post(f"{gw.url}/v1/chat/completions", json=_chat("a"))
            tool = {"session_id": "a", "call_id": "t", "tool": "pytest"}
            started = ToolStart(**tool).to_json()
            await client.post(f"{gw.url}/v1/events", content=started, headers=AUTH)
            second = asyncio.create_task(
                client.post(f"{gw.url}/v1/chat/completions", json=_chat("b"))
            )
            await asyncio.sleep(0.8)  # well past the idle timeout: "a" runs its tool
            assert not second.done()
            ended = ToolEnd(**tool, duration_s=0.8).to_json()
            await client.post(f"{gw.url}/v1/events", content=ended, headers=AUTH)
            start = time.monotonic()
            response = await asyncio.wait_for(second, 2.0)
            assert response.status_code == 200
            # "a" idles out 0.3 s after its tool ended (passes every 0.1 s)
            assert 0.2 <= time.monotonic() - start < 1.0
