"""A replay's events as the metrics' run record: times relative to the run's start,
calls and tools per session, failed sessions unfinished."""

from __future__ import annotations

from typing import Literal

import pytest

from agentmars.runtime.replay.agent import ReplayRun, SessionOutcome
from agentmars.runtime.replay.records import AS_RUN_GROUP, RunLabels, run_record, workload_as_run
from agentmars.sdk.events import (
    Event,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)
from agentmars.server.metrics.records import CallRecord, ToolRecord
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload

START_NS = 1_000_000_000
LABELS = RunLabels(policy="fcfs", engine="twin", total_blocks=64, block_size=16, tool_cores=1)
BASH = ToolSpec(kind="bash", wall_s=0.8, cpu_s=0.8)
WORKLOAD = Workload(
    name="tiny",
    seed=3,
    sessions=(
        SessionSpec(
            session_id="a",
            agent="coder",
            task_id="t1",
            turns=(
                TurnSpec(append_tokens=100, output_tokens=10, tool=BASH),
                TurnSpec(append_tokens=20, output_tokens=5),
            ),
        ),
        SessionSpec(session_id="b", turns=(TurnSpec(append_tokens=50, output_tokens=7),)),
    ),
)


def at(seconds: float) -> int:
    """The monotonic time ``seconds`` after the run's start."""
    return START_NS + round(seconds * 1e9)


def llm_call(
    session: str,
    call: str,
    turn: int,
    times: tuple[float, float, float],
    tokens: tuple[int, int, int],
    status: Literal["ok", "error", "cancelled"] = "ok",
) -> list[Event]:
    """Submit, first token and end of one call; tokens: (prompt, output, cached)."""
    submit, first, end = times
    prompt, output, cached = tokens
    ids = {"session_id": session, "call_id": call, "turn": turn}
    return [
        LLMSubmit(**ids, mono_ns=at(submit)),
        LLMFirstToken(**ids, mono_ns=at(first), ttft_s=first - submit),
        LLMEnd(
            **ids,
            mono_ns=at(end),
            status=status,
            prompt_tokens=prompt,
            output_tokens=output,
            cached_tokens=cached,
        ),
    ]


def tool_call(session: str, call: str, turn: int, times: tuple[float, float, float]) -> list[Event]:
    enqueue, start, end = times
    ids = {"session_id": session, "call_id": call, "turn": turn, "tool": "bash"}
    return [
        ToolEnqueue(**ids, mono_ns=at(enqueue), source="sandbox"),
        ToolStart(**ids, mono_ns=at(start), source="sandbox"),
        ToolEnd(**ids, mono_ns=at(end), source="sandbox"),
    ]


def run_of(events: list[Event], outcomes: list[SessionOutcome]) -> ReplayRun:
    return ReplayRun(start_ns=START_NS, outcomes=outcomes, events=events)


def two_sessions() -> ReplayRun:
    """Session a: two turns with a tool between; session b failed after one call."""
    events = [
        # Turn 1's call is listed first: the record orders calls by turn.
        *llm_call("a", "a1", 1, (3.1, 3.2, 3.5), (130, 5, 110)),
        *llm_call("a", "a0", 0, (1.0, 1.25, 2.0), (100, 10, 0)),
        *tool_call("a", "a-tool0", 0, (2.1, 2.2, 3.0)),
        *llm_call("b", "b0", 0, (0.5, 0.75, 4.0), (50, 7, 40)),
    ]
    outcomes = [
        SessionOutcome("a", arrival_ns=at(0.5), end_ns=at(3.6)),
        SessionOutcome("b", arrival_ns=at(0.25), end_ns=at(4.5), error="b: ReplayError: tool"),
    ]
    return run_of(events, outcomes)


def test_a_finished_session_is_recorded_from_its_events() -> None:
    record = run_record(two_sessions(), WORKLOAD, LABELS)
    (session,) = record.sessions
    assert (session.session_id, session.agent, session.task_id) == ("a", "coder", "t1")
    assert session.arrival_s == pytest.approx(0.5)
    assert session.admitted_s == pytest.approx(1.0)
    assert session.end_s == pytest.approx(3.5)
    assert session.calls == [
        CallRecord(turn=0, submit_s=1.0, first_token_s=1.25, end_s=2.0, prompt_tokens=100,
                   output_tokens=10, cached_tokens=0),
        CallRecord(turn=1, submit_s=3.1, first_token_s=3.2, end_s=3.5, prompt_tokens=130,
                   output_tokens=5, cached_tokens=110),
    ]  # fmt: skip
    assert session.tools == [ToolRecord(turn=0, kind="bash", enqueue_s=2.1, start_s=2.2, end_s=3.0)]


