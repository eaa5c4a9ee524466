"""What every integration writes into a request (``request.begin_call``), without a
server: the ids, the session's agent and task, and the caller's hints."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from agentmars import sdk
from agentmars.sdk.events import LLMSubmit
from agentmars.sdk.integrations.request import (
    CHARS_PER_TOKEN,
    begin_call,
    project_prompt_tokens,
    remember_tool_priority,
    tool_priority_of,
)


def _xargs(**kwargs: Any) -> dict[str, Any]:
    """The ``vllm_xargs`` a chat request made now would carry."""
    kwargs.setdefault("messages", [{"role": "user", "content": "hi"}])
    call = begin_call(kwargs, "chat")
    assert call is not None
    call.end()
    xargs: dict[str, Any] = kwargs["extra_body"]["vllm_xargs"]
    return xargs


def test_the_call_id_on_the_wire_is_the_one_the_events_carry(
    emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    with sdk.session(emitter=emitter):
        first, second = _xargs(), _xargs()
    submits = [e for e in events.events if isinstance(e, LLMSubmit)]
    assert [first["call_id"], second["call_id"]] == [e.call_id for e in submits]
    assert first["call_id"] != second["call_id"]


def test_the_sessions_agent_and_task_go_with_every_call(emitter: sdk.Emitter) -> None:
    with sdk.session(agent="coder", task_id="issue-42", emitter=emitter):
        xargs = _xargs()
    assert (xargs["agent"], xargs["task_id"]) == ("coder", "issue-42")
    with sdk.session(emitter=emitter):
        xargs = _xargs()
    assert "agent" not in xargs and "task_id" not in xargs  # not known: not sent


def test_hints_go_with_the_calls_inside_their_block_only(emitter: sdk.Emitter) -> None:
    with sdk.session(emitter=emitter):
        with sdk.hints(next_tool="pytest", expected_tool_s=30):
            inside = _xargs()
            with sdk.hints(next_tool="ls"):  # replaces, does not merge
                inner = _xargs()
            again = _xargs()
        after = _xargs()
    assert (inside["next_tool"], inside["expected_tool_s"]) == ("pytest", 30)
    assert inner["next_tool"] == "ls" and "expected_tool_s" not in inner
    assert again["next_tool"] == "pytest"
    assert "next_tool" not in after and "expected_tool_s" not in after


def test_a_hinted_next_tool_marks_the_call_as_expecting_a_tool(emitter: sdk.Emitter) -> None:
    # A completion offers no tools; the hint says the answer is a tool call all the same.
    with sdk.session(emitter=emitter):
        with sdk.hints(next_tool="pytest"):
            hinted = _xargs()
        with sdk.hints(expected_tool_s=3):  # a duration alone names no tool
            unnamed = _xargs()
        plain = _xargs()
    assert (hinted["expects_tool"], unnamed["expects_tool"], plain["expects_tool"]) == (1, 0, 0)


def test_a_callers_own_xargs_win_over_hints_but_not_over_the_ids(
    emitter: sdk.Emitter,
) -> None:
    own = {"next_tool": "make", "agent": "fixer", "call_id": "mine", "turn": 9, "custom": 1}
    with sdk.session(agent="coder", emitter=emitter), sdk.hints(next_tool="pytest"):
        xargs = _xargs(extra_body={"vllm_xargs": own})
    assert (xargs["next_tool"], xargs["agent"], xargs["custom"]) == ("make", "fixer", 1)
    # The ids and markers stay the SDK's: its events name the call by them.
    assert xargs["call_id"] != "mine" and xargs["turn"] == 0


async def test_concurrent_tasks_keep_their_own_hints(emitter: sdk.Emitter) -> None:
    async def branch(tool: str) -> Any:
        async with sdk.hints(next_tool=tool):
            await asyncio.sleep(0.01)  # the other branch opens its block meanwhile
            return _xargs()["next_tool"]

    async with sdk.session(emitter=emitter):
        assert await asyncio.gather(branch("a"), branch("b")) == ["a", "b"]


def test_a_decorated_function_runs_under_its_hints(emitter: sdk.Emitter) -> None:
    @sdk.hints(next_tool="pytest", expected_tool_s=2.5)
    def ask() -> Any:
        return _xargs()

    with sdk.session(emitter=emitter):
        xargs = ask()
        assert "next_tool" not in _xargs()
    assert (xargs["next_tool"], xargs["expected_tool_s"]) == ("pytest", 2.5)


@pytest.mark.parametrize(
    ("value", "priority"),
    [("7", 7), (" -3 ", -3), ("+2", 2), ("-2147483648", -(2**31)), ("2147483647", 2**31 - 1)],
)
def test_the_tool_priority_header_is_read(value: str, priority: int) -> None:
    assert tool_priority_of({"X-Agentmars-Tool-Priority": value}) == priority
    assert tool_priority_of({"x-agentmars-tool-priority": value}) == priority
    assert tool_priority_of(httpx.Headers({"X-AGENTMARS-TOOL-PRIORITY": value})) == priority


@pytest.mark.parametrize(
    "value", ["", "abc", "1.5", "1e3", "0x10", "1_0", "٣", "2147483648", "9" * 40]
)
def test_a_malformed_tool_priority_counts_as_0(value: str) -> None:
    assert tool_priority_of({"x-agentmars-tool-priority": value}) == 0


def test_no_tool_priority_header_is_none() -> None:
    assert tool_priority_of({"content-type": "application/json"}) is None
    assert tool_priority_of(None) is None


def test_the_tool_priority_is_kept_for_the_current_session_only(emitter: sdk.Emitter) -> None:
    remember_tool_priority({"x-agentmars-tool-priority": "5"})  # no session: nothing kept
    with sdk.session(emitter=emitter) as s:
        remember_tool_priority({"x-agentmars-tool-priority": "5"})
        remember_tool_priority({})  # an answer without one keeps the newest
        assert s.tool_priority == 5
        remember_tool_priority({"x-agentmars-tool-priority": "five"})
        assert s.tool_priority == 0


def test_a_prompt_of_token_ids_is_projected_exactly() -> None:
    assert project_prompt_tokens({"prompt": [101, 7, 2048, 9]}) == 4
    # Text is projected by its length, as are ids that are not all integers.
    assert project_prompt_tokens({"prompt": "x" * 40}) == 40 // CHARS_PER_TOKEN
    assert project_prompt_tokens({"prompt": [True, False]}) == len("[True, False]") // 4


def test_the_tools_offered_count_in_the_projection() -> None:
    # A chat template writes the tools' schemas into the prompt.
    messages = [{"role": "user", "content": "run the tests"}]
    tool = {"type": "function", "function": {"name": "terminal", "parameters": {}}}
    bare = project_prompt_tokens({"messages": messages})
    offered = project_prompt_tokens({"messages": messages, "tools": [tool] * 10})
    assert bare is not None and offered is not None
    assert offered - bare >= 10 * len(str(tool)) // CHARS_PER_TOKEN - 10
    assert project_prompt_tokens({"messages": messages, "tools": None}) == bare
