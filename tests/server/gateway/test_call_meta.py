"""What the gateway reads of a request (``call_metadata``): the session and its
sources' precedence, the call id, the tool markers and the hints, without servers;
then a chain of Responses calls (``previous_response_id``) through a real gateway in
front of the scripted engine, which the openai client calls as it is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi import FastAPI

from agentmars.sdk.events import LLMSubmit, SessionEnd
from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app
from agentmars.server.gateway.call_meta import BadRequest, ResponseSessions, call_metadata
from agentmars.server.gateway.llm_apis import CHAT, Responses
from agentmars.server.web.serving import serve_in_thread
from tests.sdk.integrations.scripted_responses import add_responses_route
from tests.server.gateway.conftest import MODEL, Gateway, GatewayFactory

RESPONSES = Responses()

# Every session source, highest precedence first: (headers, body) naming ``value``.
SOURCES: list[tuple[str, Any]] = [
    ("X-Session-ID", lambda v: ({"x-session-id": v}, {})),
    ("session_id", lambda v: ({}, {"session_id": v})),
    ("vllm_xargs.session_id", lambda v: ({}, {"vllm_xargs": {"session_id": v}})),
    ("prompt_cache_key", lambda v: ({}, {"prompt_cache_key": v})),
    ("x-litellm-session-id", lambda v: ({"x-litellm-session-id": v}, {})),
    ("program_id", lambda v: ({}, {"program_id": v})),
    ("x-dynamo-session-id", lambda v: ({"x-dynamo-session-id": v}, {})),
    ("x-session-token", lambda v: ({"x-session-token": v}, {})),
]
FOREIGN = SOURCES[3:]


def _merged(*parts: tuple[dict[str, str], dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    headers: dict[str, str] = {}
    body: dict[str, Any] = {}
    for part_headers, part_body in parts:
        headers |= part_headers
        body |= part_body
    return headers, body


@pytest.mark.parametrize(("field", "source"), SOURCES, ids=[f for f, _ in SOURCES])
def test_each_source_alone_names_the_session(field: str, source: Any) -> None:
    meta = call_metadata(*source("s-1"))
    assert meta.session_id == "s-1" and not meta.ephemeral


def test_agentmars_own_sources_may_all_be_given_if_they_agree() -> None:
    headers, body = _merged(*(source("s") for _, source in SOURCES[:3]))
    assert call_metadata(headers, body).session_id == "s"
    with pytest.raises(BadRequest, match="different sessions"):
        call_metadata({"x-session-id": "a"}, {"vllm_xargs": {"session_id": "b"}})


@pytest.mark.parametrize("higher", range(len(SOURCES) - 1), ids=[f for f, _ in SOURCES[:-1]])
def test_the_first_source_present_wins_and_the_lower_ones_are_not_read(higher: int) -> None:
    """Each source against every lower one naming another session, or an unusable
    value: the lower one is ignored, neither a conflict nor a 400."""
    field, source = SOURCES[higher]
    for lower_field, lower in SOURCES[max(higher + 1, 3) :]:
        for other in ("other", "", "x" * 300):
            meta = call_metadata(*_merged(lower(other), source("winner")))
            assert meta.session_id == "winner", (field, lower_field, other)


def test_an_openhands_request_is_one_named_session() -> None:
    """OpenHands sends its conversation id as prompt_cache_key and, through LiteLLM,
    as x-litellm-session-id; nothing else."""
    headers = {"x-litellm-session-id": "conv-7f3a"}
    meta = call_metadata(headers, {"prompt_cache_key": "conv-7f3a", "messages": []})
    assert meta.session_id == "conv-7f3a" and not meta.ephemeral


BAD_IDS: list[object] = ["", "x" * 257, "caf\u00e9", "a\nb", 7]
BAD_CASES = [
    (field, source, bad)
    for field, source in SOURCES
    for bad in BAD_IDS
    if isinstance(bad, str) or not source(bad)[0]  # a header is always a string
]


@pytest.mark.parametrize(("field", "source", "bad"), BAD_CASES)
def test_a_bad_value_in_the_source_that_wins_is_a_400_naming_it(
    field: str, source: Any, bad: object
) -> None:
    with pytest.raises(BadRequest, match=field):
        call_metadata(*source(bad))


def test_a_request_without_a_session_is_a_session_of_its_own() -> None:
    first, second = call_metadata({}, {}), call_metadata({}, {})
    assert first.ephemeral and first.session_id.startswith("call-")
    assert first.session_id != second.session_id


def test_the_call_id_is_the_clients_else_a_fresh_one() -> None:
    assert call_metadata({}, {"vllm_xargs": {"call_id": "c-1"}}).call_id == "c-1"
    first, second = call_metadata({}, {}), call_metadata({}, {})
    assert len(first.call_id) == 32 and first.call_id != second.call_id


def test_the_hints_are_read_from_xargs() -> None:
    xargs = {"next_tool": "pytest", "expected_tool_s": 30, "agent": "coder", "task_id": "t-1"}
    meta = call_metadata({}, {"vllm_xargs": xargs})
    assert (meta.next_tool, meta.expected_tool_s, meta.agent, meta.task_id) == (
        "pytest",
        30.0,
        "coder",
        "t-1",
    )
    assert meta.hints() == {**xargs, "expected_tool_s": 30.0}
    bare = call_metadata({}, {})
    assert (bare.next_tool, bare.expected_tool_s, bare.agent, bare.task_id) == (None,) * 4
    assert bare.hints() == {}
    assert call_metadata({}, {"vllm_xargs": {"agent": ""}}).agent == ""  # unnamed agent


def test_tool_markers_come_from_xargs_else_from_the_messages() -> None:
    tools = [{"type": "function", "function": {"name": "ls"}}]
    after_tool = {"messages": [{"role": "tool", "content": "ok"}], "tools": tools}
    meta = call_metadata({}, after_tool)
    assert (meta.follows_tool, meta.expects_tool) == (True, True)
    meta = call_metadata({}, {**after_tool, "tool_choice": "none"})
    assert (meta.follows_tool, meta.expects_tool) == (True, False)
    hinted = {**after_tool, "vllm_xargs": {"follows_tool": 0, "expects_tool": False}}
    meta = call_metadata({}, hinted)
    assert (meta.follows_tool, meta.expects_tool) == (False, False)


def test_the_prompt_projection_is_four_characters_a_token() -> None:
    assert call_metadata({}, {"prompt": "x" * 40}).prompt_tokens == 10
    assert call_metadata({}, {"prompt": ""}).prompt_tokens == 1


@pytest.mark.parametrize(
    "xargs",
    [
        {"turn": 1.5},
        {"turn": True},
        {"follows_tool": 2},
        {"expects_tool": 1.0},
        {"call_id": ""},
        {"call_id": 7},
        {"call_id": "caf\u00e9"},
        {"next_tool": ""},
        {"next_tool": "x" * 257},
        {"next_tool": 3},
        {"expected_tool_s": -1},
        {"expected_tool_s": float("inf")},
        {"expected_tool_s": float("nan")},
        {"expected_tool_s": True},
        {"expected_tool_s": "30"},
        {"agent": "x" * 257},
        {"agent": 5},
        {"task_id": ""},
        {"task_id": "a\nb"},
    ],
)
def test_bad_xargs_are_a_400_naming_the_field(xargs: dict[str, object]) -> None:
    (field,) = xargs
    with pytest.raises(BadRequest, match=f"vllm_xargs.{field}"):
        call_metadata({}, {"vllm_xargs": xargs})


# --- previous_response_id: the session of the answer a call continues -----------------


def test_a_response_continuing_an_answer_joins_the_session_that_gave_it() -> None:
    answers = ResponseSessions()
    answers.remember("resp_1", "s-1")
    body = {"previous_response_id": "resp_1"}
    meta = call_metadata({}, body, RESPONSES, answers)
    assert meta.session_id == "s-1" and not meta.ephemeral
    # Unknown (the gateway restarted, or forgot it): the id names the session.
    for unknowing in (ResponseSessions(), None):
        meta = call_metadata({}, {**body, "store": False}, RESPONSES, unknowing)
        assert meta.session_id == "resp_1" and not meta.ephemeral
    # Below every other source, which leaves it unread; no field of the other APIs.
    named = call_metadata({"x-session-token": "t"}, {"previous_response_id": ""}, RESPONSES)
    assert named.session_id == "t"
    assert call_metadata({}, body, CHAT, answers).ephemeral


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_bad_previous_response_id_is_a_400_naming_it(bad: object) -> None:
    with pytest.raises(BadRequest, match="previous_response_id"):
        call_metadata({}, {"previous_response_id": bad}, RESPONSES, ResponseSessions())


def test_a_response_naming_no_session_may_be_continued_unless_it_is_not_stored() -> None:
    meta = call_metadata({}, {"input": "hi", "vllm_xargs": {"call_id": "c-1"}}, RESPONSES)
    assert meta.session_id == "resp-c-1" and not meta.ephemeral
    assert not call_metadata({}, {"input": "hi", "store": True}, RESPONSES).ephemeral
    unstored = call_metadata({}, {"input": "hi", "store": False}, RESPONSES)
    assert unstored.ephemeral and unstored.session_id.startswith("call-")


def test_the_answers_remembered_are_bounded_least_recently_used_first() -> None:
    answers = ResponseSessions(limit=2)
    answers.remember("r1", "a")
    answers.remember("r2", "b")
    assert answers.session_of("r1") == "a"  # r2 is now the least recently used
    answers.remember("r3", "c")
    assert len(answers) == 2 and answers.session_of("r2") is None
    assert (answers.session_of("r1"), answers.session_of("r3")) == ("a", "c")


@pytest.fixture
def responses_engine() -> Iterator[FastAPI]:
    """The scripted engine with its Responses route (a fresh ``resp_...`` id each)."""
    latency = ScriptedLatency(first_token_s=0.01, per_token_s=0.005)
    app = create_scripted_llm_app(latency, model=MODEL)
    add_responses_route(app, latency)
    with serve_in_thread(app) as url:
        app.state.url = url
        yield app


def _respond(client: openai.OpenAI, stream: bool, **fields: Any) -> str:
    """One Responses call; the id of its answer."""
    if not stream:
        return client.responses.create(model=MODEL, input="hi", max_output_tokens=2, **fields).id
    events = client.responses.create(
        model=MODEL, input="hi", max_output_tokens=2, stream=True, **fields
    )
    (completed,) = [e for e in events if e.type == "response.completed"]
    return completed.response.id


def _sessions(gateway: Gateway) -> list[str]:
    return [e.session_id for e in gateway.hub.events() if isinstance(e, LLMSubmit)]


def _ended(gateway: Gateway) -> list[str]:
    return [e.session_id for e in gateway.hub.events() if isinstance(e, SessionEnd)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_chain_of_responses_naming_no_session_is_one_session(
    responses_engine: FastAPI, make_gateway: GatewayFactory, stream: bool
) -> None:
    with make_gateway(responses_engine.state.url) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
        first = _respond(client, stream)
        second = _respond(client, stream, previous_response_id=first)
        _respond(client, stream, previous_response_id=second)
        sessions = _sessions(gateway)
        ended = _ended(gateway)
    call_id = responses_engine.state.requests[0].body["vllm_xargs"]["call_id"]
    assert sessions == [f"resp-{call_id}"] * 3
    assert ended == []  # open until it idles out, as any client that never says goodbye
    seen = [
        (r.headers["x-session-id"], r.body["vllm_xargs"]) for r in responses_engine.state.requests
    ]
    assert [(session, xargs["session_id"], xargs["turn"]) for session, xargs in seen] == [
        (f"resp-{call_id}", f"resp-{call_id}", turn) for turn in range(3)
    ]


def test_a_call_continuing_an_answer_joins_its_session_whatever_named_it(
    responses_engine: FastAPI, make_gateway: GatewayFactory
) -> None:
    with make_gateway(responses_engine.state.url) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
        named = _respond(client, False, conversation={"id": "conv_9"})
        _respond(client, True, previous_response_id=named)
        # An answer given before the gateway (re)started: its id names the session.
        unknown = _respond(client, False, previous_response_id="resp_from_before")
        _respond(client, False, previous_response_id=unknown)
        sessions = _sessions(gateway)
    assert sessions == ["conv_9", "conv_9", "resp_from_before", "resp_from_before"]


def test_a_response_not_stored_and_naming_no_session_is_a_one_call_session(
    responses_engine: FastAPI, make_gateway: GatewayFactory
) -> None:
    with make_gateway(responses_engine.state.url) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
        _respond(client, False, store=False)
        (session,) = _sessions(gateway)
        ended = _ended(gateway)
        remembered = len(gateway.app.state.gateway.answers)
    assert session.startswith("call-") and ended == [session] and remembered == 0
    (seen,) = responses_engine.state.requests
    assert "x-session-id" not in seen.headers and "session_id" not in seen.body
