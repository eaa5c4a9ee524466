"""The engine's routes beside the two completions, through the gateway: the Responses
API (the real ``openai`` client) and Anthropic's Messages API as LLM calls (session,
admission, events), vLLM's tokenizer, version and health passed through as they
are, and the OpenAI-style errors for an unknown route, a wrong method, a malformed
body and an engine that is down.

The engine is the scripted one (``conftest``) with vLLM's other routes added here, in
vLLM 0.32's answer formats; gateway and engine are real servers on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentmars.sdk.events import LLMEnd, LLMFirstToken, LLMSubmit
from agentmars.server.engines.scripted.app import RecordedRequest, create_scripted_llm_app
from agentmars.server.web.serving import free_loopback_port, serve_in_thread
from tests.server.gateway.conftest import MODEL, Gateway, GatewayFactory

USAGE = {"input_tokens": 7, "cached": 4, "output_tokens": 3}
"""What the engine reports for every call (7 prompt tokens, 4 of them cached)."""
TOOL = {"type": "function", "name": "ls", "parameters": {"type": "object"}}


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def _response(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    usage = {
        "input_tokens": USAGE["input_tokens"],
        "input_tokens_details": {"cached_tokens": USAGE["cached"]},
        "output_tokens": USAGE["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": USAGE["input_tokens"] + USAGE["output_tokens"],
    }
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": MODEL,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage if status == "completed" else None,
    }


async def _responses_stream(words: list[str], output: list[dict[str, Any]]) -> AsyncIterator[str]:
    yield _sse("response.created", {"response": _response("in_progress", [])})
    for i, word in enumerate(words):
        await asyncio.sleep(0.01)
        yield _sse(
            "response.output_text.delta",
            {
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": word,
                "sequence_number": i + 1,
                "logprobs": [],
            },
        )
    yield _sse("response.completed", {"response": _response("completed", output)})


def _anthropic_usage() -> dict[str, int]:
    return {
        "input_tokens": USAGE["input_tokens"] - USAGE["cached"],
        "cache_read_input_tokens": USAGE["cached"],
        "output_tokens": USAGE["output_tokens"],
    }


async def _messages_stream(words: list[str], stop: str) -> AsyncIterator[str]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": MODEL,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    yield _sse("message_start", {"message": message})
    yield _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
    for word in words:
        await asyncio.sleep(0.01)
        yield _sse(
            "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": word}}
        )
    yield _sse("content_block_stop", {"index": 0})
    yield _sse("message_delta", {"delta": {"stop_reason": stop}, "usage": _anthropic_usage()})
    yield _sse("message_stop", {})


def with_vllm_routes(app: FastAPI) -> FastAPI:
    """The scripted engine with vLLM's other routes: ``/v1/responses`` and
    ``/v1/messages`` answer ``max_*tokens`` words (a tool call when tools are offered),
    ``/tokenize`` one id per character (500 for the prompt "crash"), ``/detokenize``,
    ``/version``, ``/health``. Each request with a body is recorded, and its raw
    bytes in ``app.state.raw``."""
    app.state.raw = []

    async def recorded(request: Request) -> dict[str, Any]:
        raw = await request.body()
        app.state.raw.append(raw)
        body: dict[str, Any] = json.loads(raw)
        app.state.requests.append(RecordedRequest(request.url.path, dict(request.headers), body))
        return body

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await recorded(request)
        words = [f"tok{i} " for i in range(body.get("max_output_tokens") or 3)]
        output: list[dict[str, Any]]
        if body.get("tools"):
            output = [
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "ls",
                    "arguments": "{}",
                    "status": "completed",
                }
            ]
        else:
            text = {"type": "output_text", "text": "".join(words), "annotations": []}
            output = [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [text],
                }
            ]
        if body.get("stream"):
            return StreamingResponse(
                _responses_stream(words, output), media_type="text/event-stream"
            )
        return JSONResponse(_response("completed", output))

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = await recorded(request)
        words = [f"tok{i} " for i in range(body.get("max_tokens") or 3)]
        stop = "tool_use" if body.get("tools") else "max_tokens"
        if body.get("stream"):
            return StreamingResponse(_messages_stream(words, stop), media_type="text/event-stream")
        content = [{"type": "text", "text": "".join(words)}]
        return JSONResponse(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": content,
                "stop_reason": stop,
                "usage": _anthropic_usage(),
            }
        )

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        prompt = (await recorded(request)).get("prompt")
        if not isinstance(prompt, str):
            error = {"message": "'prompt' is required", "type": "BadRequestError", "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        if prompt == "crash":
            return JSONResponse({"error": {"message": "tokenizer died"}}, status_code=500)
        tokens = [ord(c) for c in prompt]
        return JSONResponse({"count": len(tokens), "max_model_len": 1024, "tokens": tokens})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        tokens = (await recorded(request))["tokens"]
        return JSONResponse({"prompt": "".join(map(chr, tokens))})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": "0.32.0"})

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)  # vLLM's: no body, no content type

    return app


@pytest.fixture
def engine_app() -> FastAPI:
    return with_vllm_routes(create_scripted_llm_app(model=MODEL))


@pytest.fixture
def engine_url(engine_app: FastAPI) -> Iterator[str]:
    with serve_in_thread(engine_app) as url:
        yield url


@pytest.fixture
def gw(engine_url: str, make_gateway: GatewayFactory) -> Iterator[Gateway]:
    with make_gateway(engine_url) as gateway:
        yield gateway


def _seen(engine_app: FastAPI) -> list[RecordedRequest]:
    return list(engine_app.state.requests)


def _events(gateway: Gateway, kind: type[Any]) -> list[Any]:
    return [e for e in gateway.hub.events() if isinstance(e, kind)]


# --- the Responses API ---------------------------------------------------------------


def test_a_response_reaches_the_engine_with_its_session_and_comes_back(
    engine_app: FastAPI, gw: Gateway
) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused")
    for _ in range(2):
        reply = client.responses.create(
            model=MODEL, input="list the files", prompt_cache_key="conv-1", max_output_tokens=2
        )
        assert reply.output_text == "tok0 tok1 "
        assert reply.usage is not None and reply.usage.input_tokens == 7
    first, second = _seen(engine_app)
    assert first.path == "/v1/responses"
    assert first.headers["x-session-id"] == first.body["session_id"] == "conv-1"
    assert first.body["prompt_cache_key"] == "conv-1"  # the rest of the body as it came
    assert first.body["input"] == "list the files" and first.body["max_output_tokens"] == 2
    xargs = dict(first.body["vllm_xargs"])
    assert len(xargs.pop("call_id")) == 32
    assert xargs == {"session_id": "conv-1", "turn": 0, "follows_tool": 0, "expects_tool": 0}
    assert second.body["vllm_xargs"]["turn"] == 1  # one session, counted by the gateway


def test_a_response_records_the_call_with_its_tokens(engine_app: FastAPI, gw: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused")
    reply = client.responses.create(
        model=MODEL,
        input=[{"type": "function_call_output", "call_id": "call_0", "output": "a.txt"}],
        instructions="be brief",
        tools=[TOOL],  # type: ignore[list-item]
        extra_headers={"X-Session-ID": "agent-7"},
    )
    assert reply.output[0].type == "function_call"
    (submit,) = _events(gw, LLMSubmit)
    assert (submit.session_id, submit.operation, submit.stream) == ("agent-7", "chat", False)
    assert (submit.follows_tool, submit.expects_tool) == (True, True)
    assert submit.projected_prompt_tokens is not None and submit.projected_prompt_tokens > 1
    (end,) = _events(gw, LLMEnd)
    assert (end.status, end.call_id) == ("ok", submit.call_id)
    assert (end.prompt_tokens, end.cached_tokens, end.output_tokens) == (7, 4, 3)
    assert (end.finish_reason, end.ended_in_tool_call) == ("completed", True)
    assert _events(gw, LLMFirstToken) == []  # a whole answer, as in the SDK


def test_a_streamed_response_is_relayed_and_recorded(engine_app: FastAPI, gw: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused")
    stream = client.responses.create(
        model=MODEL, input="hi", stream=True, max_output_tokens=3, prompt_cache_key="conv-2"
    )
    events = list(stream)
    assert [e.type for e in events] == [
        "response.created",
        *["response.output_text.delta"] * 3,
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "tok0 tok1 tok2 "
    )
    (seen,) = _seen(engine_app)
    assert seen.body["stream"] is True and seen.headers["x-session-id"] == "conv-2"
    (first,) = _events(gw, LLMFirstToken)
    (end,) = _events(gw, LLMEnd)
    assert first.session_id == end.session_id == "conv-2"
    assert (end.prompt_tokens, end.output_tokens, end.finish_reason) == (7, 3, "completed")


# --- Anthropic's Messages API -------------------------------------------------------------


def test_a_message_is_forwarded_with_the_anthropic_user_id_as_its_session(
    engine_app: FastAPI, gw: Gateway
) -> None:
    user_id = "user_ab12_account_cd34_session_5f0e"
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "metadata": {"user_id": user_id},
        "system": "you are terse",
        "messages": [{"role": "user", "content": "hi"}],
    }
    reply = httpx.post(f"{gw.url}/v1/messages", json=body)
    assert reply.status_code == 200
    assert reply.json()["content"] == [{"type": "text", "text": "tok0 tok1 "}]
    (seen,) = _seen(engine_app)
    assert seen.headers["x-session-id"] == seen.body["vllm_xargs"]["session_id"] == user_id
    assert seen.body["metadata"] == {"user_id": user_id}
    (end,) = _events(gw, LLMEnd)
    # Anthropic counts cached tokens apart from input_tokens: the event adds them up.
    assert (end.session_id, end.prompt_tokens, end.cached_tokens) == (user_id, 7, 4)
    assert (end.output_tokens, end.finish_reason) == (3, "max_tokens")


def test_a_streamed_message_after_a_tool_is_recorded(engine_app: FastAPI, gw: Gateway) -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "stream": True,
        "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [result]}],
    }
    reply = httpx.post(f"{gw.url}/v1/messages", json=body, headers={"X-Session-ID": "s-9"})
    assert reply.status_code == 200
    kinds = [line[7:] for line in reply.text.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    (seen,) = _seen(engine_app)
    assert seen.body["vllm_xargs"]["follows_tool"] == seen.body["vllm_xargs"]["expects_tool"] == 1
    assert len(_events(gw, LLMFirstToken)) == 1
    (end,) = _events(gw, LLMEnd)
    assert (end.session_id, end.prompt_tokens, end.output_tokens) == ("s-9", 7, 3)
    assert (end.finish_reason, end.ended_in_tool_call) == ("tool_use", True)


# --- routes passed through as they are -----------------------------------------------


def test_the_tokenizer_routes_pass_bodies_and_answers_through_unchanged(
    engine_app: FastAPI, engine_url: str, gw: Gateway
) -> None:
    raw = b'{"model": "scripted",  "prompt": "hi!", "add_special_tokens": false}'
    headers = {"content-type": "application/json", "x-request-id": "r-1"}
    direct = httpx.post(f"{engine_url}/tokenize", content=raw, headers=headers)
    proxied = httpx.post(f"{gw.url}/tokenize", content=raw, headers=headers)
    assert (proxied.status_code, proxied.content) == (200, direct.content)
    assert proxied.json()["tokens"] == [104, 105, 33]
    assert engine_app.state.raw == [raw, raw]  # byte for byte
    assert _seen(engine_app)[1].headers["x-request-id"] == "r-1"
    back = httpx.post(f"{gw.url}/detokenize", json={"model": MODEL, "tokens": [104, 105]})
    assert (back.status_code, back.json()) == (200, {"prompt": "hi"})
    # Not LLM calls: no admission, no events.
    assert gw.kinds() == []


def test_version_and_health_are_the_engines(engine_url: str, gw: Gateway) -> None:
    version = httpx.get(f"{gw.url}/version")
    assert (version.status_code, version.json()) == (200, {"version": "0.32.0"})
    health = httpx.get(f"{gw.url}/health")
    assert (health.status_code, health.content) == (200, b"")
    assert "content-type" not in health.headers  # as vLLM's
    assert httpx.get(f"{gw.url}/healthz").json()["status"] == "ok"  # the gateway's own


def test_an_engine_error_on_a_passed_route_keeps_its_4xx_and_a_5xx_is_a_502(
    engine_url: str, gw: Gateway
) -> None:
    body = {"model": MODEL}
    direct = httpx.post(f"{engine_url}/tokenize", json=body)
    proxied = httpx.post(f"{gw.url}/tokenize", json=body)
    assert (proxied.status_code, proxied.content) == (400, direct.content)
    crashed = httpx.post(f"{gw.url}/tokenize", json={**body, "prompt": "crash"})
    assert crashed.status_code == 502
    error = crashed.json()["error"]
    assert error["type"] == "upstream_error" and "tokenizer died" in error["message"]


# --- the gateway's own errors ---------------------------------------------------------------


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error.keys() == {"message", "type", "param", "code"} and error["param"] is None
    return error


def test_an_unknown_route_is_an_openai_404_naming_the_routes_served(gw: Gateway) -> None:
    for method, path in [("GET", "/v1/nothing"), ("POST", "/v1/responses/resp_1/cancel")]:
        error = _error(httpx.request(method, f"{gw.url}{path}"), 404)
        assert (error["type"], error["code"]) == ("invalid_request_error", "route_not_found")
        assert f"{method} {path}" in error["message"]
        for served in (
            "POST /v1/responses",
            "POST /v1/messages",
            "POST /tokenize",
            "GET /health",
            "GET /v1/models",
            "POST /v1/chat/completions",
        ):
            assert served in error["message"]
    # The OpenAI client reads it as what it is.
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError, match="supported routes"):
        client.embeddings.create(model=MODEL, input="x")


def test_a_wrong_method_is_an_openai_405(gw: Gateway) -> None:
    response = httpx.get(f"{gw.url}/v1/responses")
    error = _error(response, 405)
    assert error["code"] == "method_not_allowed" and "supported routes" in error["message"]
    assert response.headers["allow"] == "POST"


def test_a_route_of_the_gateway_keeps_its_own_errors(gw: Gateway) -> None:
    """The unknown-route error is for requests no route matches, not a route's 404."""
    reply = httpx.post(f"{gw.url}/v1/responses", json={"model": "gpt-9", "input": "x"})
    assert "'gpt-9' not found" in _error(reply, 404)["message"]
    assert httpx.get(f"{gw.url}/v1/events/stream").status_code == 401


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages", "/tokenize", "/detokenize"])
def test_a_malformed_body_is_an_openai_400(engine_app: FastAPI, gw: Gateway, path: str) -> None:
    for raw, message in [(b'{"model": ', "not valid JSON"), (b"[1]", "JSON object")]:
        error = _error(httpx.post(f"{gw.url}{path}", content=raw), 400)
        assert message in error["message"]
    assert _seen(engine_app) == []


def test_an_engine_that_is_down_is_an_openai_503(make_gateway: GatewayFactory) -> None:
    with make_gateway(f"http://127.0.0.1:{free_loopback_port()}") as gateway:
        calls = [
            ("GET", "/version", None),
            ("GET", "/health", None),
            ("POST", "/tokenize", {"model": MODEL, "prompt": "x"}),
            ("POST", "/v1/responses", {"model": MODEL, "input": "x"}),
            ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": []}),
        ]
        for method, path, body in calls:
            error = _error(httpx.request(method, f"{gateway.url}{path}", json=body), 503)
            assert "not reachable" in error["message"], path
