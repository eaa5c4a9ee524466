"""FCFS (stock vLLM V1): arrival order, the newest running call preempted and
recomputed when KV runs out, finished calls' KV left in the prefix cache."""

from __future__ import annotations

import pytest

from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.fcfs import FCFS
from agentmars.server.policies.interface import AdmissionHalf, EngineHalf, Release
from tests.server.policies.scenarios import calls, ends, evictions, run, session, turn
from tests.server.policies.views import (
    AdmissionData,
    EngineData,
    PinData,
    SessionData,
    call,
    kv_stats,
)

# --- decisions -------------------------------------------------------------------------


def test_waiting_calls_go_in_arrival_order() -> None:
    policy, view = FCFS().engine(), EngineData(now=5.0)
    late = call("a", arrival_s=2.0, session_arrival_s=0.0)
    early = call("b", arrival_s=1.0, session_arrival_s=1.0)
    # Call arrival, not session arrival: b's call came first although a's session did.
    assert sorted([late, early], key=lambda c: policy.priority(c, view)) == [early, late]


def test_every_session_is_admitted_in_queue_order() -> None:
    queue = [SessionData("b", prompt_tokens=10_000), SessionData("a", prompt_tokens=10)]
    # Whatever the KV figures say (none free) or whether any arrived at all.
    full = AdmissionData(kv=kv_stats(free_blocks=0))
    assert list(FCFS().admission().admit(queue, full)) == queue
    assert list(FCFS().admission().admit(queue, AdmissionData(kv=None))) == queue


def test_both_halves_are_stock_and_need_nothing() -> None:
    policy = FCFS()
    admission, engine = policy.admission(), policy.engine()
    assert type(admission) is AdmissionHalf and type(engine) is EngineHalf
    assert admission.needs == frozenset() and engine.needs == frozenset()
    assert admission.control_interval_s is None


def test_the_newest_running_call_is_the_victim() -> None:
    running = [call("a"), call("b", expects_tool=False), call("c")]
    assert FCFS().engine().victim(running, EngineData(running=running)) is running[-1]


def test_chunk_takes_what_the_budget_allows() -> None:
    # 300 tokens allowed by the budget, 32 fit in the free blocks: FCFS asks for all 300
    # and lets the engine make room (it never shrinks a chunk).
    assert FCFS().engine().chunk(call("a"), 300, 32, EngineData()) == 300


def test_finished_calls_release_their_kv_and_nothing_is_pinned() -> None:
    policy = FCFS().engine()
    assert policy.on_call_finished(call("a", expected_tool_s=0.5), EngineData()) == Release()
    assert policy.tick(EngineData()) == ()
    assert (policy.preempt_by_swap, Capability.CPU_TIER in policy.needs) == (False, False)
    assert not policy.offload_evicted
    assert policy.reserve_full_prompt
    assert policy.tick_interval_s is None


def test_pins_are_dropped_oldest_first() -> None:
    pins = [PinData("a", 2, 32, pinned_s=3.0), PinData("b", 2, 32, pinned_s=1.0)]
    assert [p.session_id for p in FCFS().engine().reclaim(pins, 1, EngineData())] == ["b", "a"]


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------


def test_a_call_that_does_not_fit_blocks_the_ones_behind_it() -> None:
    record = run(
        "fcfs",
        session("a", turn(64, 20)),
        session("b", turn(80, 2), arrival_s=0.005),
        session("c", turn(16, 2), arrival_s=0.006),
        blocks=8,
    )
    # 0.00: a admitted (64 tokens = 4 blocks), first token at 0.01.
    # 0.01: a decodes and takes a 5th block; 3 free. Waiting, in arrival order: b needs
    #       5 blocks for its 80-token prompt -> it does not fit and stops the pass, so c
    #       (1 block, it fits) is never looked at. Same at every step while a runs (a
    #       takes a 6th block at its 81st token, 2 left).
    # 0.20: a ends (20 tokens: 0.01 + 19 steps); b and c are admitted together, first
    #       tokens at 0.21, second (last) at 0.22.
    assert ends(record) == pytest.approx({"a": 0.20, "b": 0.22, "c": 0.22})
    (c_call,) = calls(record, "c")
    assert c_call.first_token_s == pytest.approx(0.21)
    assert c_call.ttft_s == pytest.approx(0.21 - 0.006)


