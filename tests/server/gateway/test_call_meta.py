"""What the gateway reads of a request (``call_metadata``), without servers: the
session and its sources' precedence, the call id, the tool markers and the hints."""

from __future__ import annotations

from typing import Any

import pytest

from agentmars.server.gateway.call_meta import BadRequest, call_metadata

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
