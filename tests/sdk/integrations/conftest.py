from __future__ import annotations

import os

# Before litellm is first imported: its cost map would be fetched from the internet.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agentmars import sdk
from agentmars.sdk.events import ToolEnqueue
from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.web.serving import serve_in_thread

from .scripted_responses import add_responses_route

# Latency the scripted server models; the recorded timings must reflect it.
LATENCY = ScriptedLatency(first_token_s=0.05, per_token_s=0.01)
TOOLS = [
    {
        "type": "function",
        "function": {"name": "run", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture(autouse=True)
def fresh_litellm_clients() -> None:
    """Each test's LiteLLM calls on new connections: LiteLLM caches its HTTP clients
    for the process, and a keep-alive connection an earlier test left in the pool can
    be closed by the server (its idle timeout) as this test reuses it. A full-suite
    run once hung in such a call until pytest's timeout (300 s; the call then failed
    with "Server disconnected without sending a response")."""
    import litellm

    litellm.in_memory_llm_clients_cache.flush_cache()


@dataclass
class LLMServer:
    url: str
    app: object

    @property
    def requests(self) -> list:
        return self.app.state.requests  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def llm_server() -> Iterator[LLMServer]:
    app = create_scripted_llm_app(LATENCY)
    add_responses_route(app, LATENCY)
    with serve_in_thread(app) as url:
        yield LLMServer(url, app)


class RankedTools(AdmissionHalf):
    """Admits everyone; a session's tools go at its ``ranks`` entry, else 0."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks

    def tool_priority(self, session_id: str) -> int:
        return self.ranks.get(session_id, 0)


class RankingTools(Policy):
    name = "test-sdk-ranking-tools"

    def __init__(self) -> None:
        self.ranks: dict[str, int] = {}

    def admission(self) -> RankedTools:
        return RankedTools(self.ranks)


@dataclass
class GatewayServer:
    url: str
    ranks: dict[str, int]
    """What the gateway's policy says of each session's tools; tests change it."""


@pytest.fixture(scope="module")
def gateway_server(llm_server: LLMServer) -> Iterator[GatewayServer]:
    """The real gateway in front of ``llm_server``, its policy ranking tools by table."""
    policy = RankingTools()
    config = GatewayConfig(upstream_url=llm_server.url, token="sdk-test-gateway-token")
    with serve_in_thread(create_gateway_app(config, policy=policy)) as url:
        yield GatewayServer(url, policy.ranks)


def enqueued_priorities(sink: sdk.MemorySink, session_id: str) -> list[int | None]:
    return [e.priority for e in sink.of_session(session_id) if isinstance(e, ToolEnqueue)]


@pytest.fixture
def events() -> sdk.MemorySink:
    return sdk.MemorySink()


@pytest.fixture
def emitter(events: sdk.MemorySink) -> sdk.Emitter:
    return sdk.Emitter([events])


def assert_call_recorded(
    sink: sdk.MemorySink, session_id: str, *, streamed: bool, n_tokens: int
) -> None:
    """The call's events are submit -> (first token) -> end with timings that
    reflect the server's modelled latency."""
    calls = [e for e in sink.of_session(session_id) if e.kind.startswith("llm_")]
    expected = ["llm_submit", *(["llm_first_token"] if streamed else []), "llm_end"]
    assert [e.kind for e in calls] == expected
    submit, end = calls[0], calls[-1]
    assert len({e.call_id for e in calls}) == 1
    assert end.status == "ok"
    assert end.duration_s == pytest.approx((end.mono_ns - submit.mono_ns) / 1e9)
    generation = LATENCY.first_token_s + LATENCY.per_token_s * (n_tokens - 1)
    assert end.duration_s >= generation
    if streamed:
        first = calls[1]
        assert submit.mono_ns < first.mono_ns < end.mono_ns
        assert first.ttft_s >= LATENCY.first_token_s
        assert first.ttft_s < end.duration_s
        # NOTE: how long after the first token the end comes is not checked: on a loaded
        # host the client reads the chunks late and together (the CI saw 10 ms where the
        # server spaced them over 40).
