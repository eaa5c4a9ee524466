"""What the gateway reads of the Responses and Messages APIs (``llm_apis``), without
servers: the session, the tool markers and the prompt of a request; the first token,
usage and finish of an answer, whole or streamed; malformed parts read as absent."""

from __future__ import annotations

from typing import Any

import pytest

from agentmars.server.gateway.call_meta import BadRequest, call_metadata
from agentmars.server.gateway.llm_apis import (
    CHAT,
    LLM_APIS,
    MAX_PROMPT_TEXT,
    MAX_PROMPT_VISITS,
    Messages,
    Responses,
    Usage,
)

RESPONSES = Responses()
MESSAGES = Messages()
USER = {"metadata": {"user_id": "user_1_session_9"}}
TOOL_OUTPUT = {"type": "function_call_output"}
TOOL_RESULT = {"role": "user", "content": [{"type": "tool_result"}]}


def test_anthropic_user_id_names_a_message_session_below_every_other_source() -> None:
    assert call_metadata({}, USER, MESSAGES).session_id == "user_1_session_9"
    assert call_metadata({"x-session-id": "mine"}, USER, MESSAGES).session_id == "mine"
    assert call_metadata({"x-session-token": "tok"}, USER, MESSAGES).session_id == "tok"
    # Not an Anthropic request: OpenAI's metadata is free-form, its user_id is not read.
    assert call_metadata({}, USER, CHAT).ephemeral
    assert call_metadata({}, {**USER, "store": False}, RESPONSES).ephemeral
    # Absent or not an object: no session, no error (the engine judges the body).
    assert call_metadata({}, {"metadata": "x"}, MESSAGES).ephemeral
    with pytest.raises(BadRequest, match=r"metadata\.user_id"):
        call_metadata({}, {"metadata": {"user_id": "x" * 257}}, MESSAGES)


@pytest.mark.parametrize("conversation", ["conv_1", {"id": "conv_1"}])
def test_the_conversation_names_a_response_session_below_every_other_source(
    conversation: object,
) -> None:
    body = {"conversation": conversation}
    meta = call_metadata({}, body, RESPONSES)
    assert meta.session_id == "conv_1" and not meta.ephemeral
    assert call_metadata({"x-session-token": "tok"}, body, RESPONSES).session_id == "tok"
    assert call_metadata({}, {**body, "store": False}, RESPONSES).session_id == "conv_1"
    # Above the answer the call continues (OpenAI refuses both; the gateway need not).
    continued = {**body, "previous_response_id": "resp_0"}
    assert call_metadata({}, continued, RESPONSES).session_id == "conv_1"
    # Not a Responses request: not read.
    assert call_metadata({}, body, CHAT).ephemeral
    assert call_metadata({}, body, MESSAGES).ephemeral


@pytest.mark.parametrize(
    ("conversation", "field"),
    [
        ("", "conversation"),
        ("x" * 257, "conversation"),
        ("caf\u00e9", "conversation"),
        (7, "conversation"),
        (["conv_1"], "conversation"),
        ({"id": ""}, r"conversation\.id"),
        ({"id": "x" * 257}, r"conversation\.id"),
        ({"id": 7}, r"conversation\.id"),
        ({}, r"conversation\.id"),
        ({"object": "conversation"}, r"conversation\.id"),
    ],
)
def test_a_bad_conversation_is_a_400_naming_it(conversation: object, field: str) -> None:
    with pytest.raises(BadRequest, match=field):
        call_metadata({}, {"conversation": conversation}, RESPONSES)


@pytest.mark.parametrize(
    ("api", "body", "follows", "expects"),
    [
        (RESPONSES, {"input": "hi", "tools": [{}]}, False, True),
        (RESPONSES, {"input": [TOOL_OUTPUT], "tool_choice": "none"}, True, False),
        (RESPONSES, {"input": [TOOL_OUTPUT, {"role": "user"}]}, False, False),
        (RESPONSES, {"input": [5], "tools": "x"}, False, True),
        (MESSAGES, {"messages": [TOOL_RESULT]}, True, False),
        (MESSAGES, {"messages": [{"role": "user", "content": "a tool_result"}]}, False, False),
        (MESSAGES, {"tools": [{}], "tool_choice": {"type": "none"}}, False, False),
        (MESSAGES, {"tools": [{}], "tool_choice": {"type": "any"}}, False, True),
    ],
)  # fmt: skip
def test_tool_markers(api: Any, body: dict[str, Any], follows: bool, expects: bool) -> None:
    meta = call_metadata({}, body, api)
    assert (meta.follows_tool, meta.expects_tool) == (follows, expects)


