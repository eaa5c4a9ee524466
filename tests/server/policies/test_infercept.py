"""InferCept: the three memory wastes of a call paused for a tool, and what each engine
step does with the paused calls' KV: swap out (within the step's swap budget, most
wasteful first, a pin larger than what is left of the budget in part and the rest at
the next steps), discard, or preserve.

Seed 001's Figure 1 (FCFS 11.66, SJF 10.33, SJF-total 11, optimized 10 time units) is
reproduced in the paper's own model of execution by test_mars_api_toy.py, not by the
simulated engine: there a prompt holds KV, a displaced call's KV is freed and
recomputed (vLLM's semantics), and a waiting call that does not fit stops the waiting
pass, where the example needs none of the three (docs/results/seed-001.md). What the
example fixes for InferCept -- R1 preserved with 5 tokens over a 2-unit API, R2
discarded with 1 token over a 7-unit API -- follows from the waste equations and is
checked below.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentmars.sdk.events import SessionEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.infercept import InferCept, InferCeptEngine, waste
from agentmars.server.policies.interface import Pin, Release, SessionAction
from agentmars.server.policies.registry import make_policy
from tests.server.policies.scenarios import calls, ends, evicted_before, run, session, turn
from tests.server.policies.views import EngineData, LinearCosts, PinData, call

# Prefill 1 ms a token; a decode step 10 ms; 2 ms to move one 16-token block.
COSTS = LinearCosts(prefill_s_per_token=0.001, decode_step_s=0.01, transfer_s_per_block=0.002)


def test_the_three_wastes() -> None:
    view = EngineData(costs=COSTS)
    # C_i = 32 tokens (2 blocks), T_INT = 1.0 s, C_other = 11 (C_batch = 43):
    #   Preserve = 1.0 x 32 = 32;  Discard = T_fwd(32) x 43 = 0.032 x 43 = 1.376;
    #   Swap = 2 x T_swap(2 blocks) x 43 = 2 x 0.004 x 43 = 0.344  (token-seconds).
    wasted = waste(32, 1.0, 11, view)
    assert (wasted.preserve, wasted.discard, wasted.swap) == pytest.approx((32.0, 1.376, 0.344))


def paused(policy: InferCeptEngine, session_id: str, tool_s: float, at: float = 9.0) -> None:
    """``session_id``'s call finished at ``at`` and asked for a tool of ``tool_s``."""
    decision = policy.on_call_finished(call(session_id, expected_tool_s=tool_s), EngineData(now=at))
    assert decision == Pin()  # kept at first, judged at the next step


# Three paused sessions, judged at 10.0 with one running call of 100 tokens
# (C_other = 100), a swap budget of int(10 ms step / 2 ms a block) = 5 blocks:
#   p: 64 tokens (4 blocks), tool ends 12.0 (2.0 s left): Preserve 128,
#      Discard 0.064 x 164 = 10.496 -> min 10.496
#   q: 32 tokens (2 blocks), tool ends 10.1 (0.1 s left): Preserve 3.2,
#      Discard 0.032 x 132 = 4.224 -> min 3.2
#   r: 16 tokens (1 block), tool ends 20.0 (10 s left): Preserve 160,
#      Discard 0.016 x 116 = 1.856 -> min 1.856
# Order, most wasteful first: p, q, r.
PINS = (PinData("p", 4, 64), PinData("q", 2, 32), PinData("r", 1, 16))
RUNNING = (call("x", prompt_tokens=90, output_tokens=10),)


def judged() -> tuple[InferCeptEngine, EngineData]:
    """The engine half after p, q and r paused at 9.0, and the engine at 10.0."""
    policy = InferCept().engine()
    for session_id, tool_s in [("p", 3.0), ("q", 1.1), ("r", 11.0)]:
        paused(policy, session_id, tool_s)
    view = EngineData(now=10.0, pins=PINS, running=RUNNING, costs=COSTS, cpu_free_blocks=64)
    return policy, view


def test_swap_the_most_wasteful_within_the_budget_the_last_one_in_part() -> None:
    policy, view = judged()
    # Budget 5: p (4 blocks) swapped whole, 1 left; q (2 blocks): its last block
    # swapped, budget spent; r: Discard 1.856 < Preserve 160 -> discarded.
    assert list(policy.tick(view)) == [
        SessionAction("offload", "p", blocks=4),
        SessionAction("offload", "q", blocks=1),
        SessionAction("unpin", "r"),
    ]


