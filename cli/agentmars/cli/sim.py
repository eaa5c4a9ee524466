"""``agentmars sim``: the policies on the simulated engine — runs, sweeps, listings."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentmars.server.metrics.results import SweepResult
from agentmars.server.metrics.speedup import PointComparison
from agentmars.server.metrics.summary import RunSummary
from agentmars.server.profiles.cost_model import ProfileError
from agentmars.server.sim.engine import SimError
from agentmars.server.sim.sweep import SweepError, SweepPlan, run_sweep
from agentmars.server.workloads.errors import WorkloadError

# NOTE: piped output is read by people and tests alike; rich's 80-column default folds
# every cell of the summary table, so give it room.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


class BadOption(ValueError):
    """A command-line value that cannot be used; the message names the option."""


BadInput = (SweepError, ProfileError, WorkloadError, SimError)
"""What bad input to a run raises (exit 2 with the message, no traceback)."""


def parse_list(text: str, option: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    if not items:
        raise BadOption(f"{option}: give at least one value (comma-separated)")
    return items


def parse_rates(text: str | None, option: str) -> tuple[float, ...]:
    if text is None:
        return ()
    rates = []
    for item in parse_list(text, option):
        try:
            rate = float(item)
        except ValueError:
            raise BadOption(f"{option}: {item!r} is not a number") from None
        if not rate > 0 or rate == float("inf"):
            raise BadOption(f"{option}: {item!r} must be a positive rate (sessions per second)")
        rates.append(rate)
    return tuple(rates)


def run_plan(plan: SweepPlan, out: Path, *, jobs: int, report: bool) -> int:
    """Run ``plan`` with progress bars; write ``out/results.json`` (and the report),
    print the summary table. Nothing half-written is left in ``out`` on failure."""
    total = len(plan.points()) * (len(plan.policies) + 1)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task("simulating", total=total)

        def done(workload: str, what: str, rate: float | None) -> None:
            load = f" @ {rate:g}/s" if rate is not None else ""
            progress.update(task, advance=1, description=f"{workload}{load}: {what} done")

        result = run_sweep(plan, jobs=jobs, on_run_done=done)
    _print_tables(result)
    _write(result, out, report=report)
    console.print(
        f"results: {out / 'results.json'}" + (f"; report: {out / 'index.html'}" if report else "")
    )
    return 0


def _print_tables(result: SweepResult) -> None:
    from agentmars.server.metrics.report import summary_table

    points: dict[tuple[str, float | None], list[RunSummary]] = {}
    for run in result.runs:
        points.setdefault((run.workload, run.rate), []).append(run.summary)
    for (workload, rate), summaries in points.items():
        table: Table = summary_table(summaries)
        table.title = f"{workload}" + (f" at {rate:g} sessions/s" if rate is not None else "")
        console.print(table)


def _write(result: SweepResult, out: Path, *, report: bool) -> None:
    """Write into a temporary folder beside ``out``, then move the files in."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".partial-") as staging:
        staged = Path(staging)
        result.write(staged / "results.json")
        files = [staged / "results.json"]
        if report:
            from agentmars.server.metrics.report import write_report

            files += write_report(result.runs, staged, config=result.config)
        for path in files:
            os.replace(path, out / path.name)


def list_rows(title: str, rows: Iterable[tuple[str, str]]) -> None:
    table = Table(title=title)
    table.add_column("name")
    table.add_column("what")
    for name, text in rows:
        table.add_row(name, text)
    console.print(table)


def speedup_tables(rows: list[PointComparison], policy: str) -> list[Table]:
    """The point-by-point comparison and, when variants were named, their slowdowns."""
    alphas = list(rows[0].goodput)
    main = Table(title=f"{policy} against the strongest other policy at each point")
    goodputs = [f"goodput a={float(a):g} ({policy} / best) 1/ks" for a in alphas]
    columns = ("workload", "rate/s", f"{policy} mean s", "strongest", "its mean s", "speed-up")
    for column in (*columns, "P90 x", "P95 x", *goodputs):
        main.add_column(column, justify="left" if column in ("workload", "strongest") else "right")
    for row in rows:
        goodput = [
            f"{row.goodput[a] * 1000:.1f} / {row.best_other_goodput[a] * 1000:.1f}" for a in alphas
        ]
        main.add_row(
            row.workload, f"{row.rate:g}" if row.rate is not None else "closed",
            f"{row.mean_s:,.1f}", row.best_other, f"{row.best_other_mean_s:,.1f}",
            f"{row.speedup:.2f}x", f"{row.p90_speedup:.2f}x", f"{row.p95_speedup:.2f}x", *goodput,
        )  # fmt: skip
    wins = sum(row.speedup > 1 for row in rows)
    speedups = [row.speedup for row in rows]
    main.caption = (
        f"{policy} has the lowest mean at {wins} of {len(rows)} points; speed-up "
        f"{min(speedups):.2f}x-{max(speedups):.2f}x; P90 better at "
        f"{sum(r.p90_speedup > 1 for r in rows)}, P95 at {sum(r.p95_speedup > 1 for r in rows)}"
    )
    tables = [main]
    variants = list(rows[0].variants)
    if variants:
        ablations = Table(title=f"variants: mean latency over {policy}'s")
        for column in ("workload", "rate/s", *variants):
            ablations.add_column(column, justify="left" if column == "workload" else "right")
        for row in rows:
            rate = f"{row.rate:g}" if row.rate is not None else "closed"
            ablations.add_row(row.workload, rate, *(f"{row.variants[v]:.2f}x" for v in variants))
        tables.append(ablations)
    return tables
