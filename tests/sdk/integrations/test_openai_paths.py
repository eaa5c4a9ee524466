"""The other ways into an instrumented OpenAI client: its copies (``with_options``), raw
responses (``with_raw_response``), the Responses API (``responses.create``), and
``with_streaming_response``, which is not recorded and says so."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai._legacy_response import LegacyAPIResponse

from agentmars import sdk
from agentmars.sdk.integrations.openai import instrument_openai

from .conftest import TOOLS, LLMServer, assert_call_recorded

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def client(llm_server: LLMServer) -> openai.OpenAI:
    return instrument_openai(openai.OpenAI(base_url=f"{llm_server.url}/v1", api_key="unused"))


@pytest.fixture
def aclient(llm_server: LLMServer) -> openai.AsyncOpenAI:
    return instrument_openai(openai.AsyncOpenAI(base_url=f"{llm_server.url}/v1", api_key="unused"))


def _end(sink: sdk.MemorySink, session_id: str) -> Any:
    end = sink.of_session(session_id)[-2]
    assert end.kind == "llm_end"
    return end


def _assert_session_on_wire(server: LLMServer, session_id: str, turn: int = 0) -> None:
    request = server.requests[-1]
    assert request.headers["x-session-id"] == session_id
    assert request.body["session_id"] == session_id
    assert request.body["vllm_xargs"]["turn"] == turn


def test_copies_made_by_with_options_are_instrumented(
    llm_server: LLMServer, client: openai.OpenAI, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    with sdk.session(emitter=emitter) as s:
        client.with_options(timeout=30).chat.completions.create(
            model="scripted", messages=HELLO, max_tokens=3
        )
        _assert_session_on_wire(llm_server, s.session_id, turn=0)
        client.with_options(max_retries=0).copy(timeout=20).completions.create(
            model="scripted", prompt="a b", max_tokens=3
        )
        _assert_session_on_wire(llm_server, s.session_id, turn=1)
    assert events.kinds(s.session_id).count("llm_end") == 2


async def test_copies_of_the_async_client_are_instrumented(
    llm_server: LLMServer, aclient: openai.AsyncOpenAI, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    async with sdk.session(emitter=emitter) as s:
        await aclient.with_options(timeout=30).chat.completions.create(
            model="scripted", messages=HELLO, max_tokens=3
        )
    _assert_session_on_wire(llm_server, s.session_id)
    assert_call_recorded(events, s.session_id, streamed=False, n_tokens=3)


@pytest.mark.parametrize("stream", [False, True])
def test_a_raw_response_is_recorded_with_its_usage(
    llm_server: LLMServer,
    client: openai.OpenAI,
    emitter: sdk.Emitter,
    events: sdk.MemorySink,
    stream: bool,
) -> None:
    with sdk.session(emitter=emitter) as s:
        raw = client.chat.completions.with_raw_response.create(
            model="scripted",
            messages=HELLO,
            max_tokens=4,
            stream=stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        assert isinstance(raw, LegacyAPIResponse) and raw.headers["content-type"]
        reply = raw.parse()
        if stream:
            assert "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        else:
            assert reply.choices[0].message.content and raw.parse() is reply
    _assert_session_on_wire(llm_server, s.session_id)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=4)
    end = _end(events, s.session_id)
    assert (end.prompt_tokens, end.output_tokens) == (2, 4)


async def test_a_raw_response_of_the_async_client_is_recorded(
    llm_server: LLMServer, aclient: openai.AsyncOpenAI, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    async with sdk.session(emitter=emitter) as s:
        raw = await aclient.with_raw_response.chat.completions.create(
            model="scripted", messages=HELLO, max_tokens=4
        )
        assert raw.parse().choices[0].message.content
    assert_call_recorded(events, s.session_id, streamed=False, n_tokens=4)
    assert _end(events, s.session_id).output_tokens == 4


def test_a_raw_response_wrapper_built_before_instrumenting_is_recorded(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    client = openai.OpenAI(base_url=f"{llm_server.url}/v1", api_key="unused")
    raw_chat = client.chat.completions.with_raw_response  # cached by openai
    instrument_openai(client)
    with sdk.session(emitter=emitter) as s:
        client.chat.completions.with_raw_response.create(model="scripted", messages=HELLO)
    assert client.chat.completions.with_raw_response is not raw_chat
    assert "llm_end" in events.kinds(s.session_id)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_api(
    llm_server: LLMServer,
    client: openai.OpenAI,
    emitter: sdk.Emitter,
    events: sdk.MemorySink,
    stream: bool,
) -> None:
    with sdk.session(emitter=emitter) as s:
        reply = client.responses.create(
            model="scripted", input="hello there", max_output_tokens=6, stream=stream
        )
        if stream:
            kinds = [event.type for event in reply]
            assert kinds.count("response.output_text.delta") == 6
        else:
            assert reply.output_text == "tok0 tok1 tok2 tok3 tok4 tok5 "
    assert llm_server.requests[-1].path == "/v1/responses"
    _assert_session_on_wire(llm_server, s.session_id)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=6)
    submit, end = events.of_session(s.session_id)[1], _end(events, s.session_id)
    assert submit.max_tokens == 6 and submit.projected_prompt_tokens
    assert (end.prompt_tokens, end.cached_tokens, end.output_tokens) == (2, 0, 6)
    assert end.finish_reason == "completed" and not end.ended_in_tool_call


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_api_of_the_async_client(
    llm_server: LLMServer,
    aclient: openai.AsyncOpenAI,
    emitter: sdk.Emitter,
    events: sdk.MemorySink,
    stream: bool,
) -> None:
    async with sdk.session(emitter=emitter) as s:
        reply = await aclient.responses.create(
            model="scripted", input="hello there", max_output_tokens=4, stream=stream
        )
        if stream:
            assert len([event async for event in reply]) > 4
    _assert_session_on_wire(llm_server, s.session_id)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=4)
    assert _end(events, s.session_id).output_tokens == 4


def test_responses_api_tool_call_and_its_result(
    llm_server: LLMServer, client: openai.OpenAI, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    tools = [{"type": "function", "name": "run", "parameters": TOOLS[0]["function"]["parameters"]}]
    with sdk.session(emitter=emitter) as s:
        reply = client.responses.create(model="scripted", input="list files", tools=tools)
        call = reply.output[0]
        assert call.type == "function_call"
        with sdk.tool(call.name, call_id=call.call_id):
            pass
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
        client.responses.create(
            model="scripted",
            input=[{"role": "user", "content": "list files"}, call.model_dump(), result],
            tools=tools,
        )
    xargs = llm_server.requests[-1].body["vllm_xargs"]
    assert (xargs["turn"], xargs["follows_tool"], xargs["expects_tool"]) == (1, 1, 1)
    first_end = events.of_session(s.session_id)[2]
    assert first_end.ended_in_tool_call and first_end.finish_reason == "completed"


def test_with_streaming_response_is_passed_through_with_a_warning(
    llm_server: LLMServer, client: openai.OpenAI, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    with (
        sdk.session(emitter=emitter) as s,
        pytest.warns(RuntimeWarning, match="with_streaming_response"),
        client.chat.completions.with_streaming_response.create(
            model="scripted", messages=HELLO
        ) as response,
    ):
        assert response.parse().choices[0].message.content
    assert not any(kind.startswith("llm_") for kind in events.kinds(s.session_id))
    assert "x-session-id" not in llm_server.requests[-1].headers
