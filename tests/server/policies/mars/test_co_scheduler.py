"""MARS's Opportunistic Co-Scheduler: chunk shrinking (and the one call that may start
on less than its prompt), pins that last only while the warm resume pays, reviewed
while the tool runs, and, on the simulated engine, pins reclaimed before a running
call is preempted and progress made where FCFS stalls."""

from __future__ import annotations

from dataclasses import asdict, replace
from types import SimpleNamespace
from typing import Any

import pytest

from agentmars.sdk.events import LLMEnd, LLMFirstToken
from agentmars.server.policies.interface import Pin, Release, SessionAction
from agentmars.server.policies.mars.co_scheduler import (
    OpportunisticCoScheduler,
    expected_remaining_s,
    kv_pressure,
    shrink_chunk,
)
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost
from agentmars.server.sim.engine import SimEngine
from agentmars.server.workloads.model import Workload
from tests.server.policies.scenarios import calls, profile, run, session, turn
from tests.server.policies.views import CallData, EngineData, LinearCosts, PinData, call

SETTINGS = MarsSettings()  # KV pressure 0 below 50% used, 1 from 90%


# --- chunk shrinking -------------------------------------------------------------------------


def test_a_chunk_that_does_not_fit_shrinks_to_whole_blocks_down_to_one() -> None:
    assert shrink_chunk(100, 200, 16, running=True) == 100
    assert shrink_chunk(100, 40, 16, running=True) == 32
    assert shrink_chunk(100, 16, 16, running=False) == 16
    # Less than a block free: a running call asks for one (pins, then a victim, make
    # room); a waiting call waits.
    assert shrink_chunk(100, 10, 16, running=True) == 16
    assert shrink_chunk(100, 10, 16, running=False) == 0


A_RUNNING = call("A", prompt_tokens=48, output_tokens=1, max_tokens=40, num_computed_tokens=48)
"""Decoding: its 48 computed tokens hold 3 blocks, 6 at its 88th: it still needs 3."""


def live(session_id: str, **fields: Any) -> SimpleNamespace:
    """A call whose fields change as the engine runs it, as the engines' views do (the
    co-scheduler keeps the view of the call it let start)."""
    return SimpleNamespace(**asdict(call(session_id, **fields)))


def test_one_call_at_a_time_starts_on_the_blocks_the_running_calls_will_not_need() -> None:
    co = OpportunisticCoScheduler(SETTINGS)
    b, c = live("B", prompt_tokens=100), call("C", prompt_tokens=100)
    view = EngineData(total_blocks=8, free_blocks=4, running=[A_RUNNING], waiting=[b, c])
    assert view.running_growth_blocks == 3
    assert co.may_start_partial(b, view)
    # B's chunk: 4 free blocks less A's 3 to come: one block, 16 tokens.
    assert co.chunk(b, 100, 64, view) == 16
    # While B is in its prompt no other call starts that way, spare blocks or not.
    b.num_computed_tokens = 16
    roomy = EngineData(total_blocks=32, free_blocks=16, running=[A_RUNNING, b], waiting=[c])
    assert roomy.running_growth_blocks == 3 + 6  # B: 7 blocks at its 110th, holds 1
    assert not co.may_start_partial(c, roomy)
    view = EngineData(total_blocks=8, free_blocks=3, running=[A_RUNNING, b], waiting=[c])
    # B goes on only on blocks nobody running will need, evicting nothing: 3 free, A
    # needs 3, none now.
    assert co.chunk(b, 84, 48, view) == 0
    # Once B's prompt is in (its 110th token fits the 7 blocks of its 100), the next
    # call may start on spare blocks: 6 free, A needs 3.
    b.num_computed_tokens, b.output_tokens = 100, 1
    view = EngineData(total_blocks=16, free_blocks=6, running=[A_RUNNING, b], waiting=[c])
    assert co.may_start_partial(c, view)
    # No spare block: no start.
    tight = EngineData(total_blocks=8, free_blocks=2, running=[A_RUNNING], waiting=[c])
    assert not OpportunisticCoScheduler(SETTINGS).may_start_partial(c, tight)


