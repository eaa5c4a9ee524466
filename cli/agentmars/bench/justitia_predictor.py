"""Justitia's cost predictor (seed 004 §4.2) against the paper's Table 1: average
relative error 53.0% and 2.16 ms a prediction (MLP, trained in ~1 min on a V100).

Trains one ``CostPredictor`` on ``train`` agents of every class of
``workloads.agent_prompts`` (the paper's 100), then scores it on ``test`` other
agents per class: MAPE and R^2 per class and overall, beside the better of two
constants fitted to the same training costs (their mean and geometric mean), and
the time of one prediction as at an agent's arrival (one prompt a call, on CPU).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from agentmars.bench.report import percentiles_us, publish
from agentmars.server.policies.justitia.predictor import (
    OVERALL,
    Accuracy,
    CostPredictor,
    accuracy,
)
from agentmars.server.workloads.agent_prompts import AGENT_TYPES, AgentSample, sample_mix

PAPER_MAPE = 0.530
PAPER_MS = 2.16


def run(train: int, test: int, seed: int, json_out: Path | None) -> dict[str, Any]:
    training, held_out = sample_mix(train, seed), sample_mix(test, seed + 1)
    predictor = CostPredictor(seed=seed)
    start = time.perf_counter()
    predictor.fit(training)
    train_s = time.perf_counter() - start
    figures = accuracy(predictor, held_out)
    baseline = constant_mapes(training, held_out)
    latency = percentiles_us(prediction_ns(predictor, held_out))
    results = {
        "train_per_type": train,
        "test_per_type": test,
        "seed": seed,
        "train_s": train_s,
        "accuracy": {k: vars(v) for k, v in figures.items()},
        "constant_mape": baseline,
        "prediction_us": latency,
        "paper": {"mape": PAPER_MAPE, "prediction_ms": PAPER_MS},
    }
    return publish(results_table(figures, baseline, latency, train_s), results, json_out)


def constant_mapes(training: list[AgentSample], held_out: list[AgentSample]) -> dict[str, float]:
    """Per class and overall: the MAPE of the better constant fitted to the class."""
    errors: dict[str, list[float]] = {}
    for agent in AGENT_TYPES:
        costs = np.array([s.cost for s in training if s.agent == agent])
        truth = np.array([s.cost for s in held_out if s.agent == agent])
        candidates = (costs.mean(), np.exp(np.log(costs).mean()))
        best = min(candidates, key=lambda c: float(np.mean(np.abs(c - truth) / truth)))
        errors[agent] = (np.abs(best - truth) / truth).tolist()
    mapes = {agent: float(np.mean(e)) for agent, e in errors.items()}
    mapes[OVERALL] = float(np.mean([x for e in errors.values() for x in e]))
    return mapes


def prediction_ns(predictor: CostPredictor, samples: list[AgentSample]) -> list[int]:
    times = []
    for sample in samples:
        start = time.perf_counter_ns()
        predictor.predict(sample.agent, sample.prompt)
        times.append(time.perf_counter_ns() - start)
    return times


def results_table(
    figures: dict[str, Accuracy],
    baseline: dict[str, float],
    latency: dict[str, float],
    train_s: float,
) -> Table:
    table = Table(title="Justitia cost predictor (seed 004 §4.2) on held-out agents")
    for column in ("type", "test agents", "MAPE", "R^2", "constant's MAPE"):
        table.add_column(column, justify="right")
    for agent, figure in figures.items():
        table.add_row(
            agent,
            str(figure.samples),
            f"{figure.mape:.1%}",
            f"{figure.r2:.2f}",
            f"{baseline[agent]:.1%}",
        )
    table.caption = (
        f"prediction: p50 {latency['p50'] / 1000:.2f} ms, p99 {latency['p99'] / 1000:.2f} ms, "
        f"mean {latency['mean'] / 1000:.2f} ms; training {train_s:.1f} s (all types, CPU). "
        f"Paper (Table 1): {PAPER_MAPE:.1%} average relative error, {PAPER_MS} ms a "
        "prediction, ~1 min training."
    )
    return table
