"""Small hand-built run records for the metrics tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmars.server.metrics.records import CallRecord, RunRecord, SessionRecord, ToolRecord


def call(
    turn: int,
    submit_s: float,
    ttft_s: float,
    output_tokens: int = 1,
    tpot_s: float = 0.0,
    **fields: Any,
) -> CallRecord:
    """A call given by its TTFT and TPOT (the first token at submit + TTFT, the last
    ``(output_tokens - 1) x TPOT`` later)."""
    first = submit_s + ttft_s
    end = first + tpot_s * (output_tokens - 1)
    return CallRecord(
        turn=turn,
        submit_s=submit_s,
        first_token_s=first,
        end_s=end,
        prompt_tokens=fields.pop("prompt_tokens", 100),
        output_tokens=output_tokens,
        **fields,
    )


def session(
    session_id: str,
    arrival_s: float,
    end_s: float,
    *,
    agent: str = "agent",
    calls: Sequence[CallRecord] = (),
    tools: Sequence[ToolRecord] = (),
    task_id: str | None = None,
) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        agent=agent,
        arrival_s=arrival_s,
        admitted_s=arrival_s,
        end_s=end_s,
        calls=list(calls),
        tools=list(tools),
        task_id=task_id,
    )


def tool(enqueue_s: float, start_s: float, end_s: float, turn: int = 0) -> ToolRecord:
    return ToolRecord(turn=turn, kind="terminal", enqueue_s=enqueue_s, start_s=start_s, end_s=end_s)


def run(
    sessions: Sequence[SessionRecord], duration_s: float, *, policy: str = "fcfs", **fields: Any
) -> RunRecord:
    return RunRecord(
        workload=fields.pop("workload", "toy"),
        policy=policy,
        engine="sim:test",
        seed=7,
        sessions=list(sessions),
        duration_s=duration_s,
        total_blocks=fields.pop("total_blocks", 1000),
        block_size=16,
        tool_cores=fields.pop("tool_cores", 2),
        **fields,
    )
