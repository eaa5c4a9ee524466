"""Autellix PLAS: a call's queue follows its program's attained service, measured in
mean calls' service by default; the first queue takes starving programs, the victim
comes from the lowest queue, and preempted calls are swapped to the CPU tier instead
of recomputed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from agentmars.sdk.events import SessionEnd
from agentmars.server.policies.autellix import Autellix, AutellixEngine
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import SortKey
from agentmars.server.policies.views import CallView, EngineView
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimEngine
from agentmars.server.workloads.registry import build_workload
from tests.server.policies.scenarios import calls, ends, evictions, run, session, turn
from tests.server.policies.views import EngineData, call

# Boundaries and times are binary fractions (0.25, 0.75, ...), so every ratio below is
# exact. Queues: 0 = [0, 0.5), 1 = [0.5, 1), 2 = [1, 2), 3 = [2, inf) seconds of service.
BOUNDARIES = (0.5, 1.0, 2.0)


def served_program() -> AutellixEngine:
    """An engine half that has seen program "p" complete one call: arrived at 0, served
    0.75 s, finished at 1.0 -> program service 0.75 s, program wait 1.0 - 0.75 = 0.25 s."""
    policy = Autellix(boundaries_s=BOUNDARIES, beta=4.0).engine()
    policy.on_call_finished(call("p", service_s=0.75), EngineData(now=1.0))
    return policy


def finished(policy: AutellixEngine, session_id: str, service_s: float) -> None:
    """A call of ``session_id`` finishes after ``service_s`` of service and no wait."""
    policy.on_call_finished(
        call(session_id, arrival_s=0.0, service_s=service_s), EngineData(now=service_s)
    )


@pytest.mark.parametrize(
    ("service_s", "queue"),
    [(0.0, 0), (0.25, 0), (0.5, 1), (0.75, 1), (1.0, 2), (1.5, 2), (2.0, 3), (100.0, 3)],
)
def test_queue_of_a_new_program_follows_the_calls_own_service(service_s: float, queue: int) -> None:
    # No completed call yet: attained service = the call's own. A call that has used up
    # its queue's quantum (service = the boundary) is already in the next queue. Wait
    # is 0 (now = arrival + service), so no promotion.
    policy = Autellix(boundaries_s=BOUNDARIES, beta=4.0).engine()
    running = call("p", arrival_s=0.0, service_s=service_s)
    assert policy.queue(running, EngineData(now=service_s)) == queue


def test_default_boundaries_are_in_mean_calls_of_service() -> None:
    # Two calls finished, served 1.0 and 3.0 s: one unit = their mean, 2.0 s; the
    # boundaries 1, 2, 4, 8, ... units are 2, 4, 8, 16, ... s. Program "p" (served 1.0
    # s) is half a unit in: queue 0; "q" (3.0 s) 1.5 units: queue 1.
    policy = Autellix().engine()
    finished(policy, "p", 1.0)
    finished(policy, "q", 3.0)
    assert policy.unit() == 2.0
    view = EngineData(now=10.0)
    assert policy.queue(call("p", 1, arrival_s=10.0), view) == 0
    assert policy.queue(call("q", 1, arrival_s=10.0), view) == 1
    # A call that has used up its queue's quantum is in the next one: "q" after 1.0 s
    # more of service is at 4.0 s = 2 units, queue 2.
    demoted = call("q", 1, arrival_s=10.0, service_s=1.0)
    assert policy.queue(demoted, EngineData(now=11.0)) == 2
    # 32 units and beyond: the last of 7 queues.
    assert policy.queue(call("r", service_s=64.0), EngineData(now=64.0)) == 6


def test_the_unit_follows_the_engine_not_the_clock() -> None:
    # The same programs, a hundred times slower (a smaller GPU, a longer batch): the
    # same queues. Fixed boundaries in seconds cannot do this.
    fast, slow = Autellix().engine(), Autellix().engine()
    for policy, scale in ((fast, 0.01), (slow, 1.0)):
        for session_id, calls_served in (("a", 1), ("b", 3), ("c", 9)):
            for _ in range(calls_served):
                finished(policy, session_id, 1.0 * scale)
    for session_id, queue in (("a", 1), ("b", 2), ("c", 4)):
        waiting = call(session_id, 9, arrival_s=100.0)
        assert fast.queue(waiting, EngineData(now=100.0)) == queue
        assert slow.queue(waiting, EngineData(now=100.0)) == queue


def test_before_any_call_finished_every_call_is_in_the_first_queue() -> None:
    # No measure of a call's service yet: nothing to place programs on (FCFS).
    policy = Autellix().engine()
    assert policy.unit() is None
    assert policy.queue(call("p", service_s=50.0), EngineData(now=50.0)) == 0


def test_fixed_boundaries_in_seconds_are_still_available() -> None:
    policy = Autellix(boundaries_s=(0.02, 0.04, 0.08)).engine()
    finished(policy, "p", 10.0)  # the mean call plays no part
    assert policy.queue(call("q", service_s=0.05), EngineData(now=0.05)) == 2
    assert Autellix(boundaries_s=(0.5,)).settings() == {"boundaries_s": [0.5], "beta": 8.0}
    assert Autellix().settings() == {"boundaries_calls": [1, 2, 4, 8, 16, 32], "beta": 8.0}
    with pytest.raises(ValueError, match="not both"):
        Autellix(boundaries_calls=(1.0,), boundaries_s=(1.0,))
    with pytest.raises(ValueError, match="boundaries_calls must be positive and increasing"):
        Autellix(boundaries_calls=(2.0, 1.0))


def test_completed_calls_count_towards_the_programs_queue() -> None:
    policy = served_program()
    # Next call sent at 2.0, nothing served yet: service 0.75 -> queue 1; wait 0.25:
    # 0.25 / 0.75 = 1/3 < beta = 4.
    assert policy.queue(call("p", 1, arrival_s=2.0), EngineData(now=2.0)) == 1
    # After 0.25 s of service (now 2.25, no waiting): 0.75 + 0.25 = 1.0 -> queue 2,
    # demoted for using up queue 1's quantum. Wait 0.25 / 1.0 < 4.
    demoted = call("p", 1, arrival_s=2.0, service_s=0.25)
    assert policy.queue(demoted, EngineData(now=2.25)) == 2
    # Another program is unaffected: its first call is in queue 0.
    assert policy.queue(call("q", arrival_s=2.0), EngineData(now=2.0)) == 0


def test_a_starving_program_is_promoted_to_the_first_queue_at_beta() -> None:
    policy = served_program()
    waiting = call("p", 1, arrival_s=2.0)
    # Wait = 0.25 (earlier call) + (now - 2.0); service = 0.75. Promotion when
    # wait / service >= 4, i.e. wait >= 3.0, i.e. now >= 4.75.
    assert policy.queue(waiting, EngineData(now=4.5)) == 1  # 2.75 / 0.75 = 3.67
    assert policy.queue(waiting, EngineData(now=4.75)) == 0  # 3.0 / 0.75 = 4.0


def test_priority_is_queue_then_call_arrival() -> None:
    policy = served_program()
    view = EngineData(now=2.0)
    old_program = call("p", 1, arrival_s=1.5)  # queue 1 (0.75 s served), wait 0.75
    new_late = call("q", arrival_s=1.9)  # queue 0
    new_early = call("r", arrival_s=1.8)  # queue 0
    order = sorted([old_program, new_late, new_early], key=lambda c: policy.priority(c, view))
    assert order == [new_early, new_late, old_program]


def test_the_victim_comes_from_the_lowest_queue_latest_among_equals() -> None:
    policy = Autellix(boundaries_s=BOUNDARIES, beta=4.0).engine()
    view = EngineData(now=1.5)
    low_first = call("x", arrival_s=0.0, service_s=1.5)  # queue 2, wait 0
    top = call("y", arrival_s=1.0, service_s=0.25)  # queue 0, wait 0.25 (ratio 1)
    low_second = call("z", arrival_s=0.0, service_s=1.5)  # queue 2, same arrival as x
    # x and z tie on (queue, arrival): the one admitted later (later in ``running``).
    assert policy.victim([low_first, top, low_second], view) is low_second
    # Within the lowest queue a later call arrival wins over running order.
    later = replace(low_first, arrival_s=0.25)
    assert policy.victim([later, top, low_second], replace(view, now=1.75)) is later


def test_a_finished_program_is_forgotten() -> None:
    policy = served_program()
    policy.on_event(SessionEnd(session_id="p", turns=2))
    # A program that reuses the id starts over in queue 0.
    assert policy.queue(call("p", arrival_s=5.0), EngineData(now=5.0)) == 0


def test_preempted_calls_are_swapped_where_there_is_a_cpu_tier() -> None:
    policy = Autellix().engine()
    # It uses a tier where the engine has one, and recomputes (as vLLM does) elsewhere.
    assert policy.preempt_by_swap and Capability.CPU_TIER in policy.uses
    assert Capability.CPU_TIER not in policy.needs


def test_each_engine_half_keeps_its_own_service() -> None:
    # The halves are built fresh: what one engine half learnt of "p" (0.75 s served,
    # queue 1 for its next call) is not in another built from the same policy.
    policy = Autellix(boundaries_s=BOUNDARIES, beta=4.0)
    served, fresh = policy.engine(), policy.engine()
    served.on_call_finished(call("p", service_s=0.75), EngineData(now=1.0))
    assert served.queue(call("p", 1, arrival_s=2.0), EngineData(now=2.0)) == 1
    assert fresh.queue(call("p", 1, arrival_s=2.0), EngineData(now=2.0)) == 0


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------


def test_a_new_program_goes_before_one_that_was_served() -> None:
    workload = (
        session("a", turn(16, 10, tool_s=0.5), turn(16, 5)),
        session("c", turn(16, 20), arrival_s=0.5),
        session("b", turn(16, 5), arrival_s=0.65),
    )
    # One call at a time (max_num_seqs 1). a's first call runs 0.00-0.10 (10 steps):
    # the only finished call, so the unit is 0.10 s; program service 0.10 s = 1 unit
    # -> queue 1 ([1, 2) units), wait 0. Its tool ends at 0.60.
    # c holds the engine 0.50-0.70. Waiting at 0.70: a's 2nd call (since 0.60, queue 1;
    # wait 0.10 / service 0.10 = 1 < 8) and b (since 0.65, no service: queue 0).
    # Autellix: b 0.70-0.75, then a 0.75-0.80. FCFS: a 0.70-0.75, then b 0.75-0.80.
    autellix = run("autellix", *workload, max_num_seqs=1)
    assert ends(autellix) == pytest.approx({"a": 0.80, "b": 0.75, "c": 0.70})
    fcfs = run("fcfs", *workload, max_num_seqs=1)
    assert ends(fcfs) == pytest.approx({"a": 0.75, "b": 0.80, "c": 0.70})


def test_the_preempted_call_reloads_its_kv_from_the_cpu_tier() -> None:
    record = run("autellix", session("a", turn(24, 20)), session("b", turn(24, 20)), blocks=4)
    # As FCFS's preemption case (test_fcfs.py) until 0.09: a and b hold 2 blocks each,
    # both with 32 computed tokens (2 full blocks), 0.09 s of service, same arrival, and
    # both in queue 0 (no call has finished yet). a needs a 3rd block: the victim is
    # the newer of the two equals, b. Its 2 full blocks are copied to the CPU tier,
    # then freed; a takes b's 2nd block (1 eviction at 0.09). The step waits for the
    # copy (2 blocks, 20 ms): it ends at 0.12, and a's later steps 20 ms later.
    # 0.22: a ends; b is admitted: its 1st block is still on the GPU, its 2nd is in the
    # CPU tier: 32 tokens found, nothing recomputed. Loading 1 block takes 10 ms.
    # 0.23: b computes its 33rd token (taking a's cached 2nd block: 1 eviction), its
    # 10th output; 10 more steps -> b ends at 0.34.
    assert ends(record) == pytest.approx({"a": 0.22, "b": 0.34})
    (b_call,) = calls(record, "b")
    assert (b_call.preemptions, b_call.recomputed_tokens) == (1, 0)
    assert evictions(record) == [(0.09, 1), (0.23, 1)]
    # a: 24 + 19; b: 24 + 8 before, 1 + 10 after (FCFS recomputes 17 instead of 1).
    assert record.computed_tokens == 24 + 19 + (24 + 8) + (1 + 10)


# --- on a realistic workload and engine -----------------------------------------------


class QueueLog(Autellix):
    """Autellix (defaults) whose engine half notes the queue of every call it orders."""

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[tuple[str, int], int] = {}
        """(session, turn) -> the call's queue the first time it was ordered."""

    def engine(self) -> AutellixEngine:
        return LoggedEngine(self.queues, self.boundaries_calls, self.beta)


