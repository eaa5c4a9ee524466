"""MARS's CPU KV tier: where a parked session's KV waits (kv_tier's prices, worked by
hand), the eviction to the tier under pressure, the load ahead of need, and on the
simulated engine the contexts that come back by a transfer instead of a recompute."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import ToolEnd
from agentmars.server.policies.interface import Offload, Pin, Release, SessionAction
from agentmars.server.policies.mars.co_scheduler import OpportunisticCoScheduler, Parked
from agentmars.server.policies.mars.kv_tier import Place, Prices, prices
from agentmars.server.policies.mars.scheduler import MarsScheduler, PaperScheduler
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.registry import make_policy
from tests.server.policies.scenarios import calls, run, session, turn
from tests.server.policies.views import CallData, EngineData, LinearCosts, PinData, call

SETTINGS = MarsSettings()  # pressure 0 below 50% used, 1 from 90%
COSTS = LinearCosts(prefill_s_per_token=0.001, transfer_s_per_block=0.01)
"""1 ms a prefill token; 10 ms a block each way."""


def tier_view(**fields: object) -> EngineData:
    """64 blocks of 16 tokens (a pool of 1024 tokens) and a CPU tier of 64."""
    base: dict[str, object] = {"costs": COSTS, "cpu_total_blocks": 64, "cpu_free_blocks": 64}
    return EngineData(**(base | fields))  # type: ignore[arg-type]


def ending(session_id: str = "s", tokens: int = 320, tool: str = "t") -> CallData:
    return call(
        session_id,
        prompt_tokens=tokens - 2,
        output_tokens=2,
        num_computed_tokens=tokens,
        expects_tool=True,
        next_tool=tool,
    )


# --- the prices ------------------------------------------------------------------------------


def test_the_prices_are_infercepts_wastes_with_mars_estimates() -> None:
    # 320 tokens (20 blocks), a tool 4 s from its end, at pressure 0.5, pool 1024 tokens:
    # keep 0.5 x 4 x 320 = 640; drop 0.32 s x 1024 = 327.68; offload without a load
    # ahead 0.5 x 0.2 s x 1024 = 102.4.
    view = tier_view()
    cost = prices(320, 4.0, 0.5, view, lambda: 0.32, tier=True, prefetch=False)
    assert cost == Prices(pytest.approx(640.0), pytest.approx(327.68), pytest.approx(102.4))
    assert cost.cheapest() is Place.CPU
    # A load ahead hides the load back when the tool outlasts the copy (0.2 s): free.
    hidden = prices(320, 4.0, 0.5, view, lambda: 0.32, tier=True, prefetch=True)
    assert hidden.offload == 0 and hidden.cheapest() is Place.CPU
    # ... not when it does not.
    short = prices(320, 0.1, 0.5, view, lambda: 0.32, tier=True, prefetch=True)
    assert short.offload == pytest.approx(102.4) and short.cheapest() is Place.GPU


def test_without_room_in_the_tier_it_is_keep_or_drop_as_in_the_paper() -> None:
    full = tier_view(cpu_free_blocks=19)  # the context needs 20
    cost = prices(320, 4.0, 0.5, full, lambda: 0.32, tier=True, prefetch=True)
    assert cost.offload is None and cost.cheapest() is Place.DROP
    # A short tool: keeping (0.5 x 1 x 320 = 160) beats the drop (327.68).
    assert prices(320, 1.0, 0.5, full, lambda: 0.32, tier=True, prefetch=True).cheapest() is (
        Place.GPU
    )
    # No tier used: the same, whatever the engine has.
    assert prices(320, 4.0, 0.5, tier_view(), lambda: 0.32, tier=False, prefetch=True).offload is (
        None
    )


def test_free_kv_is_offloaded_when_a_tier_has_room_and_kept_when_not() -> None:
    # Nobody waits: keeping costs nothing, and so does an offload (its blocks stay in
    # the GPU cache); the offload wins the tie, it leaves a copy in both places.
    assert prices(320, 4.0, 0.0, tier_view(), lambda: pytest.fail("not asked"), tier=True,
                  prefetch=False).cheapest() is Place.CPU  # fmt: skip
    assert prices(320, 4.0, 0.0, tier_view(cpu_free_blocks=0), lambda: 0.32, tier=True,
                  prefetch=False).cheapest() is Place.GPU  # fmt: skip


# --- the engine half's decisions -------------------------------------------------------------


def test_a_finished_call_goes_where_it_wastes_least() -> None:
    co = OpportunisticCoScheduler(SETTINGS, tier=True, prefetch=True)
    # 60 of 64 blocks used and a call waits: pressure 1. The tool's mean is 4 s.
    waiting = [call("w", prompt_tokens=32)]
    pressed = tier_view(free_blocks=4, waiting=waiting, tool_ema_s={"t": 4.0})
    assert co.on_call_finished(ending("a"), pressed) == Offload()
    assert co.parked["a"].place is Place.CPU
    # The tier is full: a 4 s tool is not worth 20 blocks at pressure 1 (keep 1280 >
    # drop 327.68): dropped, and forgotten.
    full = tier_view(free_blocks=4, waiting=waiting, tool_ema_s={"t": 4.0}, cpu_free_blocks=0)
    assert co.on_call_finished(ending("b"), full) == Release()
    assert "b" not in co.parked
    # The paper's MARS has no tier: the same call is kept or dropped only.
    paper = OpportunisticCoScheduler(SETTINGS)
    assert paper.on_call_finished(ending("c"), pressed) == Release()
    assert paper.on_call_finished(ending("c"), tier_view(tool_ema_s={"t": 4.0})) == Pin()


def test_under_pressure_pins_go_to_the_tier_lowest_priority_first() -> None:
    half = MarsScheduler(SETTINGS)
    # Two pins of 8 and 16 blocks; a waiting call needs 20 blocks, 8 are free: 12 are
    # missing. The review keeps both (their tools just started and no tool mean is
    # known: keeping costs nothing yet); the eviction sends the larger pin (the lower
    # priority among equal service) and stops, 16 >= 12.
    pins = [PinData("small", 8, 128), PinData("large", 16, 256)]
    waiting = [call("w", prompt_tokens=320)]
    view = tier_view(total_blocks=64, free_blocks=8, pins=pins, waiting=waiting)
    assert half.tick(view) == [SessionAction("offload", "large")]
    # Without a tier (the paper's MARS) nothing moves on the tick: the engine's own
    # reclaim drops pins when the call is admitted.
    assert PaperScheduler(SETTINGS).tick(view) == []


def test_the_load_ahead_starts_when_the_tool_ends_or_is_due_to() -> None:
    half = MarsScheduler(SETTINGS)
    parked = half.co_scheduler.parked
    parked["ended"] = Parked("t", since_s=0.0, blocks=4, place=Place.CPU)
    parked["due"] = Parked("t", since_s=0.0, blocks=4, place=Place.CPU)
    parked["early"] = Parked("t", since_s=2.0, blocks=4, place=Place.CPU)
    parked["pinned"] = Parked("t", since_s=0.0, blocks=4, place=Place.GPU)
    half.on_event(ToolEnd(session_id="ended", call_id="c", tool="t", duration_s=1.0))
    # The mean is 3 s; at 2.5 s "due" is 0.5 s from its end, within a load (0.04 s)
    # and a tick (0.5 s); "early" started at 2 s. 64 blocks are free.
    view = tier_view(now=2.5, tool_ema_s={"t": 3.0})
    assert half.tick(view) == [
        SessionAction("prefetch", "ended"),
        SessionAction("prefetch", "due"),
    ]
    assert parked["ended"].place is Place.GPU  # asked once
    assert half.tick(view) == []
    # Only on blocks no waiting call needs.
    parked["early"].since_s = 0.0
    crowded = tier_view(now=2.5, tool_ema_s={"t": 3.0}, free_blocks=10,
                        waiting=[call("w", prompt_tokens=100)])  # fmt: skip
    assert half.tick(crowded) == []  # 7 blocks wanted, 3 spare: 4 do not fit


# --- on the simulated engine -----------------------------------------------------------------


def test_an_evicted_context_comes_back_from_the_tier_not_by_a_recompute() -> None:
    # As test_co_scheduler's reclaim test: A's 3 full blocks (48 tokens) wait through a
    # 1 s tool while B grows to 7 of the 8 blocks. The paper's MARS pins them and
    # drops the pin for B; MARS offloads them when A's call ends (nobody waits: the
    # tie goes to the copy), B evicts what it needs from the GPU cache, and A's next
    # call loads that back: all 48 tokens found, no recompute, B never preempted.
    a = session("A", turn(48, 2, tool_s=1.0), turn(16, 2))
    b = session("B", turn(64, 40), arrival_s=0.05)
    record = run("mars", a, b)
    assert calls(record, "B")[0].preemptions == 0
    resumed = calls(record, "A")[1]
    assert resumed.cached_tokens == 48
    assert resumed.load_s > 0
    assert calls(run("mars-paper", a, b), "A")[1].cached_tokens < 48
    assert calls(run("mars-no-tier", a, b), "A")[1].cached_tokens < 48


def test_a_load_ahead_of_need_hides_the_transfer() -> None:
    # A's first tool (1 s) teaches the tool's mean. During its second, B takes 7 of
    # the 8 blocks and evicts A's context (68 tokens: 4 full blocks) from the GPU
    # cache; B is done long before A's tool ends. MARS loads A's 4 blocks back at the
    # tick that finds the tool due (0.04 s of transfer): A's third call finds them on
    # the GPU, the whole load hidden. Without the load ahead, the call waits for it.
    a = session("A", turn(48, 2, tool_s=1.0), turn(16, 2, tool_s=1.0), turn(16, 2))
    b = session("B", turn(64, 40), arrival_s=1.1)
    ahead = calls(run("mars", a, b), "A")[2]
    assert ahead.load_s > 0 and ahead.load_hidden_s == pytest.approx(ahead.load_s)
    late = calls(run("mars-no-prefetch", a, b), "A")[2]
    assert late.load_s > 0 and late.load_hidden_s == 0
    assert ahead.first_token_s - ahead.submit_s < late.first_token_s - late.submit_s


def test_mars_paper_and_the_ablations_are_registered_apart() -> None:
    mars = make_policy("mars")
    assert type(mars.engine()).tier and type(mars.admission()).tail_guard
    paper = make_policy("mars-paper")
    assert not type(paper.engine()).tier and not type(paper.admission()).tail_guard
    assert not type(make_policy("mars-no-prefetch").engine()).prefetch
    assert not type(make_policy("mars-no-tail-guard").admission()).tail_guard
    assert not type(make_policy("mars-no-tier").engine()).tier
