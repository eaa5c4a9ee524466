"""Who a request belongs to and what reaches the engine, on real servers: session
sources of other ecosystems, the call id and the scheduling hints."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from agentmars import sdk
from agentmars.sdk.events import LLMEnd, LLMSubmit
from agentmars.sdk.integrations.openai import instrument_openai
from tests.server.gateway.conftest import MODEL, Engine, Gateway

CHAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi there"}],
    "max_tokens": 2,
}


def _post(gateway: Gateway, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers)


def _gateway_calls(gateway: Gateway) -> list[LLMSubmit | LLMEnd]:
    return [e for e in gateway.hub.events() if isinstance(e, LLMSubmit | LLMEnd)]


def test_an_unmodified_openhands_request_is_one_session_across_calls(
    engine: Engine, gateway: Gateway
) -> None:
    """OpenHands (through LiteLLM) sends its conversation id as ``prompt_cache_key``
    and ``x-litellm-session-id`` and nothing of agentmars': the engine must see it as
    one session, named exactly as an SDK request names it."""
    body = {**CHAT, "prompt_cache_key": "conv-7f3a"}
    headers = {"x-litellm-session-id": "conv-7f3a"}
    for _ in range(2):
        assert _post(gateway, body, headers).is_success
    assert set(gateway.app.state.gateway.admission.admitted) == {"conv-7f3a"}
    submits = [e for e in _gateway_calls(gateway) if isinstance(e, LLMSubmit)]
    assert [(e.session_id, e.turn) for e in submits] == [("conv-7f3a", 0), ("conv-7f3a", 1)]
    for turn, seen in enumerate(engine.requests):
        assert seen.headers["x-session-id"] == "conv-7f3a"
        assert seen.body["session_id"] == "conv-7f3a"
        assert seen.body["prompt_cache_key"] == "conv-7f3a"  # OpenAI's field: passed on
        xargs = seen.body["vllm_xargs"]
        assert (xargs["session_id"], xargs["turn"]) == ("conv-7f3a", turn)


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({"session_id": "own"}, {"x-litellm-session-id": "lite"}, "own"),
        (
            {"prompt_cache_key": "key", "program_id": "prog"},
            {"x-litellm-session-id": "lite"},
            "key",
        ),
        ({"program_id": "prog"}, {"x-litellm-session-id": "lite"}, "lite"),
        ({"program_id": "prog"}, {"x-dynamo-session-id": "dyn", "x-session-token": "tok"}, "prog"),
        ({}, {"X-Dynamo-Session-ID": "dyn", "x-session-token": "tok"}, "dyn"),
        ({}, {"x-session-token": "tok"}, "tok"),
    ],
)
def test_the_first_source_present_names_the_session_to_the_engine(
    engine: Engine, gateway: Gateway, body: dict[str, Any], headers: dict[str, str], expected: str
) -> None:
    assert _post(gateway, {**CHAT, **body}, headers).is_success
    (seen,) = engine.requests
    assert seen.headers["x-session-id"] == seen.body["session_id"] == expected
    assert seen.body["vllm_xargs"]["session_id"] == expected
    # Not an OpenAI field: an engine may refuse it; its session travels as session_id.
    assert "program_id" not in seen.body


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        ({"prompt_cache_key": 7}, {}, "prompt_cache_key"),
        ({}, {"x-litellm-session-id": "x" * 300}, "x-litellm-session-id"),
        ({"program_id": ""}, {}, "program_id"),
        ({}, {"x-dynamo-session-id": ""}, "x-dynamo-session-id"),
        ({"vllm_xargs": {"call_id": ""}}, {}, "vllm_xargs.call_id"),
        ({"vllm_xargs": {"next_tool": ""}}, {}, "vllm_xargs.next_tool"),
        ({"vllm_xargs": {"expected_tool_s": -2}}, {}, "vllm_xargs.expected_tool_s"),
        ({"vllm_xargs": {"agent": 1}}, {}, "vllm_xargs.agent"),
        ({"vllm_xargs": {"task_id": "x" * 257}}, {}, "vllm_xargs.task_id"),
    ],
)
def test_a_bad_source_or_hint_is_a_400_naming_the_field(
    engine: Engine, gateway: Gateway, body: dict[str, Any], headers: dict[str, str], field: str
) -> None:
    response = _post(gateway, {**CHAT, **body}, headers)
    assert response.status_code == 400
    assert field in response.json()["error"]["message"]
    assert engine.requests == []  # refused at the gateway


def test_the_hints_and_the_call_id_reach_the_engine(engine: Engine, gateway: Gateway) -> None:
    hints = {"next_tool": "pytest", "expected_tool_s": 12.5, "agent": "coder", "task_id": "t-1"}
    xargs = {**hints, "call_id": "call-from-client", "custom": "kept"}
    body = {**CHAT, "session_id": "s", "vllm_xargs": xargs}
    assert _post(gateway, body, {}).is_success
    (seen,) = engine.requests
    assert seen.body["vllm_xargs"] == {
        **xargs,
        "session_id": "s",
        "turn": 0,
        "follows_tool": 0,
        "expects_tool": 0,
    }
    assert {e.call_id for e in _gateway_calls(gateway)} == {"call-from-client"}


def test_a_call_without_an_id_gets_one_the_engine_and_the_events_share(
    engine: Engine, gateway: Gateway
) -> None:
    assert _post(gateway, CHAT, {}).is_success  # no session, no hints either
    (seen,) = engine.requests
    assert set(seen.body["vllm_xargs"]) == {"call_id", "turn", "follows_tool", "expects_tool"}
    submit, end = _gateway_calls(gateway)
    assert submit.call_id == end.call_id == seen.body["vllm_xargs"]["call_id"]


def test_the_gateways_events_carry_the_sdks_call_id(engine: Engine, gateway: Gateway) -> None:
    sink = sdk.MemorySink()
    client = instrument_openai(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused"))
    with (
        sdk.session(agent="coder", task_id="t-9", emitter=sdk.Emitter([sink])) as s,
        sdk.hints(next_tool="pytest", expected_tool_s=3),
    ):
        for _ in range(2):
            client.chat.completions.create(**CHAT)
    ours = [e.call_id for e in sink.events if isinstance(e, LLMSubmit)]
    assert len(set(ours)) == 2
    assert gateway.hub.wait_for_count(4, 2.0)
    theirs = _gateway_calls(gateway)
    assert [e.call_id for e in theirs] == [ours[0], ours[0], ours[1], ours[1]]
    assert {e.session_id for e in theirs} == {s.session_id}
    for call_id, seen in zip(ours, engine.requests, strict=True):
        assert seen.body["vllm_xargs"] == {
            "session_id": s.session_id,
            "call_id": call_id,
            "turn": seen.body["vllm_xargs"]["turn"],
            "follows_tool": 0,
            "expects_tool": 1,  # the hint names the tool the answer calls
            "agent": "coder",
            "task_id": "t-9",
            "next_tool": "pytest",
            "expected_tool_s": 3,
        }
    assert [r.body["vllm_xargs"]["turn"] for r in engine.requests] == [0, 1]
