"""``agentmars bench capacity``: how many agents one node holds, per policy.

A policy's capacity on a workload is the highest Poisson arrival rate (sessions/s)
at which the P95 slowdown (a session's latency over its latency alone, T_ideal) stays
at or below a bound. It is found by bisection on the simulated engine: the low end of
the bracket is run first (if it already fails, the capacity is below it); the high end
is doubled, up to a cap, until it fails (if the cap still meets the bound, the
capacity is at least the cap); then the bracket is halved, geometrically, until its
width relative to its low end is at most the tolerance. The capacity reported is the
low end: the highest rate run that met the bound.

Every run is deterministic: the workload comes from a fixed seed, its sessions are
the same at every rate (only their arrival times scale with 1/rate), and the
simulator has no other randomness. So the same options give the same capacities,
with or without worker processes. Bisection assumes the P95 slowdown grows with the
rate; where it does not, the result is one crossing of the bound, not necessarily
the highest.

T_ideal is each session's run alone on an empty engine, as in ``agentmars sim sweep``;
it does not depend on the rate, so it is computed once per workload.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from agentmars.bench.report import ProgressFn, short_error, write_json
from agentmars.server.metrics.records import SessionRecord
from agentmars.server.metrics.summary import summarize
from agentmars.server.profiles.cost_model import Profile
from agentmars.server.sim.engine import SimConfig, isolated_sessions
from agentmars.server.sim.sweep import context_limit, run_policy
from agentmars.server.workloads.model import Workload
from agentmars.server.workloads.registry import build_workload

Status = Literal["found", "below", "above", "error"]
"""``found``: bracketed within the tolerance; ``below``: the low end already fails;
``above``: the cap still meets the bound; ``error``: a run failed."""
Relation = Literal["=", ">=", "<"]
"""How the reported capacity relates to the true one: ``=`` within the tolerance,
``>=`` at least (the cap), ``<`` below (the low end)."""

RELATION: dict[Status, Relation] = {"found": "=", "above": ">=", "below": "<"}


class CapacityError(ValueError):
    """Options the benchmark cannot run with; the message says which and why."""


@dataclass(frozen=True)
class Search:
    """The bisection's settings: the initial bracket, the cap on doubling its high
    end, the relative width to stop at, and the P95 slowdown bound."""

    low: float
    high: float
    cap: float
    tolerance: float
    bound: float

    def __post_init__(self) -> None:
        for name in ("low", "high", "cap", "tolerance", "bound"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise CapacityError(f"--{_option(name)} must be a positive number (got {value})")
        if self.low >= self.high:
            raise CapacityError(f"--low ({self.low:g}) must be below --high ({self.high:g})")
        if self.cap < self.high:
            raise CapacityError(
                f"--max-rate ({self.cap:g}) must be at least --high ({self.high:g})"
            )


def _option(name: str) -> str:
    return {"cap": "max-rate", "bound": "slowdown"}.get(name, name)


@dataclass(frozen=True)
class Probe:
    """One simulator run: its rate, P95 slowdown and unfinished sessions."""

    rate: float
    p95_slowdown: float | None
    unfinished: int = 0

    def meets(self, bound: float) -> bool:
        return self.unfinished == 0 and self.p95_slowdown is not None and self.p95_slowdown <= bound


@dataclass(frozen=True)
class Capacity:
    """What the bisection found. ``rate``: the highest rate run that met the bound
    (``found``, ``above``), or the low end that failed (``below``)."""

    status: Status
    rate: float | None
    bracket: tuple[float | None, float | None]
    probes: tuple[Probe, ...]
    error: str | None = None

    @property
    def runs(self) -> int:
        return len(self.probes)

    def label(self) -> str:
        if self.status == "error" or self.rate is None:
            return "error"
        return {"found": "", "above": ">= ", "below": "< "}[self.status] + f"{self.rate:.3g}"

    def p95_at_rate(self) -> float | None:
        return next((p.p95_slowdown for p in self.probes if p.rate == self.rate), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "capacity": self.rate,
            "relation": RELATION.get(self.status),
            "bracket": list(self.bracket),
            "runs": self.runs,
            "probes": [
                {"rate": p.rate, "p95_slowdown": p.p95_slowdown, "unfinished": p.unfinished}
                for p in self.probes
            ],
            "error": self.error,
        }


@dataclass
class Bisection:
    """The search as a state machine, so that many run side by side: ask
    ``next_rate()``, run it, ``record()`` the probe; None once done."""

    search: Search
    probes: list[Probe] = field(default_factory=list)
    lo: float | None = None
    """The highest rate that met the bound so far."""
    hi: float | None = None
    """The lowest rate that failed so far."""
    status: Status | None = None
    error: str | None = None

    def next_rate(self) -> float | None:
        if self.status is not None:
            return None
        if self.lo is None:
            return self.search.low
        if self.hi is None:
            return self._higher()
        if self.hi / self.lo <= 1 + self.search.tolerance:
            self.status = "found"
            return None
        return math.sqrt(self.lo * self.hi)

    def _higher(self) -> float:
        """The next high end to try: the initial one, then doubled up to the cap."""
        assert self.lo is not None
        if self.lo < self.search.high:
            return self.search.high
        return min(2 * self.lo, self.search.cap)

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)
        if probe.meets(self.search.bound):
            self.lo = probe.rate
            if self.hi is None and probe.rate >= self.search.cap:
                self.status = "above"
        elif self.lo is None:
            self.hi = probe.rate
            self.status = "below"
        else:
            self.hi = probe.rate

    def fail(self, error: BaseException) -> None:
        self.status = "error"
        self.error = short_error(error)

    def expected_runs(self) -> int:
        """Runs still to come if no more doubling is needed (for the progress bar)."""
        if self.status is not None:
            return 0
        if self.lo is None:
            return 2 + halvings(self.search.low, self.search.high, self.search.tolerance)
        if self.hi is None:
            return 1 + halvings(self.lo, self._higher(), self.search.tolerance)
        return halvings(self.lo, self.hi, self.search.tolerance)

    def result(self) -> Capacity:
        if self.status is None:
            raise RuntimeError("the bisection is not done")
        rate = {"below": self.hi, "error": None}.get(self.status, self.lo)
        return Capacity(self.status, rate, (self.lo, self.hi), tuple(self.probes), error=self.error)


def halvings(lo: float, hi: float, tolerance: float) -> int:
    """Geometric halvings of ``[lo, hi]`` until ``hi / lo <= 1 + tolerance``."""
    ratio, count = hi / lo, 0
    while ratio > 1 + tolerance:
        ratio, count = math.sqrt(ratio), count + 1
    return count


def find_capacity(probe: Callable[[float], Probe], search: Search) -> Capacity:
    """The bisection run to its end, one probe after another."""
    bisection = Bisection(search)
    while (rate := bisection.next_rate()) is not None:
        bisection.record(probe(rate))
    return bisection.result()


@dataclass(frozen=True)
class Setting:
    """What every run shares: the profile, the engine, the sessions and seed."""

    profile: Profile
    sessions: int
    seed: int
    config: SimConfig = field(default_factory=SimConfig)

    def workload(self, name: str, rate: float) -> Workload:
        return build_workload(
            name,
            sessions=self.sessions,
            seed=self.seed,
            rate=rate,
            max_context=context_limit(self.profile, self.config),
        )


def isolated(setting: Setting, workload: str) -> dict[str, SessionRecord]:
    """Each session's run alone (T_ideal); the rate does not change the sessions."""
    return isolated_sessions(setting.workload(workload, 1.0), setting.profile, setting.config)


