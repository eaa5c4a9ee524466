"""The twin answers with tool calls when tools are offered: which tool (the decision
table of ``engines.twin.tool_calls``), arguments its schema accepts, whole and
streamed, read by the real OpenAI client from a twin on loopback."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from agentmars.server.engines.twin.engine import LiveError
from agentmars.server.engines.twin.tool_calls import (
    TOOL_TURNS,
    SessionHints,
    tool_call_for,
)
from tests.server.engines.twin.conftest import MODEL


def _function(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TERMINAL = _function("terminal", {"command": {"type": "string"}}, ["command"])
FINISH = _function("finish", {"message": {"type": "string"}}, ["message"])
EDIT = _function(
    "edit",
    {
        "where": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
            "required": ["path", "line"],
        },
        "mode": {"type": "string", "enum": ["insert", "replace"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer"},
        "dry_run": {"type": "boolean"},
        "note": {"type": "string"},
    },
    ["where", "mode", "tags", "count", "dry_run"],
)
MESSAGES = [{"role": "user", "content": "fix the bug"}]


# --- the decision, without a server --------------------------------------------------


def _chosen(body: dict[str, Any], turn: int = 0, **hints: Any) -> str | None:
    call = tool_call_for(body, SessionHints(turn, **hints))
    return None if call is None else call.name


def test_tool_choice_none_answers_in_text_and_required_always_calls() -> None:
    tools = [FINISH, TERMINAL]
    assert _chosen({"tools": tools, "tool_choice": "none"}) is None
    # The first working tool, even past the turns auto calls tools for, or when the
    # script says no tool comes: "required" wins.
    assert _chosen({"tools": tools, "tool_choice": "required"}) == "terminal"
    assert _chosen({"tools": tools, "tool_choice": "required"}, expects_tool=False) == "terminal"
    assert _chosen({"tools": [FINISH], "tool_choice": "required"}) == "finish"


def test_auto_follows_the_script_then_calls_tools_for_a_few_turns_then_finishes() -> None:
    offered = {"tools": [TERMINAL, EDIT, FINISH]}
    assert _chosen(offered, expects_tool=False) is None
    assert _chosen(offered, expects_tool=True, next_tool="edit") == "edit"
    assert _chosen(offered, next_tool="not offered") == "terminal"
    turns = [_chosen(offered, turn) for turn in range(TOOL_TURNS + 2)]
    assert turns == ["terminal"] * TOOL_TURNS + ["finish"] * 2
    # Without a finish tool a session ends in text, though the gateway says a tool may
    # come (it does whenever tools are offered); a script names the tool it wants.
    plain = {"tools": [TERMINAL]}
    assert _chosen(plain, TOOL_TURNS) is None
    assert _chosen(plain, TOOL_TURNS, expects_tool=True) is None
    assert _chosen(plain, TOOL_TURNS, expects_tool=True, next_tool="terminal") == "terminal"
    assert _chosen({}, 0, expects_tool=True) is None  # nothing offered: text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [TERMINAL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [TERMINAL], "tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TERMINAL}, "tools"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
        ({"tools": [_function("t", {"a": {"type": "widget"}}, ["a"])], "tool_choice": "required"},
         "tools"),
    ],
)  # fmt: skip
def test_bad_tools_and_choices_are_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(LiveError) as refused:
        tool_call_for(body, SessionHints(0))
    assert refused.value.param == param


# --- over HTTP, with the OpenAI client -----------------------------------------------


def test_required_answers_with_one_call_of_an_offered_tool(twin: openai.OpenAI) -> None:
    reply = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[TERMINAL, EDIT], tool_choice="required",
        max_tokens=12,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "terminal"
    assert json.loads(call.function.arguments) == {"command": "lorem"}
    # The tokens follow the paced decode: the call's whole budget says the tool call.
    assert reply.usage is not None and reply.usage.completion_tokens == 12


def _check_edit_arguments(arguments: dict[str, Any]) -> None:
    assert set(arguments) == {"where", "mode", "tags", "count", "dry_run"}  # no optional
    assert isinstance(arguments["where"]["path"], str)
    assert type(arguments["where"]["line"]) is int
    assert arguments["mode"] == "insert"  # an enum's first value
    assert isinstance(arguments["tags"], list)
    assert all(isinstance(tag, str) for tag in arguments["tags"])
    assert type(arguments["count"]) is int
    assert type(arguments["dry_run"]) is bool


def test_a_named_function_is_called_with_arguments_its_schema_asks_for(
    twin: openai.OpenAI,
) -> None:
    reply = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[TERMINAL, EDIT],
        tool_choice={"type": "function", "function": {"name": "edit"}}, max_tokens=4,
    )  # fmt: skip
    calls = reply.choices[0].message.tool_calls
    assert calls is not None and calls[0].type == "function"
    assert calls[0].function.name == "edit"
    _check_edit_arguments(json.loads(calls[0].function.arguments))


def test_an_unknown_function_named_gets_a_400_in_vllms_error_body(twin_url: str) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "tools": [TERMINAL],
            "tool_choice": {"type": "function", "function": {"name": "rm_rf"}}}  # fmt: skip
    reply = httpx.post(f"{twin_url}/v1/chat/completions", json=body, timeout=10)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "tool_choice" and "'rm_rf'" in error["message"]


class Color(StrEnum):
    RED = "red"
    GREEN = "green"


class Where(BaseModel):
    path: str
    line: int


class Edit(BaseModel):
    where: Where
    color: Color
    mode: Literal["insert", "replace"]
    tags: list[str]
    count: int
    dry_run: bool


def test_the_clients_helpers_parse_a_strict_tools_arguments_whole_and_streamed(
    twin: openai.OpenAI,
) -> None:
    # A strict pydantic tool: nested model and enum behind $ref, parsed by the client.
    tools = [openai.pydantic_function_tool(Edit, name="edit")]
    choice = {"type": "function", "function": {"name": "edit"}}
    whole = twin.chat.completions.parse(
        model=MODEL,
        messages=MESSAGES,
        tools=tools,
        tool_choice=choice,
        max_tokens=8,  # type: ignore[arg-type]
    )
    calls = whole.choices[0].message.tool_calls
    assert calls is not None and isinstance(calls[0].function.parsed_arguments, Edit)
    with twin.chat.completions.stream(
        model=MODEL,
        messages=MESSAGES,
        tools=tools,
        tool_choice=choice,
        max_tokens=30,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    streamed = final.choices[0].message.tool_calls
    assert streamed is not None and len(streamed) == 1
    assert streamed[0].function.parsed_arguments == calls[0].function.parsed_arguments


def test_a_streamed_tool_call_comes_in_openais_chunk_format(twin: openai.OpenAI) -> None:
    chunks = list(
        twin.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=[EDIT], tool_choice="required", max_tokens=25,
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    pieces = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert len(pieces) == 25  # one a decoded token
    first = pieces[0]
    assert first.index == 0 and first.type == "function"
    assert first.id is not None and first.id.startswith("call_")
    assert first.function is not None and first.function.name == "edit"
    assert all(p.index == 0 and p.id is None for p in pieces[1:])
    arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
    _check_edit_arguments(json.loads(arguments))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 25


def test_auto_follows_expects_tool_from_the_session_metadata(twin: openai.OpenAI) -> None:
    def answer(**xargs: Any) -> Any:
        reply = twin.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=[TERMINAL, EDIT], max_tokens=3,
            extra_body={"vllm_xargs": xargs},
        )  # fmt: skip
        return reply.choices[0]

    text = answer(expects_tool=0)
    assert (text.finish_reason, text.message.content) == ("length", "lorem ipsum dolor ")
    assert not text.message.tool_calls
    called = answer(expects_tool=1, next_tool="edit", turn=7)  # a replayed script's tool
    assert called.finish_reason == "tool_calls"
    assert called.message.tool_calls is not None
    assert called.message.tool_calls[0].function.name == "edit"


def test_an_agent_session_on_auto_runs_tools_then_calls_finish(twin: openai.OpenAI) -> None:
    # As an OpenHands agent: each call's context is the previous one plus the answer
    # and the tool's result, one session (X-Session-ID), no turn given.
    messages: list[Any] = [{"role": "user", "content": "fix the bug"}]
    names = []
    for _ in range(TOOL_TURNS + 1):
        reply = twin.chat.completions.create(
            model=MODEL, messages=messages, tools=[TERMINAL, FINISH], max_tokens=6,
            extra_headers={"X-Session-ID": "agent-1"},
        )  # fmt: skip
        message = reply.choices[0].message
        assert message.tool_calls is not None
        call = message.tool_calls[0]
        names.append(call.function.name)
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "done"}]  # fmt: skip
    assert names == ["terminal"] * TOOL_TURNS + ["finish"]
    assert json.loads(call.function.arguments) == {"message": "lorem"}


def test_tool_choice_none_answers_in_text(twin: openai.OpenAI) -> None:
    reply = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[TERMINAL], tool_choice="none", max_tokens=2
    )
    assert reply.choices[0].message.content == "lorem ipsum "
    assert reply.choices[0].finish_reason == "length"
