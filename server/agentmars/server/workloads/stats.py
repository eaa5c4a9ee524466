"""What a workload looks like in numbers: the statistics the generators are
calibrated to, measured on the sessions themselves.

``python -m agentmars.server.workloads.stats [--sessions N] [--seed S] [names...]``
prints them as a Markdown table (docs/workloads.md quotes its output).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import numpy as np

from agentmars.server.workloads.model import Workload
from agentmars.server.workloads.registry import build_workload, workload_names


@dataclass(frozen=True)
class WorkloadStats:
    sessions: int
    turns_mean: float
    turns_sd: float
    first_prompt_mean: float
    append_mean: float
    """Tokens appended by turns after the first."""
    output_mean: float
    prompt_volume_mean: float
    prompt_volume_sd: float
    final_context_mean: float
    final_context_max: int
    tool_calls: int
    tool_mean_s: float
    tool_sd_s: float
    tool_p50_s: float
    tool_p90_s: float
    tool_p99_s: float
    tool_under_2s: float
    """Share of tool calls shorter than 2 s."""
    tool_cores: float
    """CPU time over wall time, summed over all tool calls."""


def workload_stats(workload: Workload) -> WorkloadStats:
    sessions = workload.sessions
    turns = np.array([len(s.turns) for s in sessions])
    volumes = np.array([s.prompt_volume for s in sessions])
    finals = np.array([s.final_context for s in sessions])
    later = [turn for s in sessions for turn in s.turns[1:]]
    tools = [turn.tool for s in sessions for turn in s.turns if turn.tool is not None]
    walls = np.array([tool.wall_s for tool in tools])
    cpu = sum(tool.cpu_s for tool in tools)
    p50, p90, p99 = np.percentile(walls, [50, 90, 99]) if tools else (0.0, 0.0, 0.0)
    return WorkloadStats(
        sessions=len(sessions),
        turns_mean=float(turns.mean()),
        turns_sd=float(turns.std()),
        first_prompt_mean=float(np.mean([s.turns[0].append_tokens for s in sessions])),
        append_mean=float(np.mean([t.append_tokens for t in later])) if later else 0.0,
        output_mean=float(np.mean([t.output_tokens for s in sessions for t in s.turns])),
        prompt_volume_mean=float(volumes.mean()),
        prompt_volume_sd=float(volumes.std()),
        final_context_mean=float(finals.mean()),
        final_context_max=int(finals.max()),
        tool_calls=len(tools),
        tool_mean_s=float(walls.mean()) if tools else 0.0,
        tool_sd_s=float(walls.std()) if tools else 0.0,
        tool_p50_s=float(p50),
        tool_p90_s=float(p90),
        tool_p99_s=float(p99),
        tool_under_2s=float((walls < 2.0).mean()) if tools else 0.0,
        tool_cores=cpu / float(walls.sum()) if tools and walls.sum() > 0 else 0.0,
    )


COLUMNS = {
    "turns": "{s.turns_mean:.2f} ± {s.turns_sd:.2f}",
    "first prompt": "{s.first_prompt_mean:,.0f}",
    "append": "{s.append_mean:,.0f}",
    "output": "{s.output_mean:,.0f}",
    "prompt volume": "{s.prompt_volume_mean:,.0f} ± {s.prompt_volume_sd:,.0f}",
    "final context (max)": "{s.final_context_mean:,.0f} ({s.final_context_max:,})",
    "tool s (mean ± sd)": "{s.tool_mean_s:.3g} ± {s.tool_sd_s:.3g}",
    "tool p50/p90/p99 s": "{s.tool_p50_s:.3g} / {s.tool_p90_s:.3g} / {s.tool_p99_s:.3g}",
    "tools < 2 s": "{s.tool_under_2s:.1%}",
    "tool cores": "{s.tool_cores:.2f}",
}


def stats_table(rows: dict[str, WorkloadStats]) -> str:
    """A Markdown table, one row per workload."""
    lines = [
        "| workload | sessions | " + " | ".join(COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    for name, stats in rows.items():
        cells = [cell.format(s=stats) for cell in COLUMNS.values()]
        lines.append(f"| {name} | {stats.sessions:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="workloads (default: all)")
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    args = parser.parse_args(argv)
    rows = {
        name: workload_stats(
            build_workload(name, sessions=args.sessions, seed=args.seed, concurrency=1)
        )
        for name in args.names or workload_names()
    }
    if args.json:
        print(json.dumps({name: asdict(stats) for name, stats in rows.items()}, indent=2))
    else:
        print(stats_table(rows))


if __name__ == "__main__":
    main()
