"""Pass-through to a real scripted engine on loopback, and the gateway's own errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV as TOKEN_ENV
from agentmars.sdk.events import LLMEnd
from agentmars.server.engines.scripted.app import create_scripted_llm_app
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.web.serving import free_loopback_port, serve_in_subprocess, serve_in_thread
from tests.server.gateway.conftest import MODEL, TOKEN, Engine, Gateway, GatewayFactory

CHAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi there"}],
    "max_tokens": 3,
}


def _sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_a_chat_completion_comes_back_as_the_engine_sent_it(gateway: Gateway) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
    assert body["usage"]["completion_tokens"] == 3


def test_a_text_completion_is_forwarded(gateway: Gateway) -> None:
    body = {"model": MODEL, "prompt": "one two", "max_tokens": 2}
    response = httpx.post(f"{gateway.url}/v1/completions", json=body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"] == "tok0 tok1 "


def test_a_stream_is_relayed_chunk_for_chunk(gateway: Gateway) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    data = _sse_data(response.text)
    # 3 token chunks, the finish chunk, [DONE]
    assert len(data) == 5 and data[-1] == "[DONE]"
    assert [json.loads(d)["choices"][0]["delta"].get("content") for d in data[:3]] == [
        "tok0 ",
        "tok1 ",
        "tok2 ",
    ]


def test_models_are_the_engines(gateway: Gateway) -> None:
    response = httpx.get(f"{gateway.url}/v1/models")
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == [MODEL]


def test_session_metadata_reaches_the_engine(engine: Engine, gateway: Gateway) -> None:
    body = {
        **CHAT,
        "messages": [*CHAT["messages"], {"role": "tool", "content": "42", "tool_call_id": "c"}],
        "vllm_xargs": {"turn": 4, "custom": "kept"},
    }
    headers = {"X-Session-ID": "sess-1"}
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers).is_success
    (seen,) = engine.requests
    assert seen.headers["x-session-id"] == "sess-1"
    assert seen.body["session_id"] == "sess-1"
    assert seen.body["priority"] == 0
    xargs = dict(seen.body["vllm_xargs"])
    assert len(xargs.pop("call_id")) == 32  # the gateway's, for a client that sent none
    assert xargs == {
        "custom": "kept",
        "session_id": "sess-1",
        "turn": 4,
        "follows_tool": 1,  # the context ends with a tool result
        "expects_tool": 0,  # no tools offered
    }


def test_a_call_of_no_session_reaches_the_engine_naming_none(
    engine: Engine, gateway: Gateway
) -> None:
    """Its one-call session is the gateway's own: named to the engine, it would let
    the plugin pin KV for a next call that never comes."""
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT).is_success
    (seen,) = engine.requests
    assert "x-session-id" not in seen.headers
    assert "session_id" not in seen.body
    assert seen.body["vllm_xargs"].keys() == {"call_id", "turn", "follows_tool", "expects_tool"}


def test_the_gateway_counts_turns_when_the_client_does_not(
    engine: Engine, gateway: Gateway
) -> None:
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    body = {**CHAT, "session_id": "s", "tools": tools, "priority": 3}
    for _ in range(2):
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body).is_success
    assert [r.body["vllm_xargs"]["turn"] for r in engine.requests] == [0, 1]
    assert all(r.body["vllm_xargs"]["expects_tool"] == 1 for r in engine.requests)
    assert all(r.body["priority"] == 3 for r in engine.requests)


def test_malformed_json_is_a_400_with_a_message(gateway: Gateway) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_bad_metadata_is_a_400(gateway: Gateway) -> None:
    cases = [
        ([1, 2], "JSON object"),
        ({**CHAT, "model": 5}, "'model' must be a string"),
        ({**CHAT, "priority": "high"}, "'priority' must be an integer"),
        ({**CHAT, "session_id": "a", "vllm_xargs": {"session_id": "b"}}, "different sessions"),
        ({**CHAT, "vllm_xargs": {"turn": -1}}, "turn"),
        ({**CHAT, "vllm_xargs": {"follows_tool": "yes"}}, "follows_tool"),
        ({**CHAT, "vllm_xargs": []}, "vllm_xargs must be a JSON object"),
        ({**CHAT, "session_id": ""}, "session_id"),
    ]
    for body, message in cases:
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
        assert response.status_code == 400, body
        assert message in response.json()["error"]["message"]


def test_an_unknown_model_is_a_404(engine: Engine, gateway: Gateway) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
    assert response.status_code == 404
    assert "'gpt-9' not found" in response.json()["error"]["message"]
    assert engine.requests == []  # refused at the gateway


def test_an_engine_4xx_is_passed_through(gateway: Gateway) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": MODEL})
    assert response.status_code == 400
    assert response.json() == {"detail": "chat completion needs a 'messages' list"}


def test_engine_down_is_a_503_within_a_second_and_the_gateway_recovers(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_loopback_port()
    with make_gateway(f"http://127.0.0.1:{port}") as gateway:
        for path, method in [("/v1/chat/completions", "POST"), ("/v1/models", "GET")]:
            start = time.monotonic()
            response = httpx.request(method, f"{gateway.url}{path}", json=CHAT)
            assert time.monotonic() - start < 1.0
            assert response.status_code == 503
            message = response.json()["error"]["message"]
            assert "not reachable" in message
            # The operator sees it in the gateway's log too.
            assert f"{method} {path}: 503 {message}" in caplog.text
        with serve_in_thread(create_scripted_llm_app(model=MODEL), port=port):
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
            assert response.status_code == 200


def test_the_model_list_is_asked_afresh_so_an_engine_gone_down_shows(
    make_gateway: GatewayFactory,
) -> None:
    port = free_loopback_port()
    with make_gateway(f"http://127.0.0.1:{port}") as gateway:
        with serve_in_thread(create_scripted_llm_app(model=MODEL), port=port):
            assert httpx.get(f"{gateway.url}/v1/models").status_code == 200
        # Within models_ttl_s of the 200: the list a completion checks is still cached.
        assert httpx.get(f"{gateway.url}/v1/models").status_code == 503


def test_a_connection_the_engine_dropped_is_retried_not_a_503(gateway: Gateway) -> None:
    # The scripted engine crashes on a non-list "messages" in a text completion: it
    # answers 500 and closes the connection the gateway would reuse next.
    crash = {"model": MODEL, "prompt": "x", "messages": 5}
    ok = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    with httpx.Client(base_url=gateway.url) as client:
        for _ in range(10):
            failed = client.post("/v1/completions", json=crash)
            assert failed.status_code == 502
            assert "HTTP 500" in failed.json()["error"]["message"]
            assert client.post("/v1/completions", json=ok).status_code == 200


async def _answered_the_model_list(scope: Scope, send: Send) -> bool:
    """What a test engine answers besides its calls: no lifespan, its model list."""
    if scope["type"] != "http":
        return True
    if scope["path"] != "/v1/models":
        return False
    body = json.dumps({"data": [{"id": MODEL}]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})
    return True


async def _broken_engine(scope: Scope, receive: Receive, send: Send) -> None:
    """An engine whose answers break off: it declares 1000 bytes and sends 12 (uvicorn
    then drops the connection)."""
    if await _answered_the_model_list(scope, send):
        return
    headers = [(b"content-length", b"1000"), (b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: {}\n\n..", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _lingering_engine(scope: Scope, receive: Receive, send: Send) -> None:
    """An engine whose stream stays open a while after its ``[DONE]`` (the response's
    end comes later), so a client that closes at ``[DONE]`` closes before it."""
    if await _answered_the_model_list(scope, send):
        return
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    piece = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    await send({"type": "http.response.body", "body": piece, "more_body": True})
    await asyncio.sleep(1.0)  # the lingering end, not a stand-in for work
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_a_client_that_closes_at_done_got_its_whole_answer(make_gateway: GatewayFactory) -> None:
    """The OpenAI client closes a stream at ``[DONE]`` without reading the response's
    end: the call is whole (``ok``) and its session goes on; it did not disconnect."""
    with serve_in_thread(_lingering_engine) as engine_url, make_gateway(engine_url) as gateway:
        for _ in range(2):
            with httpx.stream(
                "POST",
                f"{gateway.url}/v1/chat/completions",
                json={**CHAT, "stream": True},
                headers={"X-Session-ID": "s1"},
            ) as stream:
                assert "data: [DONE]" in stream.iter_lines()  # read up to it, then close
        deadline = time.monotonic() + 5.0
        while len(ends := [e for e in gateway.hub.events() if isinstance(e, LLMEnd)]) < 2:
            assert time.monotonic() < deadline, gateway.kinds()
            time.sleep(0.01)
        assert [e.status for e in ends] == ["ok", "ok"]
        assert "session_end" not in gateway.kinds()


def test_an_answer_that_breaks_off_is_a_502_or_a_cut_stream(make_gateway: GatewayFactory) -> None:
    with serve_in_thread(_broken_engine) as engine_url, make_gateway(engine_url) as gateway:
        whole = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
        assert whole.status_code == 502
        assert "broke off" in whole.json()["error"]["message"]
        stream = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": True})
        assert stream.status_code == 200  # it had gone out before the break
        *_, last = _sse_data(stream.text)
        assert "broke off" in json.loads(last)["error"]["message"]
        assert gateway.hub.wait_for_count(4, 2.0)
        ends = [e for e in gateway.hub.events() if isinstance(e, LLMEnd)]
        assert [e.status for e in ends] == ["error", "error"]


def test_the_gateway_runs_as_its_own_process(engine: Engine) -> None:
    argv = [sys.executable, "-m", "agentmars.server.gateway.app", "--upstream", engine.url]
    with serve_in_subprocess(argv, env={TOKEN_ENV: TOKEN}) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 200


def test_the_process_refuses_an_unknown_policy_or_no_token() -> None:
    base = [sys.executable, "-m", "agentmars.server.gateway.app", "--upstream", "http://x"]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    no_token = subprocess.run(base, env=env, capture_output=True, text=True, timeout=30)
    assert no_token.returncode == 2 and TOKEN_ENV in no_token.stderr
    unknown = subprocess.run(
        [*base, "--policy", "nope"],
        env={**env, TOKEN_ENV: TOKEN},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert unknown.returncode == 2 and "unknown policy 'nope'" in unknown.stderr


class RankedTools(AdmissionHalf):
    """Admits everyone; the session's tools go at its ``ranks`` entry (a session not
    in the table makes the half fail)."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks

    def tool_priority(self, session_id: str) -> int:
        return self.ranks[session_id]


