"""Seed 004 §5.3 (Fig. 9): one elephant agent (MapReduce Summarization) submitted first,
then mice (KBQAV, CC, ALFWI at random) once per second; the elephant's job completion
time against the number of mice. Under SRJF it grows without bound as mice keep
coming (they are always shorter); under Justitia it is bounded (Theorem B.1), whatever
their number.

Runs on the simulated engine (``--profile``), each policy on the same ``elephant-mice``
workload for each count of mice; prints the elephant's JCT and the mice's mean JCT per
policy and count, and each policy's elephant JCT at the most mice over its JCT at the
fewest (the growth)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from agentmars.bench.report import ProgressFn, publish
from agentmars.server.metrics.records import RunRecord
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimConfig
from agentmars.server.sim.sweep import context_limit, run_policy
from agentmars.server.workloads.registry import build_workload

WORKLOAD = "elephant-mice"


def run(
    mice: Sequence[int],
    policies: Sequence[str],
    profile_name: str,
    seed: int,
    mice_per_s: float,
    out: Path | None,
    json_out: Path | None,
    progress: ProgressFn,
) -> dict[str, Any]:
    profile = load_profile(profile_name)
    config = SimConfig()
    points: list[dict[str, Any]] = []
    total = len(mice) * len(policies)
    for count in mice:
        workload = build_workload(
            WORKLOAD,
            sessions=count + 1,
            seed=seed,
            rate=mice_per_s,
            max_context=context_limit(profile, config),
        )
        for policy in policies:
            record = run_policy(workload, policy, profile, config)
            points.append({"mice": count, "policy": policy, **job_times(record)})
            progress("runs", len(points), total)
    growths = growth(points)
    results = {
        "workload": WORKLOAD,
        "profile": profile.name,
        "seed": seed,
        "mice_per_s": mice_per_s,
        "points": points,
        "growth": growths,
    }
    if out is not None:
        plot(points, out / "starvation.png", f"{profile.name}, {mice_per_s:g} mice/s")
    return publish(results_table(points, growths), results, json_out)


def job_times(record: RunRecord) -> dict[str, float]:
    """The elephant's JCT (the first agent instance to arrive) and the mice's mean; an
    instance's JCT is its first arrival to its last end (seed 004 §5.1)."""
    spans: defaultdict[str, list[float]] = defaultdict(list)
    for session in record.sessions:
        spans[session.instance] += [session.arrival_s, session.end_s]
    arrived = sorted(spans, key=lambda instance: min(spans[instance]))
    jct = {instance: max(spans[instance]) - min(spans[instance]) for instance in arrived}
    elephant, *mice = arrived
    return {
        "elephant_jct_s": jct[elephant],
        "mice_mean_jct_s": sum(jct[m] for m in mice) / len(mice) if mice else 0.0,
        "unfinished": float(len(record.unfinished)),
    }


def growth(points: list[dict[str, Any]]) -> dict[str, float]:
    """Per policy: the elephant's JCT with the most mice over its JCT with the fewest."""
    by_policy: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for point in points:
        by_policy[point["policy"]].append(point)
    return {
        policy: max(runs, key=lambda p: p["mice"])["elephant_jct_s"]
        / min(runs, key=lambda p: p["mice"])["elephant_jct_s"]
        for policy, runs in by_policy.items()
    }


def results_table(points: list[dict[str, Any]], growths: dict[str, float]) -> Table:
    table = Table(title="Seed 004 §5.3: the elephant's JCT as mice keep arriving")
    for column in ("mice", "policy", "elephant JCT s", "mice mean JCT s"):
        table.add_column(column, justify="right")
    for point in points:
        table.add_row(
            str(point["mice"]),
            point["policy"],
            f"{point['elephant_jct_s']:.1f}",
            f"{point['mice_mean_jct_s']:.1f}",
        )
    table.caption = "elephant JCT, most mice / fewest: " + ", ".join(
        f"{policy} {ratio:.2f}x" for policy, ratio in growths.items()
    )
    return table


def plot(points: list[dict[str, Any]], path: Path, where: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 4.0))
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for policy in dict.fromkeys(point["policy"] for point in points):
        runs = [p for p in points if p["policy"] == policy]
        jct = [p["elephant_jct_s"] for p in runs]
        axes.plot([p["mice"] for p in runs], jct, "o-", label=policy)
    axes.set_xlabel("mice agents")
    axes.set_ylabel("elephant (MRS) JCT, s")
    axes.set_title(f"Seed 004 Fig. 9 on the simulator ({where})")
    axes.legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
