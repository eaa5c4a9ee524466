"""The registry: names, arguments, seeds, arrivals and the context cap."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from agentmars.server.workloads.errors import WorkloadError
from agentmars.server.workloads.registry import build_workload, describe_workload, workload_names

NAMES = [
    "ilr-1",
    "ilr-2",
    "ilr-3",
    "ilr-4",
    "s-ilr-1",
    "s-ilr-2",
    "s-ilr-3",
    "ilr-2-cpu",
    "swe-bench",
    "bfcl",
    "coding-agent",
    "react",
    "plan-execute",
    "infercept",
    "toolbench",
    "task-parallel",
    "elephant-mice",
]


def test_every_generator_is_registered_with_a_one_line_description() -> None:
    assert workload_names() == NAMES
    for name in NAMES:
        description = describe_workload(name)
        assert description and "\n" not in description
    assert "263K" in describe_workload("ilr-4")
    assert "ToolBench" in describe_workload("toolbench")


def test_unknown_names_are_refused_with_the_known_ones() -> None:
    with pytest.raises(WorkloadError, match=r"unknown workload 'ilr-9'; known: ilr-1, ilr-2"):
        build_workload("ilr-9", sessions=1, seed=0, rate=1.0)
    with pytest.raises(WorkloadError, match="unknown workload"):
        describe_workload("nope")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "exactly one of rate"),
        ({"rate": 1.0, "concurrency": 2}, "exactly one of rate"),
        ({"rate": 0.0}, "rate must be a positive number"),
        ({"rate": math.nan}, "rate must be a positive number"),
        ({"rate": math.inf}, "rate must be a positive number"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"rate": 1.0, "sessions": 0}, "sessions must be at least 1"),
        ({"rate": 1.0, "seed": -1}, "seed must be non-negative"),
        ({"rate": 1.0, "max_context": 1}, "max_context must be at least 2"),
    ],
)
def test_bad_arguments_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        build_workload("react", **{"sessions": 5, "seed": 0, **arguments})


@pytest.mark.parametrize("name", ["swe-bench", "toolbench"])
def test_a_seed_gives_the_same_workload_and_another_seed_another(name: str) -> None:
    first = build_workload(name, sessions=50, seed=4, rate=0.5)
    assert build_workload(name, sessions=50, seed=4, rate=0.5) == first
    assert build_workload(name, sessions=50, seed=5, rate=0.5) != first


def test_the_arrival_process_does_not_change_the_sessions() -> None:
    open_loop = build_workload("bfcl", sessions=30, seed=9, rate=2.0)
    closed_loop = build_workload("bfcl", sessions=30, seed=9, concurrency=4)
    assert [s.model_copy(update={"arrival_s": 0.0}) for s in open_loop.sessions] == list(
        closed_loop.sessions
    )


def test_closed_loop_sets_the_concurrency() -> None:
    workload = build_workload("react", sessions=20, seed=1, concurrency=8)
    assert (workload.arrival, workload.concurrency) == ("closed", 8)
    assert {s.arrival_s for s in workload.sessions} == {0.0}


def test_poisson_arrivals_have_the_rate() -> None:
    # 4000 arrivals at 2/s: the rate estimate n / T has a relative sd of
    # 1/sqrt(4000) = 1.6%, so 5% is three sd; exponential gaps have a coefficient of
    # variation of 1 and 1 - 1/e = 63.2% of them are shorter than the mean.
    workload = build_workload("react", sessions=4000, seed=11, rate=2.0)
    assert workload.arrival == "open" and workload.concurrency is None
    times = np.array([s.arrival_s for s in workload.sessions])
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert (gaps > 0).all()
    assert len(times) / times[-1] == pytest.approx(2.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert (gaps < gaps.mean()).mean() == pytest.approx(1 - math.exp(-1), abs=0.02)


def test_a_task_parallel_agent_arrives_as_one() -> None:
    workload = build_workload("task-parallel", sessions=40, seed=2, rate=0.1)
    by_agent: dict[str, set[float]] = {}
    for session in workload.sessions:
        instance = session.session_id.split(".")[0]
        by_agent.setdefault(instance, set()).add(session.arrival_s)
        if session.prefix_group is not None:
            assert session.prefix_group == instance
        assert session.task_id == instance  # the agent instance, seed 004's fairness unit
    assert len(by_agent) == 40  # sessions counts agents
    assert all(len(times) == 1 for times in by_agent.values())
    assert len(workload.sessions) > 40


def test_elephant_mice_is_one_mrs_agent_then_a_mouse_every_1_over_rate_seconds() -> None:
    # seed 004 §5.3: the elephant (MapReduce Summarization) first, then mice drawn at
    # random from KBQAV, CC, ALFWI, "once per second" at rate 1
    workload = build_workload("elephant-mice", sessions=60, seed=3, rate=2.0)
    assert workload.arrival == "open"
    instances: dict[str, list[Any]] = {}
    for session in workload.sessions:
        instance = session.session_id.split(".")[0]
        assert session.task_id == instance
        assert session.input_text  # Justitia's predictor reads it
        instances.setdefault(instance, []).append(session)
    assert list(instances) == [f"elephant-mice-{i:05d}" for i in range(60)]  # agents
    for i, branches in enumerate(instances.values()):
        assert {s.arrival_s for s in branches} == {i / 2.0}  # deterministic: i / rate
        assert len({s.agent for s in branches}) == 1
        assert len({s.input_text for s in branches}) == 1
    agents = [branches[0].agent for branches in instances.values()]
    assert agents[0] == "MRS" and len(instances["elephant-mice-00000"]) > 1
    assert set(agents[1:]) == {"KBQAV", "CC", "ALFWI"}  # 59 draws: all three, nothing else
    # the arrival process does not change the agents; closed loop keeps their order
    closed = build_workload("elephant-mice", sessions=60, seed=3, concurrency=4)
    assert [s.model_copy(update={"arrival_s": 0.0}) for s in workload.sessions] == list(
        closed.sessions
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cap", [2, 3000])
def test_every_call_fits_max_context(name: str, cap: int) -> None:
    workload = build_workload(name, sessions=40, seed=3, concurrency=1, max_context=cap)
    for session in workload.sessions:
        # Contexts only grow, so the last call is the largest.
        assert session.final_context <= cap
