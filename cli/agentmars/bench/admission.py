"""``agentmars bench admission``: what admission costs one call, by how many sessions
sit idle at the gateway (issue 10: the cost must follow the changes, not the sessions).

The gateway's own ``Admission`` with each registered policy's admission half, in
process (no HTTP, so that the figure is admission's alone): ``idle`` sessions are
admitted first, each made one call and went quiet, half of them with a tool call that
never reported its end. Then each measured session lives a whole life of one call:
its ``session_start``, its call entering (waiting for and getting admission), the
call's ``llm_submit`` and ``llm_end``, the call leaving, its ``session_end``. The
events are built before the clock starts. The figure is the median and p99 of that
life per call; the baseline in the same run is the smallest idle count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from agentmars.bench.report import ProgressFn, percentiles_us, progress_bars, publish, verdict
from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolStart,
)
from agentmars.server.gateway.admission import Admission
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.registry import make_policy, policy_names

IDLE_SESSIONS = (10, 1_000, 10_000)
FLAT_WITHIN = 2.0
"""The issue's target: the per-call cost at the most idle sessions within this factor
of the cost at the fewest."""
AMPLE_KV = KVStats(total_blocks=1 << 30, free_blocks=1 << 30, used_blocks=0)
"""KV figures for halves that fit prompts into free KV: room for everything, so that
no measured session waits on anything but admission's own work."""
AMPLE_TOOL_CORES = 1 << 30
"""Tool cores, for halves that hold sessions while tools crowd the host (MARS): half
the idle sessions have a tool call that never ends, which must not close a window."""


def _meta(session_id: str) -> CallMeta:
    return CallMeta(
        session_id=session_id, call_id="c", turn=None, follows_tool=False,
        expects_tool=False, prompt_tokens=64, ephemeral=False,
    )  # fmt: skip


def _admission(policy: str) -> Admission:
    ended: list[AnyEvent] = []
    view = StreamAdmissionView(
        clock=time.monotonic,
        block_size=16,
        tool_cores=AMPLE_TOOL_CORES,
        kv_sources=[lambda: AMPLE_KV],
    )
    return Admission(
        make_policy(policy).admission(), view, policy_name=policy, publish=ended.extend
    )


async def _one_call(admission: Admission, session_id: str, events: Sequence[AnyEvent]) -> None:
    start, submit, end, over = events
    admission.on_events([start])
    await admission.enter(_meta(session_id))
    admission.on_events([submit])
    admission.on_events([end])
    admission.leave(session_id)
    admission.on_events([over])


def _life(session_id: str) -> list[AnyEvent]:
    return [
        SessionStart(session_id=session_id, agent="bench"),
        LLMSubmit(session_id=session_id, call_id="c", turn=0, projected_prompt_tokens=64),
        LLMEnd(session_id=session_id, call_id="c", turn=0),
        SessionEnd(session_id=session_id, turns=1),
    ]


async def _make_idle(admission: Admission, idle: int) -> None:
    for n in range(idle):
        session_id = f"idle-{n}"
        admission.on_events([SessionStart(session_id=session_id, agent="bench")])
        await admission.enter(_meta(session_id))
        admission.leave(session_id)
        if n % 2:  # a tool whose end never comes
            admission.on_events([ToolStart(session_id=session_id, call_id="t", tool="bash")])


async def _measure(policy: str, idle: int, calls: int, progress: ProgressFn) -> dict[str, Any]:
    admission = _admission(policy)
    await _make_idle(admission, idle)
    lives = [_life(f"m-{n}") for n in range(calls)]
    samples: list[int] = []
    phase = f"{policy}, {idle} idle"
    for n, events in enumerate(lives):
        started = time.perf_counter_ns()
        await _one_call(admission, f"m-{n}", events)
        samples.append(time.perf_counter_ns() - started)
        if n % 100 == 0 or n == calls - 1:
            progress(phase, n + 1, calls)
    # Seated, or past their gap with their seat given back: open either way.
    still_open = len(admission.admitted) + len(admission.known)
    if still_open != idle:
        raise RuntimeError(f"{policy}: {still_open} sessions open, expected {idle}")
    return percentiles_us(samples)


def run(
    calls: int,
    json_out: Path | None,
    policies: Sequence[str] | None = None,
    idle_sessions: Sequence[int] = IDLE_SESSIONS,
) -> dict[str, Any]:
    """Measure every policy at every idle count; the figures by policy and count."""
    names = list(policies or policy_names())
    figures: dict[str, Any] = {"calls": calls, "idle_sessions": list(idle_sessions)}
    with progress_bars() as progress:
        for policy in names:
            figures[policy] = {
                str(idle): asyncio.run(_measure(policy, idle, calls, progress))
                for idle in idle_sessions
            }
    table = Table(title=f"admission per call (one session's life), {calls} calls per row")
    for column in ("policy", "idle sessions", "p50 us", "p99 us", "p50 ratio", "flat"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    baseline = str(idle_sessions[0])
    for policy in names:
        rows = figures[policy]
        worst = max(rows[str(idle)]["p50"] for idle in idle_sessions)
        rows["ratio"] = worst / rows[baseline]["p50"]
        rows["flat"] = rows["ratio"] <= FLAT_WITHIN
        for idle in idle_sessions:
            row = rows[str(idle)]
            ratio = row["p50"] / rows[baseline]["p50"]
            flat = verdict(rows["flat"]) if idle == idle_sessions[-1] else ""
            table.add_row(
                policy, f"{idle:,}", f"{row['p50']:.1f}", f"{row['p99']:.1f}", f"{ratio:.2f}x", flat
            )
    figures["flat"] = all(figures[policy]["flat"] for policy in names)
    return publish(table, figures, json_out)
