"""One policy against the others of a sweep, point by point (seed 000 §6.3's way of
reporting): at each (workload, rate), the policy's mean latency against the strongest
other policy's (the lowest mean), the speed-up between them, the same for P90 and P95
(each against the lowest of that figure), goodput at each alpha against the highest,
and named variants (ablations) as slowdowns of the policy. Read from a sweep's
``results.json`` (``agentmars sim sweep``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Summary = Mapping[str, Any]


class SpeedupError(ValueError):
    """The results do not hold what the comparison needs."""


@dataclass(frozen=True)
class PointComparison:
    workload: str
    rate: float | None
    mean_s: float
    best_other: str
    best_other_mean_s: float
    p90_s: float
    best_other_p90_s: float
    p95_s: float
    best_other_p95_s: float
    goodput: dict[str, float]
    best_other_goodput: dict[str, float]
    variants: dict[str, float]
    """Each variant's mean latency over the policy's."""

    @property
    def speedup(self) -> float:
        return _ratio(self.best_other_mean_s, self.mean_s)

    @property
    def p90_speedup(self) -> float:
        return _ratio(self.best_other_p90_s, self.p90_s)

    @property
    def p95_speedup(self) -> float:
        return _ratio(self.best_other_p95_s, self.p95_s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "rate": self.rate, "mean_s": self.mean_s,
            "best_other": self.best_other, "best_other_mean_s": self.best_other_mean_s,
            "speedup": self.speedup, "p90_s": self.p90_s, "p90_speedup": self.p90_speedup,
            "p95_s": self.p95_s, "p95_speedup": self.p95_speedup, "goodput": self.goodput,
            "best_other_goodput": self.best_other_goodput, "variants": self.variants,
        }  # fmt: skip


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def points(results: Mapping[str, Any]) -> dict[tuple[str, float | None], dict[str, Summary]]:
    """The sweep's summaries by (workload, rate), then by policy."""
    try:
        runs = results["runs"]
        by_point: dict[tuple[str, float | None], dict[str, Summary]] = {}
        for run in runs:
            summary = run["summary"]
            key = (summary["workload"], run.get("rate"))
            by_point.setdefault(key, {})[summary["policy"]] = summary
    except (KeyError, TypeError) as error:
        raise SpeedupError(f"not a sweep's results.json (missing {error})") from None
    return by_point


def compare(
    results: Mapping[str, Any], policy: str, others: Sequence[str], variants: Sequence[str] = ()
) -> list[PointComparison]:
    """``policy`` against the best of ``others`` at every point that has them all."""
    rows = []
    for (workload, rate), by_policy in sorted(
        points(results).items(), key=lambda item: (item[0][0], item[0][1] or 0.0)
    ):
        missing = [name for name in (policy, *others, *variants) if name not in by_policy]
        if missing:
            raise SpeedupError(f"{workload} at {rate}: no run of {', '.join(missing)}")
        own = by_policy[policy]
        rivals = {name: by_policy[name] for name in others}
        best = min(rivals, key=lambda name: rivals[name]["latency_s"]["mean"])
        alphas = sorted(own["goodput"])
        rows.append(
            PointComparison(
                workload=workload,
                rate=rate,
                mean_s=own["latency_s"]["mean"],
                best_other=best,
                best_other_mean_s=rivals[best]["latency_s"]["mean"],
                p90_s=own["latency_s"]["p90"],
                best_other_p90_s=min(r["latency_s"]["p90"] for r in rivals.values()),
                p95_s=own["latency_s"]["p95"],
                best_other_p95_s=min(r["latency_s"]["p95"] for r in rivals.values()),
                goodput={a: own["goodput"][a] for a in alphas},
                best_other_goodput={
                    a: max(r["goodput"][a] for r in rivals.values()) for a in alphas
                },
                variants={
                    name: _ratio(by_policy[name]["latency_s"]["mean"], own["latency_s"]["mean"])
                    for name in variants
                },
            )
        )
    if not rows:
        raise SpeedupError("the results hold no runs")
    return rows
