"""Continuum (fixed TTL, the released code) and Continuum-Dy (the paper's dynamic TTL):
which finished calls pin their KV and for how long, the order of waiting calls, the
preemption victim and the order pins are dropped in; on the engine, a pinned context
survives another session's allocation that evicts it under FCFS, and a pin ends at
its TTL."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import LLMEnd, LLMFirstToken, LLMSubmit, SessionEnd, ToolEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.continuum import (
    Continuum,
    ContinuumDynamic,
    ContinuumDynamicEngine,
)
from agentmars.server.policies.interface import Pin, Release
from tests.server.policies.scenarios import calls, ends, evictions, run, session, turn
from tests.server.policies.views import (
    AdmissionData,
    CallData,
    EngineData,
    LinearCosts,
    PinData,
    SessionData,
    call,
)


def tool_end(tool: str, duration_s: float, session_id: str = "s") -> ToolEnd:
    return ToolEnd(session_id=session_id, call_id="tool", tool=tool, duration_s=duration_s)


def finished(next_tool: str | None, tokens: int = 1000) -> CallData:
    """A call that has just produced its answer, a call to ``next_tool``."""
    return call("s", next_tool=next_tool, prompt_tokens=tokens - 10, output_tokens=10)


# --- Continuum: fixed TTL ----------------------------------------------------------------


def test_ttl_follows_the_tools_mean_past_duration() -> None:
    policy, view = Continuum().engine(), EngineData()
    for tool, duration in [("grep", 1.0), ("grep", 3.0), ("build", 1.0), ("build", 4.0)]:
        policy.on_event(tool_end(tool, duration))
    policy.on_event(tool_end("ls", 0.5))
    assert policy.ttl(finished("ls"), view) == 2.0  # mean 0.5 <= 2
    assert policy.ttl(finished("grep"), view) == 2.0  # mean (1 + 3) / 2 = 2.0 <= 2
    assert policy.ttl(finished("build"), view) is None  # mean (1 + 4) / 2 = 2.5 > 2
    assert policy.ttl(finished("curl"), view) == 2.0  # never seen: pinned
    assert policy.ttl(finished(None), view) == 2.0  # tool not named: pinned
    assert policy.on_call_finished(finished("ls"), view) == Pin(2.0)
    assert policy.on_call_finished(finished("build"), view) == Release()


def test_the_ttl_setting_is_both_the_threshold_and_the_time() -> None:
    policy = Continuum(ttl_s=1.0).engine()
    policy.on_event(tool_end("grep", 1.5))
    policy.on_event(tool_end("ls", 1.0))
    assert policy.on_call_finished(finished("grep"), EngineData()) == Release()  # 1.5 > 1
    assert policy.on_call_finished(finished("ls"), EngineData()) == Pin(1.0)  # 1.0 <= 1


def test_pinned_sessions_go_first_then_by_session_arrival() -> None:
    policy = Continuum().engine()
    a = call("a", session_arrival_s=0.0, arrival_s=9.0)
    b = call("b", session_arrival_s=5.0, arrival_s=6.0)
    c = call("c", session_arrival_s=3.0, arrival_s=8.0)
    d = call("d", session_arrival_s=1.0, arrival_s=1.0)
    view = EngineData(pins=[PinData("b", 2, 32), PinData("c", 1, 16)])
    # Pinned: c (session 3.0), b (5.0); then unpinned by session arrival: a (0.0), d
    # (1.0), whatever the calls' own arrival.
    order = sorted([a, b, c, d], key=lambda x: policy.priority(x, view))
    assert [x.session_id for x in order] == ["c", "b", "a", "d"]


def test_the_victim_is_the_latest_session_not_on_its_last_step() -> None:
    policy = Continuum().engine()
    oldest = call("a", session_arrival_s=0.0, expects_tool=True)
    latest_last_step = call("b", session_arrival_s=2.0, expects_tool=False)
    middle = call("c", session_arrival_s=1.0, expects_tool=True)
    running = [oldest, latest_last_step, middle]
    # b arrived last but is on its last step: spared. Of a and c, c arrived later.
    assert policy.victim(running, EngineData(running=running)) is middle
    # All on their last step: the latest session.
    finals = [
        call("a", session_arrival_s=0.0, expects_tool=False),
        call("b", session_arrival_s=2.0, expects_tool=False),
    ]
    assert policy.victim(finals, EngineData(running=finals)) is finals[1]


def test_pins_are_dropped_latest_session_first() -> None:
    pins = [
        PinData("a", 4, 64, pinned_s=9.0, session_arrival_s=0.0),
        PinData("b", 1, 16, pinned_s=1.0, session_arrival_s=7.0),
        PinData("c", 2, 32, pinned_s=5.0, session_arrival_s=3.0),
    ]
    order = Continuum().engine().reclaim(pins, needed_blocks=2, view=EngineData(pins=pins))
    assert [p.session_id for p in order] == ["b", "c", "a"]


def test_what_each_half_needs() -> None:
    # Continuum has no admission control: its admission half is the default one (admit
    # every session, needing nothing). Its engine half learns tool durations from the
    # stream; the dynamic TTL also prices a reload with the engine's cost estimates.
    # Its order reads only the call and the pins, so an engine may keep it cached.
    for policy in (Continuum(), ContinuumDynamic()):
        admission = policy.admission()
        queue = [SessionData("a", prompt_tokens=10_000)]
        assert list(admission.admit(queue, AdmissionData())) == queue
        assert admission.needs == frozenset()
        assert policy.engine().priority_reads_pins_only
    assert Continuum().engine().needs == {Capability.TOOL_FIGURES}
    assert ContinuumDynamic().engine().needs == {Capability.TOOL_FIGURES, Capability.COSTS}


# --- Continuum-Dy: dynamic TTL -----------------------------------------------------------


def delayed_call(
    policy: ContinuumDynamicEngine, session_id: str, ttft_s: float, cached: int
) -> None:
    """Feed the stream of one call that follows a tool: submitted, first token after
    ``ttft_s``, ended with ``cached`` of its 100 prompt tokens found in the cache."""
    ids = {"session_id": session_id, "call_id": f"{session_id}/1"}
    policy.on_event(LLMSubmit(**ids, follows_tool=True))
    policy.on_event(LLMFirstToken(**ids, ttft_s=ttft_s))
    policy.on_event(LLMEnd(**ids, prompt_tokens=100, cached_tokens=cached, output_tokens=5))


def test_fixed_ttl_until_enough_samples() -> None:
    policy = ContinuumDynamic(min_samples=5).engine()
    for duration in (0.5, 1.0, 1.5, 3.0):
        policy.on_event(tool_end("t", duration))
    # 4 samples < 5: Continuum's rule (mean 1.5 <= 2 -> 2.0 s), whatever the CDF says.
    assert policy.ttl(finished("t"), EngineData()) == 2.0


def test_tau_star_is_the_argmax_of_the_expected_gain_minus_the_ttl() -> None:
    policy = ContinuumDynamic(min_samples=5).engine()
    for duration in (3.0, 0.5, 10.0, 1.5, 1.0):
        policy.on_event(tool_end("t", duration))
    delayed_call(policy, "x", ttft_s=2.0, cached=0)  # evicted (0 < 50): T = 2.0 s
    view = EngineData(costs=LinearCosts(prefill_s_per_token=0.001))
    # eta = 1 (no session has ended); PrefillReload = 1000 tokens x 1 ms = 1.0 s;
    # gain G = T x eta + reload = 2.0 + 1.0 = 3.0. Value of tau = P(d <= tau) x G - tau:
    #   tau 0: 0;  0.5: 1/5 x 3 - 0.5 = 0.1;  1.0: 2/5 x 3 - 1.0 = 0.2;
    #   1.5: 3/5 x 3 - 1.5 = 0.3;  3.0: 4/5 x 3 - 3.0 = -0.6;  10: 3 - 10 = -7.
    assert policy.queueing_delay() == 2.0
    assert policy.eta() == 1.0
    assert policy.ttl(finished("t"), view) == 1.5
    assert policy.on_call_finished(finished("t"), view) == Pin(1.5)


def test_no_pin_when_no_ttl_gains_more_than_it_holds() -> None:
    policy = ContinuumDynamic(min_samples=5).engine()
    for duration in (0.5, 1.0, 1.5, 3.0, 10.0):
        policy.on_event(tool_end("t", duration))
    view = EngineData(costs=LinearCosts(prefill_s_per_token=0.001))
    # No evicted call seen: T = 0, G = reload = 100 tokens x 1 ms = 0.1 s. Every
    # candidate loses (0.5: 0.02 - 0.5 < 0, ...): tau* = 0, no pin.
    short = finished("t", tokens=100)
    assert policy.ttl(short, view) is None
    assert policy.on_call_finished(short, view) == Release()


def test_a_tool_with_few_samples_uses_the_cdf_of_all_tools() -> None:
    policy = ContinuumDynamic(min_samples=2).engine()
    for tool, duration in [("t", 2.0), ("t", 2.0), ("u", 0.5)]:
        policy.on_event(tool_end(tool, duration))
    delayed_call(policy, "x", ttft_s=1.1, cached=0)
    view = EngineData(costs=LinearCosts(prefill_s_per_token=0.001))
    # G = T x eta + reload = 1.1 x 1 + 1.0 = 2.1.
    # t has 2 samples (= min_samples), so its own CDF {2, 2}: tau 2.0 -> 2.1 - 2 = 0.1
    #   > 0 -> 2.0 (the CDF of all tools would give 0.5, as below).
    # u has 1 sample, and a tool never seen none: the CDF of all tools {0.5, 2, 2}:
    #   tau 0.5 -> 1/3 x 2.1 - 0.5 = 0.2 beats tau 2.0 -> 2.1 - 2 = 0.1 -> 0.5.
    assert policy.ttl(finished("t"), view) == 2.0
    assert policy.ttl(finished("u"), view) == 0.5
    assert policy.ttl(finished("never-seen"), view) == 0.5


def test_queueing_delay_counts_only_calls_after_a_tool_whose_kv_was_evicted() -> None:
    policy = ContinuumDynamic().engine()
    delayed_call(policy, "x", ttft_s=2.0, cached=0)  # 0 < 50% of 100: counted
    delayed_call(policy, "y", ttft_s=9.0, cached=60)  # 60 >= 50: KV was kept
    first = {"session_id": "z", "call_id": "z/0"}  # not after a tool: not counted
    policy.on_event(LLMSubmit(**first, follows_tool=False))
    policy.on_event(LLMFirstToken(**first, ttft_s=7.0))
    policy.on_event(LLMEnd(**first, prompt_tokens=100, cached_tokens=0, output_tokens=5))
    assert policy.queueing_delay() == 2.0
    delayed_call(policy, "w", ttft_s=4.0, cached=49)  # 49 < 50: counted
    assert policy.queueing_delay() == 3.0  # (2 + 4) / 2


def test_calls_of_different_sessions_with_the_same_id_are_told_apart() -> None:
    # Call ids are unique within a session only (the SDK's CallEvent contract).
    policy = ContinuumDynamic().engine()
    one = {"session_id": "s1", "call_id": "c1"}
    two = {"session_id": "s2", "call_id": "c1"}
    policy.on_event(LLMSubmit(**one, follows_tool=True))
    policy.on_event(LLMSubmit(**two, follows_tool=True))
    policy.on_event(LLMFirstToken(**one, ttft_s=2.0))
    policy.on_event(LLMFirstToken(**two, ttft_s=4.0))
    policy.on_event(LLMEnd(**one, prompt_tokens=100, cached_tokens=0))
    assert policy.queueing_delay() == 2.0
    policy.on_event(LLMEnd(**two, prompt_tokens=100, cached_tokens=0))
    assert policy.queueing_delay() == 3.0


def test_eta_is_minus_the_correlation_of_turn_index_and_turns_left() -> None:
    policy = ContinuumDynamic().engine()
    assert policy.eta() == 1.0  # no finished session yet
    policy.on_event(SessionEnd(session_id="a", turns=1))
    policy.on_event(SessionEnd(session_id="b", turns=3))
    # Pairs (k, N - k): (0, 1) from a; (0, 3), (1, 2), (2, 1) from b.
    # k = [0, 0, 1, 2], mean 0.75; N - k = [1, 3, 2, 1], mean 1.75.
    # Sum of products of deviations: 0.5625 - 0.9375 + 0.0625 - 0.9375 = -1.25;
    # sums of squares: 2.75 and 2.75 -> Corr = -1.25 / 2.75 = -5/11, eta = 5/11.
    assert policy.eta() == pytest.approx(5 / 11)


def test_eta_of_sessions_of_one_length_is_one() -> None:
    policy = ContinuumDynamic().engine()
    policy.on_event(SessionEnd(session_id="a", turns=4))
    # (0, 4), (1, 3), (2, 2), (3, 1): N - k falls as k rises, Corr = -1.
    assert policy.eta() == pytest.approx(1.0)


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------

# a: a 30-token prompt, 3 tokens out, a 1 s tool, then 8 more tokens and 2 out.
# c, d: short one-call sessions (8-token prompts, 5 out) that end after a's first call.
# b: arrives during a's tool and needs 2 blocks (20-token prompt, 2 out).
# 4 blocks in all: a 2, c 1, d 1 at the start.
CROWDED = (
    session("a", turn(30, 3, tool_s=1.0), turn(8, 2)),
    session("c", turn(8, 5)),
    session("d", turn(8, 5)),
    session("b", turn(20, 2), arrival_s=0.5),
)


def test_fcfs_lets_another_session_evict_a_context_across_a_tool() -> None:
    record = run("fcfs", *CROWDED, blocks=4)
    # 0.03: a's first call ends with 32 computed tokens = 2 full blocks, released to
    #       the free queue (2nd block first). 0.05: c and d end, their blocks (never
    #       full, nothing cached) join the queue after a's.
    # 0.50: b takes the 2 blocks at the head of the queue: a's -> 2 evictions.
    # 1.03: a's 2nd call (41 tokens) finds nothing and computes all 41; ends at 1.05.
    assert evictions(record) == [(0.5, 2)]
    assert [c.cached_tokens for c in calls(record, "a")] == [0, 0]
    assert ends(record) == pytest.approx({"a": 1.05, "b": 0.52, "c": 0.05, "d": 0.05})
    # a: 30 + 2, c and d: 8 + 4 each, b: 20 + 1, a again: 41 + 1.
    assert record.computed_tokens == 32 + 12 + 12 + 21 + 42
    assert record.pinned_block_s == 0.0


@pytest.mark.parametrize("name", ["continuum", "continuum-dy"])
def test_continuum_keeps_the_context_across_a_short_tool(name: str) -> None:
    # Continuum-Dy has seen fewer than 100 tools here: it follows the fixed rule.
    record = run(name, *CROWDED, blocks=4)
    # 0.03: a's tool ("tool", never seen) is pinned for 2 s: its 2 full blocks stay
    #       off the free queue. 0.05: c's and d's blocks are the only free ones.
    # 0.50: b takes those 2 (not cached): no eviction.
    # 1.03: a's 2nd call finds its 32 pinned tokens (the pin ends at the admission,
    #       2 blocks x 1.0 s pinned), computes 9 and ends at 1.05 as under FCFS.
    assert evictions(record) == []
    assert [c.cached_tokens for c in calls(record, "a")] == [0, 32]
    assert record.pinned_block_s == pytest.approx(2 * 1.0)
    assert ends(record) == pytest.approx({"a": 1.05, "b": 0.52, "c": 0.05, "d": 0.05})
    assert record.computed_tokens == 32 + 12 + 12 + 21 + (9 + 1)


def test_a_pin_ends_at_its_ttl_and_long_tools_are_not_pinned() -> None:
    record = run(
        "continuum",
        session("a", turn(30, 3, tool_s=3.0), turn(8, 2, tool_s=1.0), turn(8, 2)),
    )
    # 0.03: 2 full blocks pinned for 2 s (the tool was never seen); the pin expires at
    #       2.03, before the next call (3.03): 2 blocks x 2 s = 4 block-seconds.
    # 3.03: the tool's mean duration is now 3.0 > 2: the 2nd call (ends 3.05) is not
    #       pinned, although this tool takes 1 s. Nothing else ran, so both later calls
    #       still find a's blocks in the prefix cache: 32 tokens (2nd call: 41-token
    #       prompt; 3rd: 51, with 42 computed tokens = 2 full blocks before it).
    assert record.pinned_block_s == pytest.approx(2 * 2.0)
    assert [c.cached_tokens for c in calls(record, "a")] == [0, 32, 32]
    assert ends(record) == pytest.approx({"a": 4.07})


def test_the_victim_is_the_call_not_on_its_last_step() -> None:
    record = run(
        "continuum",
        session("a", turn(24, 20, tool_s=0.5), turn(8, 2)),
        session("b", turn(24, 20)),
        blocks=4,
    )
    # As in FCFS's preemption case until 0.09, when a needs a 3rd block. FCFS would
    # preempt b (the newest); Continuum spares b, which is on its last step, and
    # preempts a itself (the only call that expects a tool).
    # 0.20: b ends; a is admitted again: its 1st block is still cached (16 tokens), 17
    #       computed (16 recomputed). 0.21: a's 10th token; 0.31: its 20th, its first
    #       call ends and pins 2 full blocks (43 computed tokens) for its 0.5 s tool.
    # 0.81: a's 2nd call (52 tokens) finds 32, computes 20: first token 0.82, end 0.83.
    assert ends(record) == pytest.approx({"a": 0.83, "b": 0.20})
    first, second = calls(record, "a")
    (b_call,) = calls(record, "b")
    assert (first.preemptions, first.recomputed_tokens) == (1, 16)
    assert b_call.preemptions == 0
    assert first.end_s == pytest.approx(0.31)
    assert second.cached_tokens == 32
    assert record.pinned_block_s == pytest.approx(2 * 0.5)