class LoggedEngine(AutellixEngine):
    def __init__(
        self, log: dict[tuple[str, int], int], boundaries: tuple[float, ...], beta: float
    ) -> None:
        super().__init__(boundaries, beta)
        self.log = log

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        key = super().priority(call, view)
        self.log.setdefault((call.session_id, call.turn), key[0])
        return key


@pytest.mark.parametrize(
    ("workload", "rate", "profile"),
    [
        ("ilr-1", 0.2, "h100-qwen3-coder-30b"),
        ("swe-bench", 0.5, "h100-qwen3-coder-30b"),
        ("react", 2.0, "cpu-tiny"),
    ],
)
def test_programs_spread_over_the_queues_on_a_realistic_engine(
    workload: str, rate: float, profile: str
) -> None:
    # The engine's steps take tens of ms to seconds (a prefill chunk 0.17-2.2 s on the
    # H100 profile), far above the third-party 0.02-0.64 s boundaries, under which
    # every resumed program sat in the last queue and PLAS was FCFS. In mean calls of
    # service, programs past their first call are spread over the queues by how many
    # calls they have had served.
    policy = QueueLog()
    SimEngine(
        build_workload(workload, sessions=30, seed=1, rate=rate), policy, load_profile(profile)
    ).run()
    resumed = Counter(queue for (_, turn), queue in policy.queues.items() if turn > 0)
    total = sum(resumed.values())
    assert total >= 30
    assert len(resumed) >= 3, resumed
    assert resumed[6] < total / 2, resumed
