"""When sessions arrive: a Poisson process (open loop)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentmars.server.workloads.model import SessionSpec, Workload


def poisson_times(rng: np.random.Generator, rate: float, count: int) -> list[float]:
    """``count`` arrival times of a Poisson process of ``rate`` per second starting at
    0: cumulative sums of exponential gaps (the first arrival is one gap in)."""
    times: list[float] = np.cumsum(rng.exponential(1.0 / rate, count)).tolist()
    return times


def arrive_together(
    units: Sequence[Sequence[SessionSpec]], times: Sequence[float]
) -> list[SessionSpec]:
    """Every session of ``units[i]`` (one agent's sessions) arrives at ``times[i]``."""
    return [
        session.model_copy(update={"arrival_s": time})
        for unit, time in zip(units, times, strict=True)
        for session in unit
    ]


def rearrive(
    workload: Workload, *, seed: int, rate: float | None, concurrency: int | None
) -> Workload:
    """A recorded workload under another arrival process: Poisson at ``rate`` (the
    sessions in the order they arrived, each with its own arrival; seeded), or a closed
    loop of ``concurrency``; neither keeps it as recorded."""
    if rate is None and concurrency is None:
        return workload
    ordered = sorted(workload.sessions, key=lambda session: session.arrival_s)
    if rate is not None:
        times = poisson_times(np.random.default_rng(seed), rate, len(ordered))
        sessions = arrive_together([[session] for session in ordered], times)
        return workload.model_copy(
            update={
                "sessions": tuple(sessions),
                "arrival": "open",
                "concurrency": None,
                "seed": seed,
            }
        )
    return workload.model_copy(
        update={"sessions": tuple(ordered), "arrival": "closed", "concurrency": concurrency}
    )