def test_a_partial_start_preempted_unstarted_or_gone_lets_the_next_one_start() -> None:
    spare = EngineData(total_blocks=16, free_blocks=8, running=[A_RUNNING])
    c = call("C", prompt_tokens=100)
    # Preempted in its prompt: both engines count it and reset its computed tokens.
    co, b = OpportunisticCoScheduler(SETTINGS), live("B", prompt_tokens=100)
    assert co.may_start_partial(b, spare)
    b.num_computed_tokens = 16
    assert not co.may_start_partial(c, spare)
    b.num_computed_tokens, b.num_preemptions = 0, 1
    assert co.may_start_partial(c, spare)
    # Given no chunk (3 free, A needs 3), it did not start.
    co, b = OpportunisticCoScheduler(SETTINGS), live("B", prompt_tokens=100)
    assert co.may_start_partial(b, replace(spare, free_blocks=4))
    assert co.chunk(b, 100, 48, replace(spare, free_blocks=3)) == 0
    b.num_computed_tokens = 16  # as if it had run: only the chunk's answer freed C
    assert co.may_start_partial(c, replace(spare, free_blocks=4))
    # Gone from the engine in its prompt (aborted): forgotten at the next review.
    co, b = OpportunisticCoScheduler(SETTINGS), live("B", prompt_tokens=100)
    assert co.may_start_partial(b, spare)
    b.num_computed_tokens = 16
    co.forget_gone_partial(replace(spare, running=[A_RUNNING, b]))
    assert not co.may_start_partial(c, spare)
    co.forget_gone_partial(spare)
    assert co.may_start_partial(c, spare)


# --- pins ------------------------------------------------------------------------------------

# 640 blocks, 80 free: 87.5% used, pressure (0.875 - 0.5) / 0.4 = 0.9375. A call of
# 1,600 tokens holds 100 blocks, 0.15625 of the pool; its prefill takes 1.6 s at 1 ms
# a token. Holding it costs 0.9375 x 0.15625 = 0.1465 GPU-s per second of tool.
COSTS = LinearCosts(prefill_s_per_token=0.001)
PRESSED = EngineData(
    total_blocks=640, free_blocks=80, costs=COSTS, waiting=[call("other")],
    tool_ema_s={"short": 2.0, "long": 30.0, "medium": 8.0},
)  # fmt: skip
CALM = replace(PRESSED, waiting=[])


def ending(tool: str) -> CallData:
    return call("s", prompt_tokens=1590, output_tokens=10, next_tool=tool)


def test_pressure_is_the_used_share_above_its_low_mark_and_zero_without_waiting_calls() -> None:
    assert kv_pressure(PRESSED, SETTINGS) == pytest.approx(0.9375)
    assert kv_pressure(CALM, SETTINGS) == 0.0
    assert kv_pressure(replace(PRESSED, free_blocks=400), SETTINGS) == 0.0


def test_a_short_tool_keeps_its_pin_and_a_long_one_loses_it() -> None:
    co = OpportunisticCoScheduler(SETTINGS)
    # 2 s x 0.1465 = 0.29 GPU-s of holding against 1.6 s of prefill saved: pin.
    assert co.on_call_finished(ending("short"), PRESSED) == Pin()
    # 30 s x 0.1465 = 4.4 > 1.6: release.
    assert co.on_call_finished(ending("long"), PRESSED) == Release()
    # Without pressure holding costs nothing: even the long tool's session keeps it.
    assert co.on_call_finished(ending("long"), CALM) == Pin()
    # A call that ends its session (no tool to wait for) never pins.
    assert co.on_call_finished(replace(ending("short"), expects_tool=False), CALM) == Release()