def measure(
    setting: Setting, workload: str, policy: str, rate: float, alone: dict[str, SessionRecord]
) -> Probe:
    """One run of ``policy`` on ``workload`` at ``rate``: its P95 slowdown."""
    record = run_policy(setting.workload(workload, rate), policy, setting.profile, setting.config)
    slowdown = summarize(record, alone).slowdown
    return Probe(rate, slowdown.p95 if slowdown else None, len(record.unfinished))


class _Inline(Executor):
    """Runs each call as it is submitted (``--jobs 1``), behind the same interface."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # handed to the caller through the future
            future.set_exception(error)
        return future


def search_all(
    setting: Setting,
    workloads: Sequence[str],
    policies: Sequence[str],
    search: Search,
    *,
    jobs: int,
    progress: ProgressFn,
) -> dict[str, dict[str, Capacity]]:
    """Every policy's capacity on every workload; the bisections run side by side,
    each next run submitted as its previous one ends (``jobs`` worker processes)."""
    chains = {(w, p): Bisection(search) for w in workloads for p in policies}
    alone: dict[str, dict[str, SessionRecord]] = {}
    pending: dict[Future[Any], tuple[str, str | None]] = {}
    done_runs = 0
    with ProcessPoolExecutor(jobs) if jobs > 1 else _Inline() as executor:

        def submit_next(workload: str, policy: str) -> None:
            chain = chains[workload, policy]
            rate = chain.next_rate()
            if rate is not None:
                future = executor.submit(measure, setting, workload, policy, rate, alone[workload])
                pending[future] = (workload, policy)

        for workload in workloads:
            pending[executor.submit(isolated, setting, workload)] = (workload, None)
        while pending:
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in finished:
                workload, policy = pending.pop(future)
                done_runs += 1
                targets = [policy] if policy is not None else list(policies)
                try:
                    value = future.result()
                except Exception as error:  # reported per policy
                    for name in targets:
                        chains[workload, name].fail(error)
                    continue
                if policy is None:
                    alone[workload] = value
                else:
                    chains[workload, policy].record(value)
                for name in targets:
                    submit_next(workload, name)
            still = sum(chain.expected_runs() for chain in chains.values())
            isolated_left = sum(1 for _, name in pending.values() if name is None)
            progress("simulator runs", done_runs, done_runs + still + isolated_left)
    return {w: {p: chains[w, p].result() for p in policies} for w in workloads}


@dataclass(frozen=True)
class Ratio:
    """The first policy's capacity over the best other's, and how it relates to the
    true ratio (``=``, or a bound when a capacity is one)."""

    policy: str
    best_other: str | None
    value: float | None
    relation: str | None
    note: str = ""

    def line(self) -> str:
        head = f"capacity {self.policy} / best other"
        if self.value is None or self.relation is None:
            return f"{head}: n/a ({self.note})"
        return f"{head} {self.relation} {self.value:.2f}x (best other: {self.best_other})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "best_other": self.best_other,
            "value": self.value,
            "relation": self.relation,
            "note": self.note or None,
        }


_RANK: dict[Status, int] = {"above": 2, "found": 1, "below": 0, "error": -1}


def ratio(capacities: dict[str, Capacity], policy: str) -> Ratio:
    """``policy``'s capacity over the highest of the others'."""
    first = capacities[policy]
    others = {name: c for name, c in capacities.items() if name != policy and c.status != "error"}
    if not others:
        return Ratio(policy, None, None, None, "no other policy to compare with")
    best = max(others, key=lambda name: (others[name].rate or 0.0, _RANK[others[name].status]))
    other = others[best]
    if first.status == "error" or first.rate is None or other.rate is None:
        return Ratio(policy, best, None, None, f"{policy} failed to run")
    relation = _relation(RELATION[first.status], RELATION[other.status])
    if relation is None:
        return Ratio(
            policy, best, None, None,
            f"{policy} {first.label()}, {best} {other.label()} sessions/s",
        )  # fmt: skip
    return Ratio(policy, best, first.rate / other.rate, relation)


def _relation(first: Relation, other: Relation) -> str | None:
    """How ``first / other`` relates to the true ratio, from how each capacity does."""
    if other == "=":
        return first
    if first == "=":
        return {">=": "<=", "<": ">"}[other]
    if first == other:
        return None
    return ">" if first == ">=" else "<"


def run(
    setting: Setting,
    workloads: Sequence[str],
    policies: Sequence[str],
    search: Search,
    out: Path | None,
    *,
    jobs: int,
    progress: ProgressFn,
) -> dict[str, Any]:
    """Search, print the table and the ratio lines, write ``out/results.json``."""
    found = search_all(setting, workloads, policies, search, jobs=jobs, progress=progress)
    ratios = {w: ratio(found[w], policies[0]) for w in workloads}
    results = {
        "profile": setting.profile.name,
        "sessions": setting.sessions,
        "seed": setting.seed,
        "slowdown_bound": search.bound,
        "low": search.low,
        "high": search.high,
        "max_rate": search.cap,
        "tolerance": search.tolerance,
        "policies": list(policies),
        "workloads": {
            w: {
                "capacity": {p: c.as_dict() for p, c in found[w].items()},
                "ratio": ratios[w].as_dict(),
            }
            for w in workloads
        },
    }
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(results_table(setting, search, found))
    for workload in workloads:
        console.print(f"{workload}: {ratios[workload].line()}")
    for workload, capacities in found.items():
        for policy, capacity in capacities.items():
            if capacity.error is not None:
                console.print(f"[red]error[/red] {workload}, {policy}: {capacity.error}")
    if out is not None:
        write_json(out / "results.json", results)
        console.print(f"results: {out / 'results.json'}")
    return results


def results_table(setting: Setting, search: Search, found: dict[str, dict[str, Capacity]]) -> Table:
    table = Table(
        title=f"capacity: highest rate with P95 slowdown <= {search.bound:g}",
        caption=f"{setting.profile.name}, {setting.sessions} sessions, seed {setting.seed}",
    )
    for column in ("workload", "policy", "capacity sessions/s", "runs", "P95 slowdown there"):
        table.add_column(column, justify="left" if column in ("workload", "policy") else "right")
    for workload, capacities in found.items():
        for policy, capacity in capacities.items():
            p95 = capacity.p95_at_rate()
            table.add_row(
                workload,
                policy,
                capacity.label(),
                str(capacity.runs),
                "" if p95 is None else f"{p95:.2f}",
            )
    return table


def parse_names(text: str, option: str, known: Iterable[str] | None = None) -> list[str]:
    """A comma list, duplicates dropped; each in ``known`` when given."""
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise CapacityError(f"{option}: give at least one name (comma-separated)")
    if known is not None:
        allowed = list(known)
        unknown = [name for name in names if name not in allowed]
        if unknown:
            raise CapacityError(
                f"{option}: unknown {', '.join(map(repr, unknown))}; known: {', '.join(allowed)}"
            )
    return names
