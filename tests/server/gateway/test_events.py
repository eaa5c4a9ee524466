"""LLM events recorded by the gateway, tool events ingested, and the SSE stream."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV as TOKEN_ENV
from agentmars.sdk.events import (
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolStart,
    decode_event,
    encode_jsonl,
)
from agentmars.server.gateway.call_meta import call_metadata
from agentmars.server.gateway.events import CallRecorder
from agentmars.server.gateway.llm_apis import Responses, TextCompletions
from agentmars.server.gateway.proxy import SSEScanner
from agentmars.server.web.ingest import EventHub
from agentmars.server.web.serving import serve_in_subprocess
from tests.server.gateway.conftest import AUTH, MODEL, TOKEN, Engine, Gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_a_stream_records_submit_first_token_and_end(gateway: Gateway) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"X-Session-ID": "s1"}
    httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers).raise_for_status()
    assert gateway.hub.wait_for_count(3, 2.0)
    submit, first, end = gateway.hub.events()
    assert isinstance(submit, LLMSubmit)
    assert isinstance(first, LLMFirstToken)
    assert isinstance(end, LLMEnd)
    assert {e.source for e in (submit, first, end)} == {"gateway"}
    assert submit.session_id == first.session_id == end.session_id == "s1"
    assert submit.call_id == first.call_id == end.call_id
    assert (submit.turn, submit.stream, submit.max_tokens, submit.model) == (0, True, 4, MODEL)
    # the scripted engine waits 20 ms before the first token, 10 ms per further token
    assert 0.02 <= first.ttft_s < end.duration_s
    assert end.duration_s >= 0.05
    assert (end.status, end.output_tokens, end.finish_reason) == ("ok", 4, "length")
    assert end.prompt_tokens == 1 and end.cached_tokens == 0  # one word of prompt


def _data(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})],
)
def test_a_stream_that_asks_no_usage_gets_none_yet_its_end_has_the_tokens(
    gateway: Gateway, engine: Engine, path: str, body: dict[str, Any]
) -> None:
    """The policies read a call's tokens from its llm_end; an OpenAI stream reports
    them only when asked, so the gateway asks, and relays the stream as the client
    asked for it: the same chunks the engine sends such a client, no usage chunk."""
    stream = {**body, "max_tokens": 4, "stream": True}
    url = f"{gateway.url}{path}"
    answer = httpx.post(url, json=stream, headers={"X-Session-ID": "u"}).text
    assert engine.requests[-1].body["stream_options"] == {"include_usage": True}
    direct = httpx.post(f"{engine.url}{path}", json=stream).text
    assert [c["choices"] for c in _data(answer)] == [c["choices"] for c in _data(direct)]
    assert answer.endswith("}\n\ndata: [DONE]\n\n") and "\n\n\n" not in answer
    assert gateway.hub.wait_for_count(3, 2.0)
    end = gateway.hub.events()[2]
    assert isinstance(end, LLMEnd)
    assert (end.prompt_tokens, end.cached_tokens, end.output_tokens) == (1, 0, 4)
    # A client that asks for the usage gets it, with its other options kept.
    options = {"include_usage": True, "continuous_usage_stats": False}
    asked = httpx.post(url, json={**stream, "stream_options": options}).text
    assert engine.requests[-1].body["stream_options"] == options
    assert _data(asked)[-1]["usage"]["completion_tokens"] == 4


def test_a_whole_response_records_submit_and_end(gateway: Gateway) -> None:
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    body = {**CHAT, "session_id": "s2", "tools": tools}
    httpx.post(f"{gateway.url}/v1/chat/completions", json=body).raise_for_status()
    assert gateway.hub.wait_for_count(2, 2.0)
    submit, end = gateway.hub.events()
    assert isinstance(submit, LLMSubmit) and submit.expects_tool
    assert isinstance(end, LLMEnd) and end.ended_in_tool_call and end.status == "ok"


def test_an_engine_error_ends_the_call_as_an_error(gateway: Gateway) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": MODEL})
    assert response.status_code == 400
    # llm_submit, llm_end, and the session_end of the one-call session the gateway ends.
    assert gateway.hub.wait_for_count(3, 2.0)
    submit, end, over = gateway.hub.events()[-3:]
    assert isinstance(end, LLMEnd) and end.status == "error"
    assert "messages" in (end.error or "")
    assert isinstance(over, SessionEnd) and over.source == "gateway"
    assert over.session_id == submit.session_id == end.session_id


def test_event_ingest_needs_the_token(gateway: Gateway) -> None:
    batch = encode_jsonl([SessionStart(session_id="s")])
    assert httpx.post(f"{gateway.url}/v1/events", content=batch).status_code == 401
    assert httpx.post(f"{gateway.url}/v1/events", content=batch, headers=AUTH).json() == {
        "accepted": 1
    }
    assert gateway.kinds() == ["session_start"]


def _read_stream(url: str, want: int, out: list[dict[str, Any]], ready: threading.Event) -> None:
    with httpx.stream("GET", f"{url}/v1/events/stream", headers=AUTH, timeout=5) as response:
        for line in response.iter_lines():
            ready.set()  # the opening comment: subscribed
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) == want:
                    return


def test_the_stream_serves_ingested_and_gateway_events(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/v1/events/stream").status_code == 401
    received: list[dict[str, Any]] = []
    ready = threading.Event()
    reader = threading.Thread(target=_read_stream, args=(gateway.url, 3, received, ready))
    reader.start()
    assert ready.wait(5)
    tool = ToolStart(session_id="s", call_id="c1", tool="ls", source="sandbox")
    httpx.post(f"{gateway.url}/v1/events", content=tool.to_json(), headers=AUTH)
    httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "session_id": "s"})
    reader.join(5)
    assert [decode_event(e).kind for e in received] == ["tool_start", "llm_submit", "llm_end"]
    assert received[0] == json.loads(tool.to_json())


def test_an_open_stream_does_not_hold_up_shutdown() -> None:
    argv = [sys.executable, "-m", "agentmars.server.gateway.app", "--upstream", "http://x"]
    received: list[dict[str, Any]] = []
    ready = threading.Event()
    with serve_in_subprocess(argv, env={TOKEN_ENV: TOKEN}) as url:
        reader = threading.Thread(target=_read_stream, args=(url, 1, received, ready))
        reader.start()
        assert ready.wait(5)
        stopping = time.monotonic()
    # SIGTERM: the stream ends within a stop check (0.25 s) and the server exits; a
    # server stuck on the stream would be SIGKILLed after 5 s
    assert time.monotonic() - stopping < 2.0
    reader.join(5)
    assert not reader.is_alive() and received == []


def test_the_recorder_drops_what_an_engine_gets_wrong_instead_of_failing() -> None:
    hub = EventHub()
    meta = call_metadata({}, {"session_id": "s"})
    recorder = CallRecorder(hub, meta, 0, {"max_tokens": "many", "model": 5})
    bad_usage = {"prompt_tokens": 2, "prompt_tokens_details": {"cached_tokens": 9}}
    recorder.observe({"choices": 5, "usage": {**bad_usage, "completion_tokens": "x"}}, chunk=True)
    recorder.observe({"choices": [{"delta": "text"}, 3]}, chunk=True)  # no first token
    recorder.observe({"choices": [{"delta": {"role": "assistant"}}]}, chunk=True)  # nor this
    recorder.observe({"choices": [{"delta": {"content": "hi"}}]}, chunk=True)
    recorder.observe({"choices": [{"delta": {"content": "!"}}]}, chunk=True)
    recorder.end()
    recorder.end("error", "late")  # the first outcome stands
    submit, first, end = hub.events()
    assert isinstance(submit, LLMSubmit) and (submit.max_tokens, submit.model) == (None, None)
    assert isinstance(first, LLMFirstToken)
    assert isinstance(end, LLMEnd) and end.status == "ok"
    assert (end.prompt_tokens, end.cached_tokens, end.output_tokens) == (2, None, None)


def test_the_recorder_tells_the_answers_id_as_soon_as_a_chunk_gives_it() -> None:
    recorder = CallRecorder(EventHub(), call_metadata({}, {}), 0, {}, Responses())
    told: list[str] = []
    recorder.on_response_id = told.append
    response = {"id": "resp_1", "object": "response", "status": "in_progress"}
    recorder.observe({"type": "response.created", "response": response}, chunk=True)
    assert told == ["resp_1"]  # before the stream's end: the client may continue it then
    recorder.observe({"type": "response.output_text.delta", "delta": "hi"}, chunk=True)
    done = {**response, "status": "completed"}
    recorder.observe({"type": "response.completed", "response": done}, chunk=True)
    assert told == ["resp_1"]


def test_the_usage_chunk_the_gateway_asked_for_is_dropped_wherever_the_bytes_split() -> None:
    chunk = {"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    relayed = f"data: {json.dumps(chunk)}\r\n\r\ndata: {json.dumps(usage)}\r\n\r\ndata: [DONE]"
    wanted = relayed.replace(f"data: {json.dumps(usage)}\r\n\r\n", "")
    for cut in range(1, len(relayed)):
        hub = EventHub()
        recorder = CallRecorder(hub, call_metadata({}, {}), 0, {}, TextCompletions())
        scanner = SSEScanner(recorder, drop_usage=True)
        passed = scanner.feed(relayed[:cut].encode()) + scanner.feed(relayed[cut:].encode())
        assert (passed + scanner.flush()).decode() == wanted, cut
        end = recorder.end()
        assert end is not None and (end.prompt_tokens, end.output_tokens) == (3, 1)
