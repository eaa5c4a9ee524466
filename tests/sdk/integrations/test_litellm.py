from __future__ import annotations

import litellm
import pytest

from agentmars import sdk
from agentmars.sdk.integrations import litellm as agentmars_litellm

from .conftest import TOOLS, GatewayServer, LLMServer, assert_call_recorded, enqueued_priorities


def _kwargs(server: LLMServer | GatewayServer, **extra: object) -> dict:
    return {
        "model": "hosted_vllm/scripted",
        "api_base": f"{server.url}/v1",
        "api_key": "unused",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 5,
        # A hang fails in a minute, not at pytest's 300 s (the server answers in ms).
        "timeout": 60,
        **extra,
    }


def _assert_wire(server: LLMServer, session_id: str, turn: int, expects: int) -> None:
    request = server.requests[-1]
    assert request.headers["x-session-id"] == session_id
    assert request.body["session_id"] == session_id
    xargs = dict(request.body["vllm_xargs"])
    assert len(xargs.pop("call_id")) == 16  # the SDK's call id (test_request.py)
    assert xargs == {
        "session_id": session_id,
        "turn": turn,
        "follows_tool": 0,
        "expects_tool": expects,
    }


@pytest.mark.parametrize("stream", [False, True])
def test_completion(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    with sdk.session(emitter=emitter) as s:
        reply = agentmars_litellm.completion(**_kwargs(llm_server, stream=stream))
        if stream:
            assert len(list(reply)) >= 5
        else:
            assert reply.choices[0].message.content
    _assert_wire(llm_server, s.session_id, turn=0, expects=0)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=5)


@pytest.mark.parametrize("stream", [False, True])
async def test_acompletion(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    async with sdk.session(emitter=emitter) as s:
        reply = await agentmars_litellm.acompletion(**_kwargs(llm_server, stream=stream))
        if stream:
            assert len([c async for c in reply]) >= 5
    _assert_wire(llm_server, s.session_id, turn=0, expects=0)
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=5)


def test_usage_and_tool_call_reach_llm_end(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    with sdk.session(emitter=emitter) as s:
        agentmars_litellm.completion(**_kwargs(llm_server, tools=TOOLS))
    _assert_wire(llm_server, s.session_id, turn=0, expects=1)
    end = events.of_session(s.session_id)[-2]
    assert end.kind == "llm_end"
    assert end.ended_in_tool_call and end.finish_reason == "tool_calls"
    assert end.prompt_tokens == 2


def test_instrument_litellm_patches_module_calls(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    agentmars_litellm.instrument_litellm()
    try:
        with sdk.session(emitter=emitter) as s:
            litellm.completion(**_kwargs(llm_server))
    finally:
        agentmars_litellm.uninstrument_litellm()
    _assert_wire(llm_server, s.session_id, turn=0, expects=0)
    assert "llm_end" in events.kinds(s.session_id)


def test_positional_model_and_messages(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    kwargs = _kwargs(llm_server)
    model, messages = kwargs.pop("model"), kwargs.pop("messages")
    with sdk.session(emitter=emitter) as s:
        agentmars_litellm.completion(model, messages, **kwargs)
    submit = events.of_session(s.session_id)[1]
    # Named after the model, not LiteLLM's routing string: the prefix is the provider.
    assert (submit.model, submit.provider) == ("scripted", "hosted_vllm")


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_take_the_priority_the_gateway_answered_with(
    gateway_server: GatewayServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    session_id = f"ranked-litellm-{stream}"
    gateway_server.ranks[session_id] = 7
    with sdk.session(session_id, emitter=emitter):
        reply = agentmars_litellm.completion(**_kwargs(gateway_server, stream=stream))
        if stream:
            list(reply)
        with sdk.tool("terminal"):
            pass
        gateway_server.ranks[session_id] = 2
        reply = await agentmars_litellm.acompletion(**_kwargs(gateway_server, stream=stream))
        if stream:
            [chunk async for chunk in reply]
        with sdk.tool("terminal"):
            pass
    assert enqueued_priorities(events, session_id) == [7, 2]