def test_a_pin_partly_swapped_is_finished_first_at_the_next_steps() -> None:
    policy, view = judged()
    policy.tick(view)
    # 10 ms later p is in the CPU tier, q has 1 block left on the GPU, and a new pin n
    # (5 blocks, tool ends 40.0: Discard 0.08 x 180 = 14.4 > p's 10.496 -> the most
    # wasteful) has come. q's swap goes on first and is never discarded; n gets the
    # 4 blocks left of the budget, its last 4.
    paused(policy, "n", tool_s=30.0, at=10.0)
    later = replace(view, now=10.01, pins=(PinData("q", 1, 16), PinData("n", 5, 80)))
    assert list(policy.tick(later)) == [
        SessionAction("offload", "q", blocks=1),
        SessionAction("offload", "n", blocks=4),
    ]
    # Without budget at the step after (a 20 ms block), n's last block stays pinned
    # though discarding would waste less than preserving: its swap has begun.
    slow = replace(COSTS, transfer_s_per_block=0.02)
    no_budget = replace(later, now=10.02, pins=(PinData("n", 1, 16),), costs=slow)
    assert list(policy.tick(no_budget)) == []


def test_without_swap_budget_the_cheaper_of_discard_and_preserve() -> None:
    # 20 ms a block: int(10 / 20) = 0 blocks a step.
    policy, view = judged()
    view = replace(view, costs=replace(COSTS, transfer_s_per_block=0.02))
    # p: Discard 10.496 < Preserve 128 -> discard; q: preserve; r: 1.856 < 160 -> discard.
    assert list(policy.tick(view)) == [
        SessionAction("unpin", "p"),
        SessionAction("unpin", "r"),
    ]


def test_no_more_is_swapped_than_the_cpu_tier_has_room_for() -> None:
    policy, view = judged()
    view = replace(view, cpu_free_blocks=4)
    # Budget min(5, 4 free CPU blocks) = 4: p (4) swapped, none left; q preserved;
    # r (1 block) no longer fits: discarded (1.856 < 160).
    assert list(policy.tick(view)) == [
        SessionAction("offload", "p", blocks=4),
        SessionAction("unpin", "r"),
    ]


def test_a_pin_whose_tool_has_ended_is_left_for_its_next_call() -> None:
    policy, view = judged()
    # At 10.5, with a budget of 10 ms / 1.25 ms = 8 blocks, room for all three: q's
    # tool (ended 10.1) is over, so q is no longer intercepted and is left alone (its
    # next call takes the pin over when admitted); p (1.5 s left) and r (9.5 s left)
    # are swapped.
    view = replace(view, now=10.5, costs=replace(COSTS, transfer_s_per_block=0.00125))
    assert list(policy.tick(view)) == [
        SessionAction("offload", "p", blocks=4),
        SessionAction("offload", "r", blocks=1),
    ]
    # Once every tool has ended there is nothing to judge.
    assert list(policy.tick(replace(view, now=20.0))) == []


def test_the_swap_budget_is_one_decode_step_of_the_running_batch() -> None:
    policy = InferCept().engine()
    pins = [PinData(f"s{i}", 1, 16) for i in range(10)]
    for pin in pins:
        paused(policy, pin.session_id, tool_s=100.0)
    # Two running calls of 100 tokens each. Decode step: 0.609375 s + 1/512 s per
    # context token of each sequence: 0.609375 + 2 x 100 / 512 = 1.0 s; a block moves
    # in 0.125 s: 8 blocks a step. The ten 1-block pins tie: the first 8 are swapped,
    # the last 2 discarded (Discard 0.016 x 216 = 3.456 < Preserve 99 x 16 = 1584).
    costs = LinearCosts(
        prefill_s_per_token=0.001,
        decode_step_s=0.609375,
        decode_s_per_token=1 / 512,
        transfer_s_per_block=0.125,
    )
    running = [call("x", prompt_tokens=100), call("y", prompt_tokens=100)]
    view = EngineData(now=10.0, pins=pins, running=running, costs=costs, cpu_free_blocks=64)
    actions = list(policy.tick(view))
    assert [a.kind for a in actions] == ["offload"] * 8 + ["unpin"] * 2
    assert [a.session_id for a in actions] == [p.session_id for p in pins]


