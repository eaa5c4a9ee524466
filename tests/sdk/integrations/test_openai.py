from __future__ import annotations

import openai
import pytest

from agentmars import sdk
from agentmars.sdk.integrations.openai import instrument_openai

from .conftest import TOOLS, GatewayServer, LLMServer, assert_call_recorded, enqueued_priorities


def _client(server: LLMServer) -> openai.OpenAI:
    return instrument_openai(openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused"))


def _aclient(server: LLMServer) -> openai.AsyncOpenAI:
    return instrument_openai(openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused"))


def _assert_wire(server: LLMServer, session_id: str, turn: int, follows: int, expects: int) -> None:
    request = server.requests[-1]
    assert request.headers["x-session-id"] == session_id
    assert request.body["session_id"] == session_id
    xargs = dict(request.body["vllm_xargs"])
    assert len(xargs.pop("call_id")) == 16  # the SDK's call id (test_request.py)
    assert xargs == {
        "session_id": session_id,
        "turn": turn,
        "follows_tool": follows,
        "expects_tool": expects,
    }


@pytest.mark.parametrize("stream", [False, True])
def test_chat_carries_session_metadata_and_timing(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    client = _client(llm_server)
    with sdk.session(emitter=emitter) as s:
        reply = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=6,
            stream=stream,
        )
        if stream:
            chunks = list(reply)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            assert reply.choices[0].message.content
    _assert_wire(llm_server, s.session_id, turn=0, follows=0, expects=0)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=6)
    submit = events.of_session(s.session_id)[1]
    assert submit.model == "scripted" and submit.stream is stream and submit.max_tokens == 6
    assert submit.projected_prompt_tokens and submit.projected_kv_blocks == 1
    if not stream:
        end = events.of_session(s.session_id)[-2]
        assert (end.prompt_tokens, end.output_tokens, end.cached_tokens) == (2, 6, 0)


@pytest.mark.parametrize("stream", [False, True])
async def test_async_client(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    client = _aclient(llm_server)
    async with sdk.session(emitter=emitter) as s:
        reply = await client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            stream=stream,
        )  # fmt: skip
        if stream:
            assert len([c async for c in reply]) >= 4
    _assert_wire(llm_server, s.session_id, turn=0, follows=0, expects=0)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=4)


def test_text_completions_are_instrumented(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    client = _client(llm_server)
    with sdk.session(emitter=emitter) as s:
        chunks = list(
            client.completions.create(model="scripted", prompt="a b c", max_tokens=3, stream=True)
        )
    assert chunks
    _assert_wire(llm_server, s.session_id, turn=0, follows=0, expects=0)
    assert events.of_session(s.session_id)[1].operation == "text_completion"
    assert_call_recorded(events, s.session_id, streamed=True, n_tokens=3)


def test_tool_transition_markers(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    """A call offering tools expects a tool call; the call after the tool follows it."""
    client = _client(llm_server)
    messages: list[dict] = [{"role": "user", "content": "list files"}]
    with sdk.session(emitter=emitter) as s:
        reply = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
        _assert_wire(llm_server, s.session_id, turn=0, follows=0, expects=1)
        tool_call = reply.choices[0].message.tool_calls[0]
        with sdk.tool(tool_call.function.name, call_id=tool_call.id):
            result = "a.txt b.txt"
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tool_call.id, "content": result},
        ]
        client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
        _assert_wire(llm_server, s.session_id, turn=1, follows=1, expects=1)
    kinds = events.kinds(s.session_id)
    assert kinds == [
        "session_start",
        "llm_submit", "llm_end",
        "tool_enqueue", "tool_start", "tool_end",
        "llm_submit", "llm_end",
        "session_end",
    ]  # fmt: skip
    first_end = events.of_session(s.session_id)[2]
    assert first_end.ended_in_tool_call and first_end.finish_reason == "tool_calls"
    assert events.of_session(s.session_id)[5].call_id == tool_call.id


def test_caller_headers_and_xargs_are_kept(llm_server: LLMServer, emitter: sdk.Emitter) -> None:
    client = _client(llm_server)
    with sdk.session(emitter=emitter):
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Trace": "t1"},
            extra_body={"vllm_xargs": {"user_hint": 7}, "priority": 3},
        )
    request = llm_server.requests[-1]
    assert request.headers["x-trace"] == "t1"
    assert request.body["priority"] == 3
    assert request.body["vllm_xargs"]["user_hint"] == 7
    assert request.body["vllm_xargs"]["turn"] == 0


def test_outside_a_session_nothing_is_added(llm_server: LLMServer, events: sdk.MemorySink) -> None:
    sdk.configure(events)
    try:
        _client(llm_server).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "x"}]
        )
    finally:
        sdk.configure()
    request = llm_server.requests[-1]
    assert "x-session-id" not in request.headers
    assert "session_id" not in request.body and "vllm_xargs" not in request.body
    assert events.events == []


def test_failed_call_records_error(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    client = _client(llm_server)
    with sdk.session(emitter=emitter) as s, pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[])
    end = events.of_session(s.session_id)[-2]
    assert end.kind == "llm_end" and end.status == "error"
    assert "NotFoundError" in (end.error or "")


def test_stream_closed_early_is_cancelled(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    client = _client(llm_server)
    with sdk.session(emitter=emitter) as s:
        stream = client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "x"}], stream=True,
            max_tokens=20,
        )  # fmt: skip
        next(iter(stream))
        stream.close()
    end = events.of_session(s.session_id)[-2]
    assert end.kind == "llm_end" and end.status == "cancelled"


def test_instrument_is_idempotent_and_checks_its_input(llm_server: LLMServer) -> None:
    client = _client(llm_server)
    create = client.chat.completions.create
    assert instrument_openai(client).chat.completions.create is create
    with pytest.raises(TypeError, match=r"openai\.OpenAI"):
        instrument_openai("not a client")  # type: ignore[type-var]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_take_the_newest_priority_the_gateway_answered_with(
    gateway_server: GatewayServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    client = instrument_openai(openai.OpenAI(base_url=f"{gateway_server.url}/v1", api_key="unused"))
    session_id = f"ranked-openai-{stream}"
    with sdk.session(session_id, emitter=emitter):
        for priority in (7, -3):  # the policy changes its mind between the calls
            gateway_server.ranks[session_id] = priority
            reply = client.chat.completions.create(
                model="scripted",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                stream=stream,
            )
            if stream:
                list(reply)
            with sdk.tool("terminal") as call:
                assert call.priority == priority  # for the sandbox pool
        with sdk.tool("terminal", priority=1):  # the caller's own wins
            pass
    assert enqueued_priorities(events, session_id) == [7, -3, 1]


async def test_the_async_client_keeps_the_priority_too(
    gateway_server: GatewayServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    client = instrument_openai(
        openai.AsyncOpenAI(base_url=f"{gateway_server.url}/v1", api_key="unused")
    )
    gateway_server.ranks["ranked-openai-async"] = 5
    async with sdk.session("ranked-openai-async", emitter=emitter) as s:
        await client.completions.create(model="scripted", prompt="hi", max_tokens=2)
        assert s.tool_priority == 5