def test_a_session_is_admitted_when_the_gateway_says_so() -> None:
    # Read from the gateway's stream: session a waited from its first call's submit
    # (1.0 s) until 1.1 s; without a reading, its admission is that submit.
    run = two_sessions()
    run.admitted_ns = {"a": at(1.1)}
    (session,) = run_record(run, WORKLOAD, LABELS).sessions
    assert session.admitted_s == pytest.approx(1.1)
    assert session.calls[0].submit_s == pytest.approx(1.0)


def test_the_run_counts_finished_sessions_only() -> None:
    record = run_record(two_sessions(), WORKLOAD, LABELS)
    assert record.unfinished == ["b"]
    # Session a's calls only: b's 50 prompt tokens (40 cached) are not counted.
    assert (record.prefix_queries, record.prefix_hits) == (100 + 130, 0 + 110)
    assert record.duration_s == pytest.approx(3.5)
    assert (record.workload, record.seed, record.policy, record.engine) == (
        "tiny",
        3,
        "fcfs",
        "twin",
    )
    assert (record.total_blocks, record.block_size, record.tool_cores) == (64, 16, 1)


def test_the_tools_cpu_time_is_the_sandbox_pools_or_not_measured() -> None:
    # What the pool said each tool used, the unfinished session b's too (it held the
    # core as much); a tool without the figure adds nothing; none at all: not measured.
    run = two_sessions()
    reported = [
        event.model_copy(update={"cpu_time_s": 0.75}) if isinstance(event, ToolEnd) else event
        for event in run.events
    ]
    b_tools = tool_call("b", "b-tool0", 0, (1.0, 1.0, 1.5)) + tool_call(
        "b", "b-tool1", 1, (2, 2, 3)
    )
    b_tools[2] = b_tools[2].model_copy(update={"cpu_time_s": 0.25})
    measured = run_record(run_of([*reported, *b_tools], run.outcomes), WORKLOAD, LABELS)
    assert measured.tool_busy_core_s == pytest.approx(1.0)
    assert run_record(run, WORKLOAD, LABELS).tool_busy_core_s is None


def test_a_call_that_ended_in_error_is_not_a_record() -> None:
    events = [
        *llm_call("a", "a0-try", 0, (1.0, 1.1, 1.5), (100, 3, 0), status="error"),
        *llm_call("a", "a0", 0, (2.0, 2.5, 3.0), (100, 10, 60)),
        *llm_call("b", "b0", 0, (1.0, 1.5, 2.5), (50, 7, 0), status="error"),
    ]
    outcomes = [SessionOutcome("a", arrival_ns=at(0.0)), SessionOutcome("b", arrival_ns=at(0.0))]
    record = run_record(run_of(events, outcomes), WORKLOAD, LABELS)
    (session,) = record.sessions
    assert [(call.submit_s, call.end_s) for call in session.calls] == [pytest.approx((2.0, 3.0))]
    assert session.admitted_s == pytest.approx(2.0)
    # b's only call failed: no calls, so the session did not finish.
    assert record.unfinished == ["b"]
    assert (record.prefix_queries, record.prefix_hits) == (100, 60)
    assert record.duration_s == pytest.approx(3.0)


def test_a_run_without_finished_sessions_lasts_zero() -> None:
    outcomes = [SessionOutcome("a", arrival_ns=at(0.0), error="a: ReplayError: engine")]
    record = run_record(run_of([], outcomes), WORKLOAD, LABELS)
    assert (record.sessions, record.unfinished, record.duration_s) == ([], ["a"], 0.0)


def test_the_workload_as_run_has_the_tokens_the_calls_had_on_the_wire() -> None:
    record = run_record(two_sessions(), WORKLOAD, LABELS)
    as_run = workload_as_run(WORKLOAD, record)
    a, b = as_run.sessions
    # Session a's calls had prompts of 100 and 130 tokens, outputs of 10 and 5: turn 1
    # appended 130 - (100 + 10) = 20.
    assert [(t.append_tokens, t.output_tokens) for t in a.turns] == [(100, 10), (20, 5)]
    assert [a.prompt_tokens(0), a.prompt_tokens(1)] == [100, 130]
    assert a.turns[0].tool == BASH and (a.agent, a.task_id) == ("coder", "t1")
    # Its first prompt is the shortest first prompt of the finished sessions: shared.
    assert (a.shared_prefix_tokens, a.prefix_group) == (100, AS_RUN_GROUP)
    assert b == WORKLOAD.sessions[1]  # unfinished: as the workload has it
