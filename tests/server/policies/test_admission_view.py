"""The admission half's view built from the stream (``policies.admission_view``), as the
gateway and the simulator's gateway build it."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import KVStats, SessionEnd, ToolEnd, ToolEnqueue, ToolStart, ToolStats
from agentmars.server.policies.admission_view import StreamAdmissionView


def view(**fields: object) -> StreamAdmissionView:
    return StreamAdmissionView(clock=lambda: 7.0, block_size=16, tool_cores=2, **fields)  # type: ignore[arg-type]


def test_the_view_tracks_tools_and_their_moving_average() -> None:
    seen = view()
    seen.observe(ToolStart(session_id="s", call_id="a", tool="pytest"))
    seen.observe(ToolStart(session_id="t", call_id="a", tool="pytest"))  # same id, other session
    assert seen.active_tools == 2
    seen.observe(ToolEnd(session_id="s", call_id="a", tool="pytest", duration_s=10.0))
    seen.observe(ToolEnd(session_id="t", call_id="a", tool="pytest", duration_s=5.0))
    assert seen.active_tools == 0
    assert seen.tool_ema_s["pytest"] == pytest.approx(0.2 * 5.0 + 0.8 * 10.0)  # 9.0


def test_a_sessions_end_ends_its_unfinished_tools() -> None:
    seen = view()
    seen.observe(ToolEnqueue(session_id="s", call_id="a", tool="ls"))
    seen.observe(ToolStart(session_id="s", call_id="b", tool="ls"))
    seen.observe(ToolStart(session_id="t", call_id="c", tool="ls"))
    assert (seen.queued_tools, seen.active_tools) == (1, 2)
    assert seen.runs_tools("s")
    seen.observe(SessionEnd(session_id="s"))
    assert (seen.queued_tools, seen.active_tools) == (0, 1)
    assert not seen.runs_tools("s") and seen.runs_tools("t")


def test_the_kv_figures_are_the_newest_kv_stats_event_until_a_source_is_named() -> None:
    seen = view()
    assert seen.kv is None  # unknown until the engine says
    figures = KVStats(total_blocks=64, free_blocks=10, used_blocks=54, pinned_blocks=4)
    seen.observe(figures)
    assert seen.kv is figures
    assert seen.blocks_for(33) == 3 and seen.now == 7.0


def test_a_kv_source_wins_over_the_stream_and_the_host_counts_the_sessions() -> None:
    from_engine = KVStats(total_blocks=8, free_blocks=8, used_blocks=0)
    seen = view(kv_sources=[lambda: from_engine], active_sessions=lambda: 3)
    seen.observe(KVStats(total_blocks=64, free_blocks=1, used_blocks=63))
    assert seen.kv is from_engine
    assert seen.active_sessions == 3 and seen.tool_cores == 2


def test_the_tool_cores_are_the_sandboxs_once_it_says_them() -> None:
    seen = view()  # the host's guess: 2
    seen.observe(ToolStats(active=0))  # a host that does not say keeps the guess
    assert seen.tool_cores == 2
    seen.observe(ToolStats(active=1, cores=1, source="sandbox"))
    assert seen.tool_cores == 1
