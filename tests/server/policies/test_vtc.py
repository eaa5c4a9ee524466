"""VTC: per-client virtual token counters (w_p = 1 per prompt token on admission, w_q = 2
per generated token), the lift of a client that becomes backlogged, and service in
counter order. The client is the agent instance (seed 004): the sessions of one task
together, else the session."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentmars.sdk.events import LLMEnd, SessionEnd, SessionStart
from agentmars.server.policies.vtc import VTC, VTCEngine
from agentmars.server.workloads.model import SessionSpec
from tests.server.policies.scenarios import ends, run, session, turn
from tests.server.policies.views import CallData, EngineData, call


def look(policy: VTCEngine, now: float, running: list[CallData], waiting: list[CallData]) -> None:
    """One engine step that orders its waiting calls: the counters are brought up to
    date (a step with no waiting call never asks)."""
    view = EngineData(now=now, running=running, waiting=waiting)
    for waiting_call in waiting:
        policy.priority(waiting_call, view)


def ended(call_data: CallData, output_tokens: int) -> LLMEnd:
    return LLMEnd(
        session_id=call_data.session_id,
        call_id=call_data.call_id,
        prompt_tokens=call_data.prompt_tokens,
        output_tokens=output_tokens,
    )


def test_counters_after_admissions_and_decoded_tokens() -> None:
    policy = VTC().engine()
    a1 = call("A", prompt_tokens=100, arrival_s=0.0)
    b1 = call("B", prompt_tokens=10, arrival_s=0.0)
    look(policy, 0.0, running=[], waiting=[a1, b1])
    assert dict(policy.counters) == {"A": 0, "B": 0}  # both new, nothing served
    look(policy, 1.0, running=[call("A", prompt_tokens=100, output_tokens=5)], waiting=[b1])
    # A admitted: 1 x 100 prompt + 2 x 5 generated = 110.
    assert policy.counters["A"] == 110
    look(
        policy,
        2.0,
        running=[call("A", prompt_tokens=100, output_tokens=8), call("B", prompt_tokens=10)],
        waiting=[call("C", prompt_tokens=1, arrival_s=1.5)],
    )
    # A: +2 x (8 - 5) = 116. B admitted: +10 = 10. C is new to the backlog, where no
    # one else is: nothing to lift it to, it stays at 0.
    assert dict(policy.counters) == {"A": 116, "B": 10, "C": 0}
    policy.on_event(ended(call("B", prompt_tokens=10), output_tokens=4))
    # B's call ended with 4 tokens, none charged yet: +8 = 18.
    assert policy.counters["B"] == 18
    b2 = call("B", 1, prompt_tokens=30, arrival_s=2.5)
    look(
        policy,
        3.0,
        running=[call("A", prompt_tokens=100, output_tokens=9)],
        waiting=[call("C", prompt_tokens=1, arrival_s=1.5), b2],
    )
    # A: +2 = 118. B becomes backlogged again: lifted to the least counter of the
    # others backlogged, C's 0 -> max(18, 0) = 18, unchanged.
    assert dict(policy.counters) == {"A": 118, "B": 18, "C": 0}
    policy.on_event(ended(call("A", prompt_tokens=100), output_tokens=10))
    assert policy.counters["A"] == 120  # +2 x (10 - 9)


def test_a_client_that_becomes_backlogged_is_lifted_to_the_least_other_counter() -> None:
    policy = VTC().engine()
    # X and Y were served 40 and 30 prompt tokens (calls that ran while nothing waited,
    # charged when they ended), then their next calls wait: Y's first (alone in the
    # backlog, it stays at 30), then X's (max(40, 30) = 40).
    policy.on_event(ended(call("X", prompt_tokens=40), output_tokens=0))
    policy.on_event(ended(call("Y", prompt_tokens=30), output_tokens=0))
    x, y = call("X", 1, arrival_s=0.8), call("Y", 1, arrival_s=0.5)
    look(policy, 1.0, running=[], waiting=[x, y])
    assert (policy.counters["X"], policy.counters["Y"]) == (40, 30)
    # Z was idle (counter 0) and now has a call waiting: lifted to min(40, 30) = 30, so
    # idleness earns no credit; it ties with Y (FCFS between them), X comes last.
    z = call("Z", arrival_s=2.0)
    look(policy, 2.0, running=[], waiting=[x, y, z])
    view = EngineData(now=2.0, waiting=[x, y, z])
    assert [policy.priority(c, view) for c in (x, y, z)] == [(40,), (30,), (30,)]


def test_a_client_served_more_than_the_backlog_keeps_its_counter() -> None:
    policy = VTC().engine()
    policy.on_event(ended(call("X", prompt_tokens=10), output_tokens=0))
    policy.on_event(ended(call("Y", prompt_tokens=50), output_tokens=0))
    x, y = call("X", 1, arrival_s=0.9), call("Y", 1, arrival_s=1.5)
    look(policy, 1.0, running=[], waiting=[x])
    look(policy, 2.0, running=[], waiting=[x, y])
    # Y newly backlogged with 50 > the least other counter (X: 10): stays at 50.
    assert (policy.counters["X"], policy.counters["Y"]) == (10, 50)


def test_clients_backlogged_in_the_same_step_are_lifted_in_arrival_order() -> None:
    # A was served 40 + 2 x 5 = 50 (a call that ran while nothing waited, charged when
    # it ended) and is idle; B never ran. Both get a call waiting before the next
    # step, A's first: as when their arrivals are handled one by one, A (alone in the
    # backlog) stays at 50, then B is lifted to A's 50.
    policy = VTC().engine()
    policy.on_event(ended(call("A", prompt_tokens=40), output_tokens=5))
    a_next = call("A", 1, arrival_s=1.0)
    b_first = call("B", arrival_s=2.0)
    look(policy, 3.0, running=[], waiting=[b_first, a_next])
    assert (policy.counters["A"], policy.counters["B"]) == (50, 50)


def test_a_later_arrival_is_not_lifted_to_a_client_behind_it() -> None:
    # Same, B's call first: B (alone) stays at 0; A is lifted to max(50, 0) = 50. B
    # goes first.
    policy = VTC().engine()
    policy.on_event(ended(call("A", prompt_tokens=40), output_tokens=5))
    look(policy, 3.0, running=[], waiting=[call("A", 1, arrival_s=2.0), call("B", arrival_s=1.0)])
    assert (policy.counters["A"], policy.counters["B"]) == (50, 0)


def test_a_call_no_step_saw_running_is_charged_when_it_ends() -> None:
    # Admitted and finished while nothing waited, so no step looked at the counters.
    policy = VTC().engine()
    policy.on_event(ended(call("A", prompt_tokens=50), output_tokens=7))
    assert policy.counters["A"] == 50 + 2 * 7


def test_weights_and_a_finished_client_is_forgotten() -> None:
    policy = VTC(w_prompt=0.5, w_output=1.0).engine()
    a = call("A", prompt_tokens=100, output_tokens=10)
    look(policy, 1.0, running=[a], waiting=[call("B")])
    assert policy.counters["A"] == 0.5 * 100 + 1.0 * 10  # 60
    policy.on_event(ended(a, output_tokens=12))
    assert policy.counters["A"] == 62  # + 1.0 x (12 - 10)
    policy.on_event(SessionEnd(session_id="A", turns=1))
    assert "A" not in policy.counters


# --- the client is the agent instance --------------------------------------------------


def test_an_agent_instance_is_charged_once_per_token_across_its_branches() -> None:
    policy = VTC().engine()
    # Task "t" runs two branch sessions; "s" is a session of its own.
    t0 = call("t.0", prompt_tokens=100, output_tokens=3, task_id="t")
    t1 = call("t.1", prompt_tokens=40, output_tokens=5, task_id="t")
    s_waiting = call("s", prompt_tokens=10, arrival_s=0.5)
    look(policy, 1.0, running=[t0, t1], waiting=[s_waiting])
    # One counter for the two branches: 100 + 2 x 3 + 40 + 2 x 5 = 156; none per branch.
    assert dict(policy.counters) == {"t": 156, "s": 0}
    look(
        policy,
        2.0,
        running=[replace(t0, output_tokens=4), replace(t1, output_tokens=7)],
        waiting=[s_waiting],
    )
    assert policy.counters["t"] == 156 + 2 * 1 + 2 * 2
    policy.on_event(ended(t1, output_tokens=8))
    assert policy.counters["t"] == 162 + 2 * 1  # t.1's last token, charged to the task


def test_a_branch_waits_behind_a_client_served_less_than_its_instance() -> None:
    policy = VTC().engine()
    t0 = call("t.0", prompt_tokens=100, output_tokens=1, task_id="t")
    t1 = call("t.1", prompt_tokens=20, arrival_s=0.0, task_id="t")
    s1 = call("s", prompt_tokens=20, arrival_s=0.5)
    view = EngineData(now=1.0, running=[t0], waiting=[t1, s1])
    # t.1 has had nothing served, but its instance has: 100 + 2 x 1 = 102. Both
    # clients become backlogged at this step, t first (its call arrived first): t stays
    # at 102 and s is lifted to it, a tie. Once t.0 has run on (t: 112), s goes first;
    # a branch counted as its own client (0) would have gone first throughout.
    assert policy.priority(t1, view) == policy.priority(s1, view) == (102,)
    later = EngineData(now=2.0, running=[replace(t0, output_tokens=6)], waiting=[t1, s1])
    assert sorted([t1, s1], key=lambda c: policy.priority(c, later)) == [s1, t1]


def test_an_instance_is_forgotten_when_its_last_session_ends() -> None:
    policy = VTC().engine()
    look(
        policy,
        1.0,
        running=[call("t.0", prompt_tokens=10, task_id="t")],
        waiting=[call("t.1", task_id="t")],
    )
    policy.on_event(SessionEnd(session_id="t.0", turns=1))
    assert policy.counters["t"] == 10  # t.1 still runs for the instance
    policy.on_event(SessionEnd(session_id="t.1", turns=1))
    assert "t" not in policy.counters


def test_a_call_no_step_saw_is_charged_to_the_instance_its_session_start_names() -> None:
    policy = VTC().engine()
    policy.on_event(SessionStart(session_id="t.0", metadata={"task_id": "t"}))
    policy.on_event(ended(call("t.0", prompt_tokens=50), output_tokens=7))
    assert dict(policy.counters) == {"t": 50 + 2 * 7}


def test_a_charge_made_before_the_instance_was_known_moves_to_it() -> None:
    # t.0's call ran and ended unseen, with no task in its session_start: charged to
    # the session. When a later call shows its task, the charge joins the instance.
    policy = VTC().engine()
    policy.on_event(ended(call("t.0", prompt_tokens=50), output_tokens=7))
    look(policy, 1.0, running=[], waiting=[call("t.0", 1, task_id="t")])
    assert dict(policy.counters) == {"t": 64}


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------


def test_waiting_calls_are_served_in_counter_order() -> None:
    workload = (
        session("x", turn(64, 2, tool_s=0.015), turn(8, 2)),
        session("c", turn(16, 10)),
        session("y", turn(16, 2), arrival_s=0.005),
        session("z", turn(16, 2), arrival_s=0.045),
    )
    # One call at a time (max_num_seqs 1).
    # 0.00: x's and c's first calls wait, both counters 0: x first (same arrival,
    #       earlier in the queue); x runs 0.00-0.02.
    # 0.01: x running with 1 token: 64 + 2 = 66. y (arrived 0.005) is lifted to the
    #       least backlogged counter, c's 0.
    # 0.02: x's call ends: +2 = 68. c (0, arrived 0.00) before y (0, 0.005): c runs
    #       0.02-0.12.
    # 0.035: x's 2nd call arrives (tool done); at 0.04 x is lifted to max(68, y's 0).
    # 0.045: z arrives; at 0.05 it is lifted to min(y 0, x 68) = 0.
    # 0.12: waiting y (0), x (68), z (0): y 0.12-0.14, z 0.14-0.16 (still 0 < 68 at
    #       0.13, after y is charged 18), x 0.16-0.18.
    vtc = run("vtc", *workload, max_num_seqs=1)
    assert ends(vtc) == pytest.approx({"c": 0.12, "y": 0.14, "z": 0.16, "x": 0.18})
    # FCFS serves the calls by arrival: y (0.005), x (0.035), z (0.045).
    fcfs = run("fcfs", *workload, max_num_seqs=1)
    assert ends(fcfs) == pytest.approx({"c": 0.12, "y": 0.14, "x": 0.16, "z": 0.18})


def test_the_branches_of_a_task_share_one_fair_share() -> None:
    workload = (
        SessionSpec(session_id="t.a", task_id="t", turns=(turn(16, 10),)),
        SessionSpec(session_id="t.b", task_id="t", turns=(turn(16, 2),)),
        session("s", turn(16, 2), arrival_s=0.005),
    )
    # One call at a time (max_num_seqs 1).
    # 0.00: t.a and t.b wait, instance t at 0: t.a (first in the queue) runs 0.00-0.10.
    # 0.01: t = 16 + 2 x 1 = 18; s (arrived 0.005) is lifted to t's 18.
    # 0.10: t = 16 + 2 x 10 = 36 > s's 18: s runs 0.10-0.12, then t.b 0.12-0.14.
    vtc = run("vtc", *workload, max_num_seqs=1)
    assert ends(vtc) == pytest.approx({"t.a": 0.10, "s": 0.12, "t.b": 0.14})
    # Were each branch a client, t.b (0, waiting since 0.00) would go before s (lifted
    # to t.b's 0 at 0.01): FCFS's order.
    fcfs = run("fcfs", *workload, max_num_seqs=1)
    assert ends(fcfs) == pytest.approx({"t.a": 0.10, "t.b": 0.12, "s": 0.14})