def test_without_the_blocking_call_the_small_one_runs_at_once() -> None:
    record = run("fcfs", session("a", turn(64, 20)), session("c", turn(16, 2), arrival_s=0.006))
    # 0.01: c (1 block) fits beside a (5 blocks of 8): first token 0.02, done 0.03.
    assert ends(record) == pytest.approx({"a": 0.20, "c": 0.03})


def test_kv_exhaustion_preempts_the_newest_call_which_is_recomputed() -> None:
    record = run("fcfs", session("a", turn(24, 20)), session("b", turn(24, 20)), blocks=4)
    # 0.00: a gets blocks 0-1 and b blocks 2-3 for their 24-token prompts (all 4).
    # 0.01: first tokens; each has 24 computed tokens (block 0 of each is full).
    # 0.01-0.09: 8 decode steps fill each call's 2nd block (32 computed tokens, 9
    #       output tokens); both blocks of each are now cached.
    # 0.09: a needs a 3rd block, none is free, no pin to drop: the victim is the newest
    #       running call, b. b's blocks go back to the free queue, its last block
    #       first, and a takes that one: b's 2nd block is evicted (1 eviction at 0.09).
    #       b waits with 33 tokens (24 prompt + 9 output) and 32 to compute again.
    # 0.10-0.19: b's prefix in the cache is its 1st block (16 tokens); it needs
    #       3 blocks (2 new + the cached free one) and only 1 is free -> it waits.
    # 0.20: a ends (20 tokens); b is admitted: 16 tokens hit, 17 computed. Its 2
    #       new blocks come from a's: a's 3rd (never full, not cached) and a's 2nd
    #       (cached): 1 eviction at 0.20. Recomputed: 32 - 16 = 16 tokens.
    # 0.21: b's 10th token; 10 more steps -> b ends at 0.31.
    assert ends(record) == pytest.approx({"a": 0.20, "b": 0.31})
    (a_call,) = calls(record, "a")
    (b_call,) = calls(record, "b")
    assert (a_call.preemptions, a_call.recomputed_tokens) == (0, 0)
    assert (b_call.preemptions, b_call.recomputed_tokens) == (1, 16)
    assert record.preemptions == 1
    assert evictions(record) == [(0.09, 1), (0.20, 1)]
    # a: 24 + 19 decoded; b: 24 + 8 before the preemption, 17 + 10 after = 102.
    assert record.computed_tokens == 24 + 19 + (24 + 8) + (17 + 10)
    # 1 + 8 steps to 0.09, 11 to 0.20 (a's last), 1 + 10 for b: 31 steps of 10 ms.
    assert record.steps == 31
    assert record.duration_s == pytest.approx(0.31)


def test_a_released_context_is_reused_from_the_prefix_cache() -> None:
    record = run("fcfs", session("a", turn(30, 3, tool_s=1.0), turn(8, 2)))
    # Turn 0: 30-token prompt, 3 tokens out (0.01, 0.02, 0.03): 32 computed tokens =
    # 2 full blocks, released to the prefix cache. Nothing else allocates them, so
    # turn 1 (prompt 30 + 3 + 8 = 41, sent at 1.03) finds 32 tokens; it computes the
    # other 9 in one step (first token 1.04) and ends at 1.05.
    first, second = calls(record, "a")
    assert (first.cached_tokens, second.cached_tokens) == (0, 32)
    assert second.prompt_tokens == 41
    assert second.submit_s == pytest.approx(1.03)
    assert second.end_s == pytest.approx(1.05)
    assert record.pinned_block_s == 0.0
    assert evictions(record) == []