def test_seed_001_figure_1_r1_is_preserved_and_r2_discarded() -> None:
    # The example's units: 1 memory unit a token (blocks of 1 token), recomputing costs
    # 1 time unit a token, one request runs at a time (C_other = 0), no swap (a block
    # takes 2 units to move, a step 1: budget 0).
    units = LinearCosts(prefill_s_per_token=1.0, decode_step_s=1.0, transfer_s_per_block=2.0)
    policy = InferCept().engine()
    paused(policy, "R1", tool_s=2.0, at=0.0)  # 5 tokens before its 2-unit API
    paused(policy, "R2", tool_s=7.0, at=0.0)  # 1 token before its 7-unit API
    view = EngineData(
        now=0.0, block_size=1, pins=[PinData("R1", 5, 5), PinData("R2", 1, 1)], costs=units
    )
    # R1: Preserve 2 x 5 = 10, Discard 5 x (5 + 0) = 25 -> preserve (no action).
    # R2: Preserve 7 x 1 = 7, Discard 1 x (1 + 0) = 1 -> discard.
    assert waste(5, 2.0, 0, view).preserve == 10
    assert waste(5, 2.0, 0, view).discard == 25
    assert list(policy.tick(view)) == [SessionAction("unpin", "R2")]


def test_fcfs_by_the_sessions_original_arrival() -> None:
    policy, view = InferCept().engine(), EngineData()
    resumed = call("a", 3, arrival_s=9.0, session_arrival_s=0.0)
    fresh = call("b", 0, arrival_s=1.0, session_arrival_s=1.0)
    order = sorted([fresh, resumed], key=lambda c: policy.priority(c, view))
    assert order == [resumed, fresh]


def test_a_call_that_calls_no_tool_releases_its_kv() -> None:
    assert InferCept().engine().on_call_finished(call("a"), EngineData()) == Release()


def test_a_finished_session_is_no_longer_judged() -> None:
    # p, q and r paused as above, then p's session ends: its tool end is forgotten, so
    # even a pin of p still in the view (the engine drops it with the session) is not
    # intercepted (no tool end known: 0 s left). q and r are judged as before: budget
    # 5 blocks, q (2 blocks) swapped, 3 left; r (1) swapped.
    policy, view = judged()
    policy.on_event(SessionEnd(session_id="p", turns=2))
    assert list(policy.tick(view)) == [
        SessionAction("offload", "q", blocks=2),
        SessionAction("offload", "r", blocks=1),
    ]


def test_without_a_cpu_tier_nothing_is_swapped_and_the_waste_still_decides() -> None:
    # No tier: the swap budget is min(budget, cpu_free_blocks = 0) = 0. The discard
    # and preserve choices stay as the equations say.
    engine = InferCept().engine()
    view = EngineData(
        now=0.0,
        pins=[PinData("a", blocks=4, tokens=64), PinData("b", blocks=1, tokens=16)],
        costs=LinearCosts(prefill_s_per_token=0.001, transfer_s_per_block=0.0001),
    )
    engine.on_call_finished(call("a", expected_tool_s=100.0), view)  # a long tool
    engine.on_call_finished(call("b", expected_tool_s=0.001), view)  # a short one
    # a: preserve 100 s * 64 = 6,400 > discard 0.064 s * 64 = 4.1: discarded (unpin).
    # b: preserve 0.001 * 16 = 0.016 < discard 0.016 * 16 = 0.256: kept.
    assert list(engine.tick(view)) == [SessionAction("unpin", "a")]


def test_the_engine_half_is_judged_at_every_step_with_costs_and_a_cpu_tier_if_any() -> None:
    engine = InferCept().engine()
    assert engine.tick_interval_s == 0.0
    assert engine.needs == {Capability.COSTS, Capability.TICK}
    assert engine.uses == {Capability.CPU_TIER}
    assert InferCept().admission().needs == frozenset()


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------

# a: 30-token prompt, 3 out, a 1 s tool, then 8 more and 2 out. b: a long call (8-token
# prompt, 56 out) that keeps the engine stepping, and over its run takes all 4 blocks.
BUSY = (session("a", turn(30, 3, tool_s=1.0), turn(8, 2)), session("b", turn(8, 56)))


