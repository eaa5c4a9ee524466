"""ThunderAgent (TA) and ThunderAgent with an LRU CPU tier (TA+O): pause programs when
their contexts no longer fit (Acting before Reasoning, shortest first), restore them
Reasoning first, shortest first, and hold new programs back meanwhile."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import SessionEnd, ToolEnd, ToolStart
from agentmars.server.policies.interface import Pin, SessionAction
from agentmars.server.policies.thunderagent import ThunderAgent, ThunderAgentOffload
from tests.server.policies.scenarios import (
    calls,
    ends,
    evicted_before,
    evictions,
    run,
    session,
    turn,
)
from tests.server.policies.views import EngineData, PinData, SessionData, call


def acting(policy: ThunderAgent, *session_ids: str) -> None:
    for session_id in session_ids:
        policy.on_event(ToolStart(session_id=session_id, call_id="tool", tool="t"))


def pause(session_id: str) -> SessionAction:
    return SessionAction("pause", session_id)


def resume(session_id: str) -> SessionAction:
    return SessionAction("resume", session_id)


# Capacity 10 blocks x 16 = 160 tokens. A and B run a tool with pinned contexts of 48
# and 16 tokens; C and E are running (40 and 20 tokens); D's call waits with 60.
# Contexts: 48 + 16 + 40 + 60 + 20 = 184 > 160: thrashing, 24 tokens too many.
CROWDED = EngineData(
    total_blocks=10,
    pins=[PinData("A", 3, 48), PinData("B", 1, 16)],
    running=[call("C", prompt_tokens=30, output_tokens=10), call("E", prompt_tokens=20)],
    waiting=[call("D", prompt_tokens=60)],
)


def test_thrashing_pauses_acting_programs_first_shortest_first() -> None:
    policy = ThunderAgent()
    acting(policy, "A", "B")
    # Acting, shortest first: B (16) -> 8 too many; A (48) -> fits. E (20 tokens) is
    # shorter than A but Reasoning, so it keeps running.
    assert list(policy.tick(CROWDED)) == [pause("B"), pause("A")]


def test_without_acting_programs_the_shortest_reasoning_ones_go() -> None:
    policy = ThunderAgent()
    # No tool running: all five are Reasoning (the pins count as contexts all the
    # same). Shortest first: B 16 (8 too many), E 20 (fits).
    assert list(policy.tick(CROWDED)) == [pause("B"), pause("E")]


def test_a_call_replaces_its_sessions_pin_in_the_usage() -> None:
    policy = ThunderAgent()
    # D's pin (32 tokens) and its next call (60 tokens, waiting) are one context of 60:
    # 48 + 16 + 40 + 60 + 20 = 184, as before, not 216.
    view = EngineData(
        total_blocks=10,
        pins=[*CROWDED.pins, PinData("D", 2, 32)],
        running=CROWDED.running,
        waiting=CROWDED.waiting,
    )
    acting(policy, "A", "B")
    assert list(policy.tick(view)) == [pause("B"), pause("A")]


def test_no_thrashing_no_pause() -> None:
    policy = ThunderAgent()
    acting(policy, "A", "B")
    # Capacity 12 x 16 = 192 >= 184.
    assert list(policy.tick(EngineData(total_blocks=12, pins=CROWDED.pins))) == []


def test_restore_reasoning_first_shortest_first_while_it_fits() -> None:
    policy = ThunderAgent()
    acting(policy, "A", "B")
    assert list(policy.tick(CROWDED)) == [pause("B"), pause("A")]
    policy.on_event(ToolEnd(session_id="A", call_id="tool", tool="t", duration_s=1.0))
    # A's tool is done (Reasoning again), B's still runs (Acting). Room 50 tokens:
    # A (48) first although longer, then B (16) does not fit in the 2 left.
    room_50 = EngineData(total_blocks=10, running=[call("C", prompt_tokens=110)])
    assert list(policy.tick(room_50)) == [resume("A")]
    # Later, room 160: B comes back.
    assert list(policy.tick(EngineData(total_blocks=10))) == [resume("B")]
    assert list(policy.tick(EngineData(total_blocks=10))) == []


def test_new_programs_wait_while_any_program_is_paused() -> None:
    policy = ThunderAgent()
    acting(policy, "A", "B")
    policy.tick(CROWDED)
    queue = [SessionData("N", prompt_tokens=1)]
    assert list(policy.admit(queue, EngineData(total_blocks=100))) == []
    # The paused programs end: the queue moves again.
    policy.on_event(SessionEnd(session_id="A", turns=3))
    policy.on_event(SessionEnd(session_id="B", turns=3))
    assert list(policy.admit(queue, EngineData(total_blocks=100))) == queue


def test_new_programs_are_admitted_in_order_while_their_prompt_fits() -> None:
    policy = ThunderAgent()
    # Capacity 160, used 48 + 16 + 40 + 20 = 124 (pins and running calls): 36 left.
    view = EngineData(total_blocks=10, pins=CROWDED.pins, running=CROWDED.running)
    queue = [SessionData("X", 10), SessionData("Y", 30), SessionData("Z", 5)]
    # X (10) fits, 26 left; Y (30) does not and holds Z back (one global queue).
    assert list(policy.admit(queue, view)) == [queue[0]]


def test_every_finished_call_keeps_its_kv() -> None:
    assert ThunderAgent().on_call_finished(call("a"), EngineData()) == Pin()


def test_the_cpu_variant_keeps_evicted_blocks_in_an_lru_tier() -> None:
    policy = ThunderAgentOffload()
    assert policy.needs_cpu_tier and policy.offload_evicted
    assert not ThunderAgent().needs_cpu_tier


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------


def test_a_program_is_paused_under_thrashing_and_restored_later() -> None:
    record = run(
        ThunderAgent(check_interval_s=0.345),
        session("a", turn(20, 12, tool_s=0.1), turn(60, 20)),
        session("b", turn(20, 12, tool_s=0.2), turn(60, 20)),
        session("c", turn(16, 2), arrival_s=0.4),
        blocks=8,
    )
    # Capacity 8 x 16 = 128 tokens; checks at 0.345, 0.69, ...
    # 0.00: a and b admitted (20 each); first calls end at 0.12 with 31 computed tokens:
    #       1 full block pinned each. Tools: a until 0.22, b until 0.32.
    # 0.22: a's 2nd call (20 + 12 + 60 = 92 tokens: its pinned 16 + 5 new blocks, 6
    #       free) runs: first token 0.23, 20 tokens -> ends 0.42; at its 97th token it
    #       takes the last free block.
    # 0.32: b's 2nd call (92 tokens, 5 new blocks) finds none free and waits.
    # 0.345: a has 92 + 12 tokens, b's call waits with 92: 196 > 128, 68 too many. No
    #       tool runs; shortest first: b is paused (its pin dropped, its call held).
    # 0.40: c arrives and waits: a program is paused.
    # 0.69: nothing runs: b is restored (92 <= 128) and its call sent again; then c
    #       fits (16 <= 128 - 92). b still finds its 16 tokens (nothing reused that
    #       block): first token 0.70, end 0.89; c ends 0.71.
    assert ends(record) == pytest.approx({"a": 0.42, "b": 0.89, "c": 0.71})
    b_second = calls(record, "b")[1]
    assert b_second.submit_s == pytest.approx(0.69)
    assert b_second.cached_tokens == 16
    (c_session,) = [s for s in record.sessions if s.session_id == "c"]
    assert c_session.admitted_s == pytest.approx(0.69)
    # Pins: a's block 0.12-0.22, b's 0.12-0.345 (dropped by the pause).
    assert record.pinned_block_s == pytest.approx(0.1 + 0.225)


# a pins 2 blocks across a 1 s tool; b (32-token prompt, 20 out) arrives at 0.5 and
# needs a 3rd and 4th block while it decodes: the engine drops a's pin to get them.
SQUEEZED = (
    session("a", turn(30, 3, tool_s=1.0), turn(8, 2)),
    session("b", turn(32, 20), arrival_s=0.5),
)


@pytest.mark.parametrize(
    ("policy_class", "cached", "first_token_s", "end_s", "computed"),
    [
        # TA: a's evicted blocks are gone: its 2nd call (41 tokens) computes all 41.
        (ThunderAgent, 0, 1.04, 1.05, 41 + 1),
        # TA+O: they went to the CPU tier: 32 tokens found there, 2 blocks loaded in
        # 2 x 10 ms (ready 1.05), 9 computed: first token 1.06, end 1.07.
        (ThunderAgentOffload, 32, 1.06, 1.07, 9 + 1),
    ],
)
def test_evicted_blocks_are_recomputed_or_loaded_from_the_cpu_tier(
    policy_class: type[ThunderAgent],
    cached: int,
    first_token_s: float,
    end_s: float,
    computed: int,
) -> None:
    record = run(policy_class(), *SQUEEZED, blocks=4)
    # 0.03: a's first call ends, 32 computed tokens: 2 blocks pinned (Acting).
    # 0.50: b is admitted (its 32 tokens fit the 64 - 32 left) into the 2 free blocks.
    # 0.51: b's 33rd token needs a 3rd block: a's pin is dropped, b takes a's 2nd block
    #       (evicted); for its 49th token, a's 1st (evicted). b ends 0.70.
    assert evictions(record)[0] == (0.51, 1)
    assert evicted_before(record, 1.03) == 2
    assert record.pinned_block_s == pytest.approx(2 * (0.51 - 0.03))
    second = calls(record, "a")[1]
    assert second.cached_tokens == cached
    assert second.first_token_s == pytest.approx(first_token_s)
    assert ends(record) == pytest.approx({"a": end_s, "b": 0.70})
    # a: 30 + 2; b: 32 + 19; then a's 2nd call.
    assert record.computed_tokens == (30 + 2) + (32 + 19) + computed
