"""Autellix PLAS: a call's queue follows its program's attained service, the first
queue takes starving programs, the victim comes from the lowest queue, and preempted
calls are swapped to the CPU tier instead of recomputed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentmars.sdk.events import SessionEnd
from agentmars.server.policies.autellix import Autellix, AutellixEngine
from agentmars.server.policies.capabilities import Capability
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


def test_default_boundaries_put_a_call_at_a_boundary_in_the_next_queue() -> None:
    # Defaults (0.02, 0.04, 0.08, ...): 10 steps of 10 ms = 0.1 s -> queue 3
    # ([0.08, 0.16)); exactly 0.04 s -> queue 2 ([0.04, 0.08)).
    policy = Autellix().engine()
    assert policy.queue(call("p", service_s=0.1), EngineData(now=0.1)) == 3
    assert policy.queue(call("p", service_s=0.04), EngineData(now=0.04)) == 2


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
    # program service 0.10 s -> queue 3 ([0.08, 0.16)), wait 0. Its tool ends at 0.60.
    # c holds the engine 0.50-0.70. Waiting at 0.70: a's 2nd call (since 0.60, queue 3;
    # wait 0.10 / service 0.10 = 1 < 8) and b (since 0.65, no service: queue 0).
    # Autellix: b 0.70-0.75, then a 0.75-0.80. FCFS: a 0.70-0.75, then b 0.75-0.80.
    autellix = run("autellix", *workload, max_num_seqs=1)
    assert ends(autellix) == pytest.approx({"a": 0.80, "b": 0.75, "c": 0.70})
    fcfs = run("fcfs", *workload, max_num_seqs=1)
    assert ends(fcfs) == pytest.approx({"a": 0.75, "b": 0.80, "c": 0.70})


def test_the_preempted_call_reloads_its_kv_from_the_cpu_tier() -> None:
    record = run("autellix", session("a", turn(24, 20)), session("b", turn(24, 20)), blocks=4)
    # As FCFS's preemption case (test_fcfs.py) until 0.09: a and b hold 2 blocks each,
    # both with 32 computed tokens (2 full blocks), 0.09 s of service (queue 3), same
    # arrival. a needs a 3rd block: the victim is the newer of the two equals, b. Its 2
    # full blocks are copied to the CPU tier, then freed; a takes b's 2nd block (1
    # eviction at 0.09).
    # 0.20: a ends; b is admitted: its 1st block is still on the GPU, its 2nd is in the
    # CPU tier: 32 tokens found, nothing recomputed. Loading 1 block takes 10 ms.
    # 0.21: b computes its 33rd token (taking a's cached 2nd block: 1 eviction), its
    # 10th output; 10 more steps -> b ends at 0.32.
    assert ends(record) == pytest.approx({"a": 0.20, "b": 0.32})
    (b_call,) = calls(record, "b")
    assert (b_call.preemptions, b_call.recomputed_tokens) == (1, 0)
    assert evictions(record) == [(0.09, 1), (0.21, 1)]
    # a: 24 + 19; b: 24 + 8 before, 1 + 10 after (FCFS recomputes 17 instead of 1).
    assert record.computed_tokens == 24 + 19 + (24 + 8) + (1 + 10)