def test_the_prompt_is_projected_from_each_apis_own_fields() -> None:
    text = "x" * 400
    assert call_metadata({}, {"input": text}, RESPONSES).prompt_tokens == 101  # '["x..."]': 404 / 4
    both = {"instructions": text, "input": text}
    assert call_metadata({}, both, RESPONSES).prompt_tokens > 200
    assert call_metadata({}, {"system": text, "messages": []}, MESSAGES).prompt_tokens > 100
    assert call_metadata({}, {}, RESPONSES).prompt_tokens == 1
    assert RESPONSES.max_tokens({"max_output_tokens": 9, "max_tokens": 5}) == 9
    assert MESSAGES.max_tokens({"max_tokens": -1}) is None


def test_the_prompt_text_is_each_apis_message_contents_bounded() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Claim 1."}, {"type": "image"}]},
            {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
        ]
    }
    assert call_metadata({}, chat, CHAT).prompt_text == "Be brief.\nClaim 1."
    text_completion = LLM_APIS[1]
    assert call_metadata({}, {"prompt": "Summarise."}, text_completion).prompt_text == "Summarise."
    responses = {"instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}]}
    assert call_metadata({}, responses, RESPONSES).prompt_text == "Be brief.\nHi"
    messages = {"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    assert call_metadata({}, messages, MESSAGES).prompt_text == "Be brief.\nHi"
    huge = {"messages": [{"role": "user", "content": "y" * 10_000}] * 10}
    assert len(call_metadata({}, huge, CHAT).prompt_text) == MAX_PROMPT_TEXT
    deep: dict[str, Any] = {"content": "deep"}
    for _ in range(50):
        deep = {"content": [deep]}
    assert call_metadata({}, {"messages": [deep]}, CHAT).prompt_text == ""  # not walked
    assert call_metadata({}, {"messages": 7}, CHAT).prompt_text == ""
    # Text past the first MAX_PROMPT_VISITS values is not looked for (issue 38: a body
    # of 100,000 empty messages cost the event loop a walk of them all).
    empty: list[dict[str, Any]] = [{}] * MAX_PROMPT_VISITS
    early = {"messages": [{"content": "Hi"}, *empty, {"content": "late"}]}
    assert call_metadata({}, early, CHAT).prompt_text == "Hi"
    assert call_metadata({}, {"messages": early["messages"][-2:]}, CHAT).prompt_text == "late"


def test_responses_usage_and_finish_whole_and_from_stream_events() -> None:
    usage = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 4}
    whole = {"object": "response", "status": "completed", "output": [], "usage": usage}
    assert RESPONSES.usage(whole) == Usage(prompt=9, cached=2, output=4)
    assert RESPONSES.finish(whole) == ("completed", False)
    cut = {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"type": "reasoning"}, {"type": "function_call"}],
    }
    assert RESPONSES.finish({"type": "response.incomplete", "response": cut}) == (
        "max_output_tokens",
        True,
    )
    started = {"type": "response.created", "response": {"status": "in_progress", "usage": None}}
    assert RESPONSES.finish(started) is None and RESPONSES.usage(started) is None
    assert RESPONSES.carries_output(
        {"type": "response.function_call_arguments.delta", "delta": "{"}
    )
    assert not RESPONSES.carries_output({"type": "response.output_text.delta", "delta": ""})
    assert not RESPONSES.carries_output({"type": "response.in_progress"})


def test_messages_usage_adds_the_cache_and_a_stream_reports_it_in_two_parts() -> None:
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}}
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 6},
    }
    cached = {"input_tokens": 5, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 2}
    assert MESSAGES.usage({"usage": cached}) == Usage(prompt=10, cached=3, output=None)
    merged = (
        Usage().updated(MESSAGES.usage(start) or Usage()).updated(MESSAGES.usage(end) or Usage())
    )
    assert merged == Usage(prompt=5, cached=None, output=6)
    assert MESSAGES.finish(end) == ("end_turn", False)
    assert MESSAGES.finish({"type": "message", "stop_reason": "tool_use"}) == ("tool_use", True)
    assert MESSAGES.finish(start) is None
    tool = {"type": "content_block_start", "content_block": {"type": "tool_use", "name": "ls"}}
    assert MESSAGES.carries_output(tool)
    assert not MESSAGES.carries_output(
        {"type": "content_block_start", "content_block": {"type": "text"}}
    )
    assert MESSAGES.carries_output({"type": "content_block_delta", "delta": {"thinking": "hm"}})


@pytest.mark.parametrize("api", LLM_APIS, ids=[api.path for api in LLM_APIS])
def test_malformed_answers_read_as_absent(api: Any) -> None:
    for answer in (
        {},
        {"usage": "lots", "choices": "many", "output": 3, "delta": [], "response": 1},
        {"object": "response", "status": "completed", "output": [1, None]},
        {"type": "message_delta", "usage": {"input_tokens": -4, "output_tokens": 2**60}},
    ):
        usage = api.usage(answer)
        assert usage is None or (usage.prompt is None and usage.output is None)
        assert api.carries_output(answer) is False