def test_a_pin_is_dropped_when_pressure_rises_while_its_tool_runs() -> None:
    co = OpportunisticCoScheduler(SETTINGS)
    assert co.on_call_finished(ending("medium"), CALM) == Pin()
    pin = PinData("s", blocks=100, tokens=1600, pinned_s=0.0)
    # At 1 s, calm: kept. Under pressure, 7 s to go: 1.03 < 1.6, kept.
    assert co.review([pin], replace(CALM, now=1.0, pins=[pin])) == []
    assert co.review([pin], replace(PRESSED, now=1.0, pins=[pin])) == []
    # Past half its 8 s mean, a tool is expected to run as long again as it has: at
    # 12 s, 12 s more x 0.1465 = 1.76 > 1.6, dropped.
    assert expected_remaining_s(8.0, 12.0) == 12.0
    dropped = co.review([pin], replace(PRESSED, now=12.0, pins=[pin]))
    assert dropped == [SessionAction("unpin", "s")]


def test_without_a_cost_model_the_prefill_time_is_learned_from_the_stream() -> None:
    co = OpportunisticCoScheduler(SETTINGS)
    blind = replace(PRESSED, has_costs=False)
    # No estimate yet: under pressure the benefit is unknown, so no pin.
    assert co.on_call_finished(ending("short"), blind) == Release()
    # A call of 1,000 uncached tokens with a first token after 0.5 s: 0.5 ms a token,
    # so 0.8 s saved against 0.29 of holding: pin.
    co.on_event(LLMFirstToken(session_id="x", call_id="c", ttft_s=0.5))
    co.on_event(LLMEnd(session_id="x", call_id="c", prompt_tokens=1200, cached_tokens=200))
    assert co.recompute_s(1600, blind) == pytest.approx(0.8)
    assert co.on_call_finished(ending("short"), blind) == Pin()


# --- on the simulated engine -----------------------------------------------------------------


def test_pins_are_reclaimed_before_a_running_call_is_preempted() -> None:
    # 8 blocks. A's first call (48 + 2 tokens) ends at 0.02 s into a 1 s tool with
    # nothing waiting: its 3 full blocks are pinned. B (64 + 40 tokens) arrives at
    # 0.05 s and grows to 7 blocks: 3 + 7 > 8, so either A's pin goes or B, the only
    # running call, is preempted.
    a = session("A", turn(48, 2, tool_s=1.0), turn(16, 2))
    b = session("B", turn(64, 40), arrival_s=0.05)
    record = run("mars-paper", a, b)
    assert calls(record, "B")[0].preemptions == 0
    # The pin went: A's next call found less than its 48 pinned tokens.
    assert calls(record, "A")[1].cached_tokens < 48
    # With no pressure the pin would have held them all.
    alone = run("mars-paper", a)
    assert calls(alone, "A")[1].cached_tokens == 48


def test_chunk_shrinking_makes_progress_where_fcfs_stalls() -> None:
    # 8 blocks; steps of 10 ms plus 1 ms per prompt token. A (48 + 40 tokens) decodes
    # to 6 blocks; B's 100-token prompt (7 blocks) arrives at 1 ms and cannot fit whole
    # until A ends. FCFS: B waits, then its whole prompt takes 10 + 100 ms. MARS's engine
    # half starts B on A's 2 spare blocks (32 tokens) while A decodes, so only
    # 10 + 68 ms of B's prompt is left when A ends (A pays the 32 ms).
    cost = FittedCost(c0=0.01, c1=0.001, c2=0.0, c3=0.0, c4=0.0)
    engine = profile(blocks=8).model_copy(update={"cost": cost})
    workload = Workload(
        name="hand",
        sessions=(session("A", turn(48, 40)), session("B", turn(100, 2), arrival_s=0.001)),
    )
    after = {}
    for policy in ("fcfs", "mars-no-control-plane"):
        record = SimEngine(workload, make_policy(policy), engine).run()
        a_end = calls(record, "A")[0].end_s
        after[policy] = calls(record, "B")[0].first_token_s - a_end
    assert after["fcfs"] == pytest.approx(0.11)
    assert after["mars-no-control-plane"] == pytest.approx(0.078)
