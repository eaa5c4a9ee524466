"""A replay's events as the metrics' run record (``metrics.records``), the same record
the simulator makes, so ``metrics.summary`` and ``metrics.report`` measure a replay as
they measure a simulated run.

From the agents' side of the wire: a call's submit, first token and end are the SDK's
(``llm_submit`` / ``llm_first_token`` / ``llm_end``), its tokens the engine's usage; a
tool's enqueue, start and end are the sandbox pool's. A session arrives when its agent
starts; it is admitted (ours: the agents cannot see the gateway's admission) when its
first call is submitted, so admission waits show in the first call's TTFT; it ends at
its last call's end. The prefix-cache figures are the calls' cached prompt tokens over
their prompt tokens. The tools' CPU time is the sandbox pool's ``cpu_time_s``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from agentmars.runtime.replay.agent import ReplayRun
from agentmars.sdk.events import (
    Event,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEvent,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)
from agentmars.server.metrics.records import CallRecord, RunRecord, SessionRecord, ToolRecord
from agentmars.server.workloads.model import SessionSpec, Workload

Clock = Callable[[int], float]
"""A monotonic time in ns -> seconds since the run's start."""


@dataclass(frozen=True)
class RunLabels:
    """What the record says about the run beyond the events."""

    policy: str
    engine: str
    total_blocks: int
    block_size: int
    tool_cores: int


def run_record(run: ReplayRun, workload: Workload, labels: RunLabels) -> RunRecord:
    def seconds(ns: int) -> float:
        return (ns - run.start_ns) / 1e9

    by_session: dict[str, list[Event]] = defaultdict(list)
    for event in run.events:
        if isinstance(event, SessionEvent):
            by_session[event.session_id].append(event)
    specs = {spec.session_id: spec for spec in workload.sessions}
    finished, unfinished = [], []
    for outcome in run.outcomes:
        calls = _calls(by_session[outcome.session_id], seconds)
        if outcome.error is not None or not calls:
            unfinished.append(outcome.session_id)
            continue
        spec = specs[outcome.session_id]
        finished.append(
            SessionRecord(
                session_id=outcome.session_id,
                agent=spec.agent,
                arrival_s=seconds(outcome.arrival_ns),
                admitted_s=_admitted_s(run, outcome.session_id, calls[0], seconds),
                end_s=calls[-1].end_s,
                calls=calls,
                tools=_tools(by_session[outcome.session_id], seconds),
                task_id=spec.task_id,
            )
        )
    all_calls = [call for session in finished for call in session.calls]
    return RunRecord(
        workload=workload.name,
        policy=labels.policy,
        engine=labels.engine,
        seed=workload.seed,
        sessions=finished,
        duration_s=max((session.end_s for session in finished), default=0.0),
        total_blocks=labels.total_blocks,
        block_size=labels.block_size,
        tool_cores=labels.tool_cores,
        prefix_queries=sum(call.prompt_tokens for call in all_calls),
        prefix_hits=sum(call.cached_tokens for call in all_calls),
        # The agents see no evictions; the engines count them without their times.
        evictions=None,
        tool_busy_core_s=_tool_cpu_s(run.events),
        unfinished=unfinished,
    )


def _admitted_s(run: ReplayRun, session_id: str, first: CallRecord, seconds: Clock) -> float:
    """When the gateway let the session in, read from its stream; without that, its
    first call's submit (no wait for admission seen)."""
    admitted_ns = run.admitted_ns.get(session_id)
    return first.submit_s if admitted_ns is None else seconds(admitted_ns)


def _calls(events: list[Event], seconds: Clock) -> list[CallRecord]:
    """The session's calls that ended well, in turn order."""
    submits: dict[str, LLMSubmit] = {}
    firsts: dict[str, LLMFirstToken] = {}
    calls = []
    for event in events:
        if isinstance(event, LLMSubmit):
            submits[event.call_id] = event
        elif isinstance(event, LLMFirstToken):
            firsts[event.call_id] = event
        elif isinstance(event, LLMEnd) and event.status == "ok":
            submit, first = submits.get(event.call_id), firsts.get(event.call_id)
            if submit is None or first is None:
                continue
            calls.append(
                CallRecord(
                    turn=submit.turn or 0,
                    submit_s=seconds(submit.mono_ns),
                    first_token_s=seconds(first.mono_ns),
                    end_s=seconds(event.mono_ns),
                    prompt_tokens=event.prompt_tokens or 0,
                    output_tokens=event.output_tokens or 0,
                    cached_tokens=event.cached_tokens or 0,
                )
            )
    return sorted(calls, key=lambda call: call.turn)


def _tools(events: list[Event], seconds: Clock) -> list[ToolRecord]:
    enqueued: dict[str, ToolEnqueue] = {}
    started: dict[str, ToolStart] = {}
    tools = []
    for event in events:
        if isinstance(event, ToolEnqueue):
            enqueued[event.call_id] = event
        elif isinstance(event, ToolStart):
            started[event.call_id] = event
        elif isinstance(event, ToolEnd) and event.call_id in started:
            start = started[event.call_id]
            enqueue = enqueued.get(event.call_id, start)
            tools.append(
                ToolRecord(
                    turn=event.turn or 0,
                    kind=event.tool,
                    enqueue_s=seconds(enqueue.mono_ns),
                    start_s=seconds(start.mono_ns),
                    end_s=seconds(event.mono_ns),
                )
            )
    return sorted(tools, key=lambda tool: tool.turn)


def _tool_cpu_s(events: list[Event]) -> float | None:
    """The CPU time every tool of the run used, unfinished sessions' too (they held the
    cores as much); None when no tool reported it."""
    reported = [e.cpu_time_s for e in events if isinstance(e, ToolEnd) and e.cpu_time_s is not None]
    return sum(reported) if reported else None


AS_RUN_GROUP = "as-run"
"""The prefix group of ``workload_as_run``'s sessions."""


def workload_as_run(workload: Workload, record: RunRecord) -> Workload:
    """``workload`` with each finished session's tokens as its calls had them on the
    wire: turn ``k`` appends what its prompt holds beyond call ``k - 1``'s prompt and
    output, and outputs what it generated. For agents whose prompts are their own
    (OpenHands' system prompt, tool schemas and real observations) rather than the
    workload's, so the simulator predicts the run that was made. Ours: the sessions'
    first prompts share, as a prefix group, the tokens all of them start with at most
    (an agent's system prompt and task are the same in every session); tools, arrivals
    and unfinished sessions stay as the workload has them."""
    finished = {session.session_id: session for session in record.sessions}
    firsts = [s.calls[0].prompt_tokens for s in finished.values() if s.calls]
    shared = min(firsts, default=0)
    sessions = []
    for spec in workload.sessions:
        session = finished.get(spec.session_id)
        if session is None or len(session.calls) != len(spec.turns):
            sessions.append(spec)
            continue
        turns, context = [], 0
        for call, turn in zip(session.calls, spec.turns, strict=True):
            append, output = max(call.prompt_tokens - context, 1), max(call.output_tokens, 1)
            turns.append({**turn.model_dump(), "append_tokens": append, "output_tokens": output})
            context += append + output
        prefix = min(shared, turns[0]["append_tokens"])
        # Validated anew (not ``model_copy``): a spec caches its context lengths.
        fields = {**spec.model_dump(), "turns": turns, "shared_prefix_tokens": prefix}
        if prefix:
            fields["prefix_group"] = AS_RUN_GROUP
        sessions.append(SessionSpec.model_validate(fields))
    return Workload.model_validate({**workload.model_dump(), "sessions": sessions})
