"""The replay driver's arrivals (``WorkloadReplay``): a session that waits for others
(``SessionSpec.after``) starts only when they have all ended, open loop or closed, and
one whose dependency failed still runs; each in a real sandbox pool's workspace."""

from __future__ import annotations

import asyncio

import pytest

from agentmars.runtime.replay.agent import ReplayError, ReplayOptions, WorkloadReplay
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.sinks import MemorySink
from agentmars.server.workloads.model import SessionSpec, TurnSpec, Workload


class Recording(WorkloadReplay):
    """An agent that does nothing but say when it ran; ``fails``: sessions whose agent
    raises, as a failed tool would."""

    def __init__(self, pool: SandboxPool, fails: set[str]) -> None:
        super().__init__(pool, MemorySink(), ReplayOptions(model="none"))
        self.fails = fails
        self.started: list[str] = []

    async def _agent(self, spec: SessionSpec) -> None:
        self.started.append(spec.session_id)
        await asyncio.sleep(0)  # let the others run in between
        if spec.session_id in self.fails:
            raise ReplayError("its tool failed")


def spec(session_id: str, *after: str) -> SessionSpec:
    turn = TurnSpec(append_tokens=1, output_tokens=1)
    return SessionSpec(session_id=session_id, task_id="m", after=after, turns=(turn,))


MAP_REDUCE = (spec("m.0"), spec("m.1"), spec("m.reduce", "m.0", "m.1"), spec("x"))


@pytest.mark.parametrize("loop", [{}, {"arrival": "closed", "concurrency": 2}])
async def test_a_session_starts_after_the_last_session_it_waits_for(
    started_pool: SandboxPool, loop: dict[str, object]
) -> None:
    replay = Recording(started_pool, fails={"m.1"})
    run = await replay.run(Workload(name="w", sessions=MAP_REDUCE, **loop))  # type: ignore[arg-type]
    outcomes = {outcome.session_id: outcome for outcome in run.outcomes}
    reduce = outcomes["m.reduce"]
    assert reduce.arrival_ns >= max(outcomes["m.0"].end_ns, outcomes["m.1"].end_ns)
    # m.1 failed: it ended all the same, and the reduce ran after it.
    assert outcomes["m.1"].error is not None and reduce.error is None
    assert replay.started.index("m.reduce") > max(
        replay.started.index("m.0"), replay.started.index("m.1")
    )
