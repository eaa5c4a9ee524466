"""Experiments on the simulated engine: every policy on every (workload, arrival rate)
point, each session's isolated run for T_ideal, summaries in one ``SweepResult``.

Runs are independent, so with ``jobs > 1`` they go to worker processes; results come
back in a fixed order whatever the workers' timing, so a sweep is reproducible.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import JsonValue

from agentmars.server.metrics.records import RunRecord, SessionRecord
from agentmars.server.metrics.results import RunResult, SweepResult
from agentmars.server.metrics.summary import summarize
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import Profile, load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine, isolated_sessions
from agentmars.server.workloads.arrivals import rearrive
from agentmars.server.workloads.errors import WorkloadError
from agentmars.server.workloads.files import load_workload
from agentmars.server.workloads.model import Workload
from agentmars.server.workloads.registry import build_workload, family

_T = TypeVar("_T")


class SweepError(ValueError):
    """A sweep plan that cannot run; the message says what to change."""


FAIRNESS_REFERENCE = "vtc"
"""The policy whose latencies the finish-time fair ratio divides by (seed 004)."""


@dataclass(frozen=True)
class SweepPlan:
    """What to run. ``workloads``: registered names, or paths of workload files
    (``sessions`` does not apply to them; with ``rates`` or ``concurrency`` their
    sessions arrive by that process instead of their recorded times, and with neither,
    allowed when every workload is a file, as recorded)."""

    workloads: tuple[str, ...]
    policies: tuple[str, ...]
    profile: str
    rates: tuple[float, ...] = ()
    """Poisson arrival rates (sessions/s); empty with ``concurrency`` (closed loop)."""
    concurrency: int | None = None
    sessions: int = 200
    seed: int = 1
    config: SimConfig = field(default_factory=SimConfig)

    def __post_init__(self) -> None:
        if not self.workloads or not self.policies:
            raise SweepError("a sweep needs at least one workload and one policy")
        if self.rates and self.concurrency is not None:
            raise SweepError("give arrival rates or a closed-loop concurrency, not both")
        generated = [name for name in self.workloads if not is_workload_file(name)]
        for name in generated:
            try:
                family(name)  # an unknown name is named as such, before what it lacks
            except WorkloadError as error:
                raise SweepError(str(error)) from None
        if generated and not self.rates and self.concurrency is None:
            raise SweepError(
                f"{', '.join(generated)}: a generated workload needs arrival rates or a "
                "closed-loop concurrency (only workload files run as recorded)"
            )
        if any(rate <= 0 for rate in self.rates):
            raise SweepError("arrival rates must be positive")
        if self.sessions < 1:
            raise SweepError("sessions must be at least 1")
        for name in self.policies:
            try:
                make_policy(name)
            except ValueError as error:  # unknown, or settings it does not take
                raise SweepError(str(error)) from None

    def points(self) -> list[tuple[str, float | None]]:
        loads: Sequence[float | None] = self.rates or [None]
        return list(itertools.product(self.workloads, loads))

    def describe(self) -> dict[str, JsonValue]:
        """The plan as JSON values (for results.json)."""
        return json.loads(json.dumps(asdict(self)))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Point:
    workload: Workload
    rate: float | None


def is_workload_file(name: str) -> bool:
    return Path(name).suffix in {".jsonl", ".json"} or Path(name).exists()


def make_workload(plan: SweepPlan, name: str, rate: float | None, limit: int) -> Workload:
    if is_workload_file(name):
        recorded = load_workload(Path(name))
        return rearrive(recorded, seed=plan.seed, rate=rate, concurrency=plan.concurrency)
    return build_workload(
        name,
        sessions=plan.sessions,
        seed=plan.seed,
        rate=rate,
        concurrency=plan.concurrency,
        max_context=limit,
    )


def context_limit(profile: Profile, config: SimConfig) -> int:
    blocks = config.num_gpu_blocks or profile.num_gpu_blocks
    return min(profile.max_model_len, blocks * profile.block_size)


def run_policy(workload: Workload, policy: str, profile: Profile, config: SimConfig) -> RunRecord:
    """One run, labelled as asked (``mars:aimd_beta=0.7`` stays apart from ``mars``)."""
    record = SimEngine(workload, make_policy(policy), profile, config).run()
    record.policy = policy
    return record


def run_sweep(
    plan: SweepPlan,
    *,
    jobs: int = 1,
    on_run_done: Callable[[str, str, float | None], None] | None = None,
) -> SweepResult:
    """Run the plan; ``on_run_done(workload, policy, rate)`` after each run (a point's
    isolated runs count as one, named ``isolated``)."""
    profile = load_profile(plan.profile)
    limit = context_limit(profile, plan.config)
    points = [_Point(make_workload(plan, name, rate, limit), rate) for name, rate in plan.points()]
    with ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as executor:
        later = functools.partial(_later, executor)
        isolated = [later(isolated_sessions, p.workload, profile, plan.config) for p in points]
        runs = [
            [
                later(run_policy, p.workload, policy, profile, plan.config)
                for policy in plan.policies
            ]
            for p in points
        ]
        results = []
        for point, alone_result, point_runs in zip(points, isolated, runs, strict=True):
            alone = _collect(alone_result, on_run_done, point, "isolated")
            records = [
                _collect(result, on_run_done, point, policy)
                for result, policy in zip(point_runs, plan.policies, strict=True)
            ]
            results.extend(_summaries(point, alone, records))
    settings = {name: make_policy(name).settings() for name in plan.policies}
    config = {"plan": plan.describe(), "profile": profile.name, "policy_settings": settings}
    return SweepResult(config=json.loads(json.dumps(config)), runs=results)


def _later(executor: Executor | None, fn: Callable[..., _T], *args: Any) -> Callable[[], _T]:
    """``fn(*args)``'s result when asked for: computed then, or by a worker meanwhile."""
    if executor is None:
        return functools.partial(fn, *args)
    return executor.submit(fn, *args).result


def _collect(
    result: Callable[[], _T],
    on_done: Callable[[str, str, float | None], None] | None,
    point: _Point,
    what: str,
) -> _T:
    value = result()
    if on_done is not None:
        on_done(point.workload.name, what, point.rate)
    return value


def _summaries(
    point: _Point, alone: dict[str, SessionRecord], records: list[RunRecord]
) -> list[RunResult]:
    reference = next((r for r in records if r.policy == FAIRNESS_REFERENCE), None)
    return [
        RunResult(rate=point.rate, summary=summarize(record, alone, fair_reference=reference))
        for record in records
    ]
