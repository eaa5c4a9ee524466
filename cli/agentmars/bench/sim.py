"""Simulator speed: the wall time of a 200-session ILR-4 run on one core, per policy,
against the same run simulated step by step (decode jumps off) in the same process.

Target (issue 4): at most 30 s of wall time for the run. The step-by-step run is the
baseline the jumps are measured against; both produce the same sessions' timings
(``tests/server/sim/test_engine.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.table import Table

from agentmars.bench.report import ProgressFn, progress_bars, publish, verdict
from agentmars.server.metrics.records import RunRecord
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine
from agentmars.server.sim.sweep import context_limit
from agentmars.server.workloads.registry import build_workload

TARGET_WALL_S = 30.0


def timed_run(
    workload_name: str,
    sessions: int,
    rate: float,
    policy: str,
    profile_name: str,
    *,
    jumps: bool,
    progress: ProgressFn,
) -> tuple[float, RunRecord]:
    profile = load_profile(profile_name)
    config = SimConfig(decode_jumps=jumps)
    workload = build_workload(
        workload_name,
        sessions=sessions,
        seed=1,
        rate=rate,
        max_context=context_limit(profile, config),
    )
    phase = f"{policy} ({'jumps' if jumps else 'step by step'})"
    engine = SimEngine(
        workload,
        make_policy(policy),
        profile,
        config,
        on_progress=lambda done: progress(phase, done, sessions),
    )
    start = time.perf_counter()
    record = engine.run()
    return time.perf_counter() - start, record


def run(
    workload: str,
    sessions: int,
    rate: float,
    policies: list[str],
    profile: str,
    baseline: bool,
    json_out: Path | None,
) -> dict[str, Any]:
    table = Table(
        title=f"simulator speed: {sessions} sessions of {workload} at {rate:g}/s on {profile}"
    )
    for column in (
        "policy",
        "wall s",
        "steps",
        "steps/s",
        "sim s / wall s",
        "step by step s",
        "speed-up",
        "<= 30 s",
    ):
        table.add_column(column, justify="right")
    figures: dict[str, Any] = {
        "workload": workload,
        "sessions": sessions,
        "rate": rate,
        "profile": profile,
        "runs": {},
    }
    with progress_bars() as progress:
        for policy in policies:
            wall, record = timed_run(
                workload, sessions, rate, policy, profile, jumps=True, progress=progress
            )
            stepwise = None
            if baseline:
                stepwise, _ = timed_run(
                    workload, sessions, rate, policy, profile, jumps=False, progress=progress
                )
            figures["runs"][policy] = {
                "wall_s": wall,
                "steps": record.steps,
                "simulated_s": record.duration_s,
                "step_by_step_wall_s": stepwise,
            }
            table.add_row(
                policy,
                f"{wall:.2f}",
                f"{record.steps:,}",
                f"{record.steps / wall:,.0f}",
                f"{record.duration_s / wall:,.0f}",
                "-" if stepwise is None else f"{stepwise:.2f}",
                "-" if stepwise is None else f"{stepwise / wall:.2f}x",
                verdict(wall <= TARGET_WALL_S),
            )
    return publish(table, figures, json_out)
