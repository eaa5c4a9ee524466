"""Arrival processes, and a recorded workload put under another one (``rearrive``)."""

from __future__ import annotations

import numpy as np

from agentmars.server.workloads.arrivals import poisson_times, rearrive
from agentmars.server.workloads.registry import build_workload


def test_rearrive_gives_a_seeded_poisson_process_in_the_recorded_order() -> None:
    recorded = build_workload("react", sessions=5, seed=1, rate=0.5)
    # The file may list sessions in any order: the recorded arrival order is kept.
    shuffled = recorded.model_copy(update={"sessions": recorded.sessions[::-1]})
    moved = rearrive(shuffled, seed=7, rate=4.0, concurrency=None)
    times = poisson_times(np.random.default_rng(7), 4.0, 5)
    assert [s.arrival_s for s in moved.sessions] == times
    assert [s.session_id for s in moved.sessions] == [s.session_id for s in recorded.sessions]
    assert [s.turns for s in moved.sessions] == [s.turns for s in recorded.sessions]
    assert (moved.arrival, moved.concurrency) == ("open", None)


def test_rearrive_closed_loop_and_as_recorded() -> None:
    recorded = build_workload("react", sessions=3, seed=1, rate=0.5)
    closed = rearrive(recorded, seed=0, rate=None, concurrency=2)
    assert (closed.arrival, closed.concurrency) == ("closed", 2)
    assert rearrive(recorded, seed=0, rate=None, concurrency=None) is recorded