def test_a_discarded_context_is_recomputed() -> None:
    record = run("infercept", *BUSY, blocks=4, cpu_bandwidth=800)
    # 0.03: a's first call ends (32 computed tokens, 2 full blocks pinned). At the next
    # step: C_i = 32, T_INT = 1.0, C_other = b's 11 tokens; T_fwd(32) = one step, 10 ms.
    # Preserve 32, Discard 0.01 x 43 = 0.43. Budget: 10 ms step / 20 ms a block = 0:
    # no swap; Discard < Preserve: discarded, a's 2 blocks go to the free
    # queue after the one never used. b grows to 4 blocks before it ends (0.56): it
    # takes that one, then a's 2 (2 evictions while a's tool runs).
    # 1.03: a's 2nd call (41 tokens) finds nothing: first token 1.04, end 1.05.
    assert evicted_before(record, 1.03) == 2
    assert [c.cached_tokens for c in calls(record, "a")] == [0, 0]
    assert ends(record) == pytest.approx({"a": 1.05, "b": 0.56})
    assert record.computed_tokens == (30 + 2) + (8 + 55) + (41 + 1)
    assert record.pinned_block_s == 0.0


def test_a_swapped_context_is_loaded_back() -> None:
    record = run("infercept", *BUSY, blocks=4, cpu_bandwidth=3200)
    # A block now moves in 5 ms: budget 10 / 5 = 2 blocks, a's 2 are swapped out at
    # 0.03 (then evicted from the GPU as above). 1.03: a's 2nd call finds its 32
    # tokens in the CPU tier; loading 2 blocks takes 10 ms: it computes the other 9 at
    # 1.04 (first token 1.05) and ends at 1.06.
    a_calls = calls(record, "a")
    assert [c.cached_tokens for c in a_calls] == [0, 32]
    assert a_calls[1].first_token_s == pytest.approx(1.05)
    assert ends(record) == pytest.approx({"a": 1.06, "b": 0.56})
    assert record.computed_tokens == (30 + 2) + (8 + 55) + (9 + 1)


def test_a_pin_larger_than_the_budget_is_swapped_over_several_steps() -> None:
    record = run("infercept", *BUSY, blocks=4, cpu_bandwidth=1600)
    # As the discarded case, but a block moves in 10 ms: a budget of 1 block a step.
    # 0.03: a's last block is swapped out (its pin keeps the first); 0.04: the first.
    # b then evicts both from the GPU as before. 1.03: a's 2nd call finds its 32
    # tokens in the CPU tier; loading 2 blocks takes 20 ms: it computes the other 9 at
    # 1.05 (first token 1.06) and ends at 1.07.
    a_calls = calls(record, "a")
    assert [c.cached_tokens for c in a_calls] == [0, 32]
    assert a_calls[1].first_token_s == pytest.approx(1.06)
    assert ends(record) == pytest.approx({"a": 1.07, "b": 0.56})
    assert record.computed_tokens == (30 + 2) + (8 + 55) + (9 + 1)


def test_infercept_predicted_reads_the_streams_tool_mean_not_the_oracle() -> None:
    engine = make_policy("infercept-predicted").engine()
    assert Capability.TOOL_FIGURES in engine.needs
    view = EngineData(now=10.0, tool_ema_s={"t": 3.0, "u": 5.0})
    oracle = {"expects_tool": True, "expected_tool_s": 99.0}
    assert engine.on_call_finished(call("a", next_tool="t", **oracle), view) == Pin()
    assert engine._remaining_tool_s(PinData("a", 1, 16), view) == pytest.approx(3.0)
    # A kind not seen yet: every kind's mean, (3 + 5) / 2.
    assert engine.on_call_finished(call("b", next_tool="v", **oracle), view) == Pin()
    assert engine._remaining_tool_s(PinData("b", 1, 16), view) == pytest.approx(4.0)
    # No tool ended yet: taken to run none, so the pin is not intercepted.
    engine.on_call_finished(call("c", next_tool="t", **oracle), EngineData(now=10.0))
    assert engine._remaining_tool_s(PinData("c", 1, 16), view) == 0
    # No tool expected: released, as the oracle's InferCept does.
    assert engine.on_call_finished(call("d", expects_tool=False), view) == Release()
