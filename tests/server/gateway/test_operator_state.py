"""The operator's fold of the stream on its own (``gateway/operator_state.py``): which
reports it counts, its percentiles, and the bounds on what clients can make it hold."""

from __future__ import annotations

from agentmars.sdk.events import (
    LLMEnd,
    LLMFirstToken,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolStart,
)
from agentmars.sdk.tool_stats import MAX_TOOL_KINDS
from agentmars.server.gateway.app import GatewayConfig, _build_gateway
from agentmars.server.gateway.operator_state import OperatorState
from agentmars.server.web.ingest import EventHub


def _operator() -> OperatorState:
    config = GatewayConfig(upstream_url="http://127.0.0.1:9", token="t", model_name="m")
    return _build_gateway(config, EventHub(), None).operator


def test_llm_figures_are_the_gateways_own_reports() -> None:
    operator = _operator()
    ids = {"session_id": "s", "call_id": "c", "turn": 0}
    operator.observe(LLMFirstToken(ttft_s=9.0, source="sdk", **ids))  # the SDK's: not ours
    for i in range(1, 11):
        operator.observe(LLMFirstToken(ttft_s=i / 10, source="gateway", **ids))
    operator.observe(LLMEnd(status="error", duration_s=1.0, source="engine", **ids))
    snapshot = operator.snapshot()
    # numpy.percentile's (linear) of 0.1 .. 1.0.
    assert snapshot.ttft_s.model_dump() == {"p50": 0.55, "p90": 0.91, "p99": 0.991, "count": 10}
    assert snapshot.llm_calls == {"ok": 0, "error": 0, "cancelled": 0}
    assert snapshot.window is None and snapshot.kv_blocks == {}


def test_a_session_is_measured_once_from_its_start_to_its_end() -> None:
    operator = _operator()
    operator.observe(SessionStart(session_id="s", mono_ns=1_000_000_000))
    for source in ("sdk", "gateway"):  # both report the end: one session
        operator.observe(SessionEnd(session_id="s", mono_ns=3_500_000_000, source=source))
    operator.observe(SessionEnd(session_id="never-started", mono_ns=3_500_000_000))
    assert operator.snapshot().session_s.model_dump() == {
        "p50": 2.5, "p90": 2.5, "p99": 2.5, "count": 1,
    }  # fmt: skip


def test_a_session_the_gateway_ended_lasts_until_its_last_activity() -> None:
    # Issue 38: sessions ended at the 300 s idle expiry were recorded as lasting 300 s.
    operator = _operator()
    operator.observe(SessionStart(session_id="s", mono_ns=1_000_000_000))
    expired = SessionEnd(
        session_id="s", mono_ns=301_000_000_000, duration_s=4.0, source="gateway",
        status="cancelled", error="no call or tool for 300 s",
    )  # fmt: skip
    operator.observe(expired)
    assert operator.snapshot().session_s.model_dump() == {
        "p50": 4.0, "p90": 4.0, "p99": 4.0, "count": 1,
    }  # fmt: skip


def test_a_tool_between_two_snapshots_is_counted_ended() -> None:
    # Issue 40: the dashboard missed tools shorter than its 1 s snapshot.
    operator = _operator()
    before = operator.snapshot()
    for i in range(3):
        tool = {"session_id": "s", "call_id": f"t{i}", "tool": "grep", "source": "sandbox"}
        operator.observe(ToolStart(**tool))
        operator.observe(ToolEnd(duration_s=0.05, **tool))
        operator.observe(ToolEnd(duration_s=0.05, **{**tool, "source": "sdk"}))  # once
    after = operator.snapshot()
    assert (before.tool_calls_ended, after.tool_calls_ended) == (0, 3)
    assert after.tool_calls["running"] == 0


def test_tool_names_share_one_label_past_the_limit() -> None:
    operator = _operator()
    for i in range(MAX_TOOL_KINDS + 10):
        operator.observe(ToolStart(session_id="s", call_id=f"c{i}", tool=f"tool-{i}"))
    (family,) = operator.tool_queue_wait.collect()
    tools = {sample.labels["tool"] for sample in family.samples}
    assert len(tools) == MAX_TOOL_KINDS + 1  # and "(other)"