class RankingTools(Policy):
    name = "test-ranking-tools"

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks

    def admission(self) -> RankedTools:
        return RankedTools(self.ranks)


@contextlib.contextmanager
def _ranking_gateway(engine: Engine, ranks: dict[str, int]) -> Iterator[Gateway]:
    config = GatewayConfig(upstream_url=engine.url, token=TOKEN)
    app = create_gateway_app(config, policy=RankingTools(ranks))
    with serve_in_thread(app) as url:
        yield Gateway(url, app)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": MODEL, "prompt": "one two", "max_tokens": 2}),
    ],
)
def test_every_answer_carries_the_sessions_tool_priority(
    engine: Engine, path: str, body: dict[str, Any], stream: bool
) -> None:
    with _ranking_gateway(engine, {"s7": 7, "s-2": -2}) as gw:
        for session, priority in (("s7", "7"), ("s-2", "-2")):
            call = {**body, "stream": stream, "session_id": session}
            response = httpx.post(f"{gw.url}{path}", json=call)
            assert response.status_code == 200
            assert response.headers["x-agentmars-tool-priority"] == priority


def test_an_engine_error_carries_the_tool_priority_too(engine: Engine) -> None:
    with _ranking_gateway(engine, {"s7": 7}) as gw:
        response = httpx.post(
            f"{gw.url}/v1/chat/completions", json={"model": MODEL, "session_id": "s7"}
        )
    assert response.status_code == 400
    assert response.headers["x-agentmars-tool-priority"] == "7"


def test_a_failing_tool_priority_says_0_and_the_call_still_ends(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with _ranking_gateway(engine, {}) as gw:
        response = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "session_id": "s"})
        assert response.status_code == 200
        assert response.headers["x-agentmars-tool-priority"] == "0"
        assert gw.kinds()[-1] == "llm_end"
        assert gw.app.state.gateway.admission.admitted["s"].in_flight == 0
    assert "tool_priority failed (policy test-ranking-tools)" in caplog.text
