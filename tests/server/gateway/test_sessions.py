"""Session metadata of a request and the gateway's view of tools, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from agentmars.sdk.events import KVStats, SessionEnd, ToolEnd, ToolEnqueue, ToolStart
from agentmars.server.gateway.sessions import BadRequest, call_metadata
from agentmars.server.gateway.telemetry import GatewayView


def test_the_header_the_body_and_xargs_may_all_name_the_session() -> None:
    cases: list[tuple[dict[str, str], dict[str, Any]]] = [
        ({"x-session-id": "s"}, {}),
        ({}, {"session_id": "s"}),
        ({}, {"vllm_xargs": {"session_id": "s"}}),
        ({"x-session-id": "s"}, {"session_id": "s", "vllm_xargs": {"session_id": "s"}}),
    ]
    for headers, body in cases:
        meta = call_metadata(headers, body)
        assert meta.session_id == "s" and not meta.ephemeral


def test_a_request_without_a_session_is_a_session_of_its_own() -> None:
    first, second = call_metadata({}, {}), call_metadata({}, {})
    assert first.ephemeral and first.session_id.startswith("call-")
    assert first.session_id != second.session_id


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
        {"session_id": 7},
        {"session_id": "caf\u00e9"},  # not ASCII: cannot travel in X-Session-ID
        {"session_id": "a\nb"},
    ],
)
def test_bad_xargs_are_refused(xargs: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        call_metadata({}, {"vllm_xargs": xargs})


def test_the_view_tracks_tools_and_their_moving_average() -> None:
    view = GatewayView(tool_cores=2)
    view.observe(ToolStart(session_id="s", call_id="a", tool="pytest"))
    view.observe(
        ToolStart(session_id="t", call_id="a", tool="pytest")
    )  # same call id, other session
    assert view.active_tools == 2
    view.observe(ToolEnd(session_id="s", call_id="a", tool="pytest", duration_s=10.0))
    view.observe(ToolEnd(session_id="t", call_id="a", tool="pytest", duration_s=5.0))
    assert view.active_tools == 0
    assert view.tool_ema_s["pytest"] == pytest.approx(0.2 * 5.0 + 0.8 * 10.0)  # 9.0


def test_a_sessions_end_ends_its_unfinished_tools() -> None:
    view = GatewayView()
    view.observe(ToolEnqueue(session_id="s", call_id="a", tool="ls"))
    view.observe(ToolStart(session_id="s", call_id="b", tool="ls"))
    view.observe(ToolStart(session_id="t", call_id="c", tool="ls"))
    assert (view.queued_tools, view.active_tools) == (1, 2)
    assert view.runs_tools("s")
    view.observe(SessionEnd(session_id="s"))
    assert (view.queued_tools, view.active_tools) == (0, 1)
    assert not view.runs_tools("s") and view.runs_tools("t")


def test_the_view_reads_kv_from_the_newest_kv_stats_event() -> None:
    view = GatewayView(block_size=16)
    assert (view.total_blocks, view.free_blocks, view.pinned_blocks) == (0, 0, 0)  # unknown
    view.observe(KVStats(total_blocks=64, free_blocks=10, used_blocks=54, pinned_blocks=4))
    assert (view.total_blocks, view.free_blocks, view.pinned_blocks) == (64, 10, 4)
    assert view.blocks_for(33) == 3
