"""ThunderAgent (TA) and ThunderAgent with an LRU CPU tier (TA+O): pause programs when
their contexts no longer fit (Acting before Reasoning, shortest first), restore them
Reasoning first, shortest first, and hold new programs back meanwhile."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMFirstToken,
    SessionEnd,
    SessionPause,
    SessionResume,
    ToolEnd,
    ToolStart,
)
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import Pin, SessionAction
from agentmars.server.policies.thunderagent import (
    ThunderAgent,
    ThunderAgentAdmission,
    ThunderAgentEngine,
    ThunderAgentOffload,
)
from tests.server.policies.scenarios import (
    calls,
    ends,
    evicted_before,
    evictions,
    run,
    session,
    turn,
)
from tests.server.policies.views import (
    AdmissionData,
    EngineData,
    PinData,
    SessionData,
    call,
    kv_stats,
)


def acting(policy: ThunderAgentEngine, *session_ids: str) -> None:
    for session_id in session_ids:
        policy.on_event(ToolStart(session_id=session_id, call_id="tool", tool="t"))


def pause(session_id: str) -> SessionAction:
    return SessionAction("pause", session_id)


def resume(session_id: str) -> SessionAction:
    return SessionAction("resume", session_id)


# --- the engine half: pause and restore --------------------------------------------------

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
    policy = ThunderAgent().engine()
    acting(policy, "A", "B")
    # Acting, shortest first: B (16) -> 8 too many; A (48) -> fits. E (20 tokens) is
    # shorter than A but Reasoning, so it keeps running.
    assert list(policy.tick(CROWDED)) == [pause("B"), pause("A")]


def test_without_acting_programs_the_shortest_reasoning_ones_go() -> None:
    policy = ThunderAgent().engine()
    # No tool running: all five are Reasoning (the pins count as contexts all the
    # same). Shortest first: B 16 (8 too many), E 20 (fits).
    assert list(policy.tick(CROWDED)) == [pause("B"), pause("E")]


def test_a_call_replaces_its_sessions_pin_in_the_usage() -> None:
    policy = ThunderAgent().engine()
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
    policy = ThunderAgent().engine()
    acting(policy, "A", "B")
    # Capacity 12 x 16 = 192 >= 184.
    assert list(policy.tick(EngineData(total_blocks=12, pins=CROWDED.pins))) == []


def test_restore_reasoning_first_shortest_first_while_it_fits() -> None:
    policy = ThunderAgent().engine()
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


def test_a_paused_program_that_ends_is_not_restored() -> None:
    policy = ThunderAgent().engine()
    acting(policy, "A", "B")
    assert list(policy.tick(CROWDED)) == [pause("B"), pause("A")]
    policy.on_event(SessionEnd(session_id="B", turns=2))
    # Room 160: only A (48) is still paused.
    assert list(policy.tick(EngineData(total_blocks=10))) == [resume("A")]


def test_every_finished_call_keeps_its_kv() -> None:
    assert ThunderAgent().engine().on_call_finished(call("a"), EngineData()) == Pin()


def test_the_check_interval_is_the_engine_halfs_tick() -> None:
    assert ThunderAgent().engine().tick_interval_s == 5.0  # the paper's 5 s
    assert ThunderAgent(check_interval_s=0.5).engine().tick_interval_s == 0.5
    assert ThunderAgentOffload(check_interval_s=2.0).engine().tick_interval_s == 2.0


def test_what_each_half_needs() -> None:
    # The engine half pauses and restores on its tick and tells Acting from Reasoning
    # by the tool events; the admission half reads the engine's KV figures.
    engine = ThunderAgent().engine()
    assert engine.needs == {Capability.TICK, Capability.PAUSE, Capability.TOOL_FIGURES}
    assert ThunderAgent().admission().needs == {Capability.KV_FIGURES}
    assert ThunderAgentOffload().admission().needs == {Capability.KV_FIGURES}


def test_the_cpu_variant_keeps_evicted_blocks_in_an_lru_tier() -> None:
    policy = ThunderAgentOffload().engine()
    assert Capability.CPU_TIER in policy.needs and policy.offload_evicted
    assert Capability.CPU_TIER not in ThunderAgent().engine().needs
    assert not ThunderAgent().engine().offload_evicted


# --- the admission half: decided from the stream --------------------------------------


def figures(half: ThunderAgentAdmission, free_blocks: int, total_blocks: int = 10) -> AdmissionData:
    """The engine's KV figures reach the gateway: a ``kv_stats`` event goes through the
    half's ``on_event`` and becomes the view's newest figures."""
    stats: KVStats = kv_stats(free_blocks, total_blocks=total_blocks)
    half.on_event(stats)
    return AdmissionData(kv=stats)


def test_nothing_is_admitted_before_any_kv_figures_arrive() -> None:
    half = ThunderAgent().admission()
    queue = [SessionData("N", prompt_tokens=1)]
    assert list(half.admit(queue, AdmissionData(kv=None))) == []
    assert list(half.admit(queue, figures(half, free_blocks=10))) == queue


def test_new_programs_wait_while_the_stream_says_a_program_is_paused() -> None:
    policy = ThunderAgent()
    engine, half = policy.engine(), policy.admission()
    acting(engine, "A", "B")
    actions = list(engine.tick(CROWDED))
    assert actions == [pause("B"), pause("A")]
    queue = [SessionData("N", prompt_tokens=1)]
    # 100 free blocks: room for N. The halves share nothing: until the engine's pauses
    # come through the stream, the admission half does not know of them.
    view = figures(half, free_blocks=100, total_blocks=100)
    assert list(half.admit(queue, view)) == queue
    # The engine publishes a session_pause for each pause it made.
    for action in actions:
        half.on_event(SessionPause(session_id=action.session_id))
    assert list(half.admit(queue, view)) == []
    # A resumes, B is still paused: the queue still waits.
    half.on_event(SessionResume(session_id="A"))
    assert list(half.admit(queue, view)) == []
    # B's pause ends with its session: the queue moves again. (Only N's first admission
    # has been counted against these figures: 1 token of 1600.)
    half.on_event(SessionEnd(session_id="B", turns=3))
    assert list(half.admit(queue, view)) == queue


def test_a_resume_or_end_of_another_program_does_not_lift_a_pause() -> None:
    half = ThunderAgent().admission()
    view = figures(half, free_blocks=100, total_blocks=100)
    queue = [SessionData("N", prompt_tokens=1)]
    half.on_event(SessionPause(session_id="A"))
    half.on_event(SessionResume(session_id="X"))
    half.on_event(SessionEnd(session_id="Y", turns=1))
    assert list(half.admit(queue, view)) == []
    # A paused twice is one paused program: one resume lifts it.
    half.on_event(SessionPause(session_id="A"))
    half.on_event(SessionResume(session_id="A"))
    assert list(half.admit(queue, view)) == queue


def test_new_programs_are_admitted_in_order_while_their_prompt_fits() -> None:
    half = ThunderAgent().admission()
    # The engine's figures: 10 blocks, 9 used (A's pin 3, B's 1, C's 40 tokens 3, E's
    # 20 tokens 2): 1 free block = 16 tokens of room.
    view = figures(half, free_blocks=1)
    queue = [SessionData("X", 10), SessionData("Y", 30), SessionData("Z", 5)]
    # X (10) fits, 6 left; Y (30) does not and holds Z back (one global queue), although
    # Z (5) alone would fit in the 6.
    assert list(half.admit(queue, view)) == [queue[0]]


def test_admitted_prompts_count_until_their_first_token() -> None:
    half = ThunderAgent().admission()
    # 4 free blocks = 64 tokens.
    view = figures(half, free_blocks=4)
    p, q, r = SessionData("P", 40), SessionData("Q", 30), SessionData("R", 24)
    assert list(half.admit([p], view)) == [p]  # 40 <= 64; 24 left
    # Same figures: P's 40 tokens do not show in them yet. Q (30) > 64 - 40 = 24.
    assert list(half.admit([q], view)) == []
    # R (24) fits exactly in what is left: 24 <= 24; then 0 left.
    assert list(half.admit([r], view)) == [r]
    assert list(half.admit([SessionData("S", 1)], view)) == []
    # New figures that do not show P and R yet (they wait in the engine, unallocated):
    # 4 free blocks = 64 tokens, less P's 40 and R's 24 still not started: nothing fits.
    view = figures(half, free_blocks=4)
    assert list(half.admit([q], view)) == []
    # P's first token: its blocks are the engine's now. New figures with 2 free blocks
    # (32 tokens), less R's 24 still not started: 8 left. Q (30) waits, T (8) fits.
    half.on_event(LLMFirstToken(session_id="P", call_id="c", ttft_s=0.1))
    view = figures(half, free_blocks=2)
    assert list(half.admit([q], view)) == []
    assert list(half.admit([SessionData("T", 8)], view)) == [SessionData("T", 8)]
    # R's session ends before it started: its 24 tokens are free again.
    half.on_event(SessionEnd(session_id="R"))
    assert list(half.admit([SessionData("U", 24)], view)) == [SessionData("U", 24)]


def test_the_block_size_turns_free_blocks_into_tokens() -> None:
    half = ThunderAgent().admission()
    # 3 free blocks of 32 tokens = 96 tokens: A (64) fits, 32 left; B (33) does not.
    stats = kv_stats(free_blocks=3, total_blocks=8)
    half.on_event(stats)
    view = AdmissionData(block_size=32, kv=stats)
    queue = [SessionData("A", 64), SessionData("B", 33)]
    assert list(half.admit(queue, view)) == [queue[0]]


def test_each_admission_half_keeps_its_own_state() -> None:
    # Two halves of one policy (two gateways, or a gateway restarted): a pause or an
    # admission one of them saw is not in the other.
    policy = ThunderAgent()
    first, second = policy.admission(), policy.admission()
    first.on_event(SessionPause(session_id="A"))
    queue = [SessionData("N", 16)]
    assert list(first.admit(queue, figures(first, free_blocks=1))) == []
    assert list(second.admit(queue, figures(second, free_blocks=1))) == queue


# --- on the simulated engine (10 ms steps, 16-token blocks; see scenarios.py) ----------


class HeardAdmission(ThunderAgentAdmission):
    """ThunderAgent's admission half, noting the pauses and resumes it hears."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[tuple[str, str, float]] = []

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, SessionPause | SessionResume):
            self.heard.append((event.kind, event.session_id, event.mono_ns / 1e9))
        super().on_event(event)


class HeardThunderAgent(ThunderAgent):
    """ThunderAgent whose admission half is kept for the test to look at."""

    def admission(self) -> HeardAdmission:
        self.half = HeardAdmission()
        return self.half


def test_a_program_is_paused_under_thrashing_and_restored_later() -> None:
    policy = HeardThunderAgent(check_interval_s=0.345)
    record = run(
        policy,
        session("a", turn(20, 12, tool_s=0.1), turn(60, 20)),
        session("b", turn(20, 12, tool_s=0.2), turn(60, 20)),
        session("c", turn(16, 2), arrival_s=0.4),
        blocks=8,
    )
    # Capacity 8 x 16 = 128 tokens; checks at 0.345, 0.69, ...; KV figures reach the
    # admission half at multiples of 0.1 s after they change.
    # 0.00: the first figures: 8 free blocks = 128 tokens. a and b admitted (20 + 20 =
    #       40 <= 128); first calls end at 0.12 with 31 computed tokens: 1 full block
    #       pinned each. Tools: a until 0.22, b until 0.32.
    # 0.22: a's 2nd call (20 + 12 + 60 = 92 tokens: its pinned 16 + 5 new blocks, 6
    #       free) runs: first token 0.23, 20 tokens -> ends 0.42; at its 97th token it
    #       takes the last free block.
    # 0.32: b's 2nd call (92 tokens, 5 new blocks) finds none free and waits.
    # 0.345: a has 92 + 12 tokens, b's call waits with 92: 196 > 128, 68 too many. No
    #       tool runs; shortest first: b is paused (its pin dropped, its call held),
    #       and the engine publishes a session_pause.
    # 0.40: c arrives and waits: the stream says a program is paused.
    # 0.50: the figures show all 8 blocks free (a ended at 0.42, b's pin was dropped),
    #       but b is still paused: c still waits.
    # 0.69: nothing runs: b is restored (92 <= 128), its held call goes back to the
    #       engine (sent at 0.32: its TTFT counts from there), and the engine
    #       publishes a session_resume; then c fits the newest figures (those
    #       of 0.50: 128 tokens, nothing admitted since): 16 <= 128. b still finds its
    #       16 tokens (nothing reused that block): first token 0.70, end 0.89; c ends
    #       0.71.
    assert ends(record) == pytest.approx({"a": 0.42, "b": 0.89, "c": 0.71})
    b_second = calls(record, "b")[1]
    assert b_second.submit_s == pytest.approx(0.32)
    assert b_second.first_token_s == pytest.approx(0.70)
    assert b_second.cached_tokens == 16
    (c_session,) = [s for s in record.sessions if s.session_id == "c"]
    assert c_session.admitted_s == pytest.approx(0.69)
    # Pins: a's block 0.12-0.22, b's 0.12-0.345 (dropped by the pause).
    assert record.pinned_block_s == pytest.approx(0.1 + 0.225)
    # What the admission half learnt of the engine's pause and resume, from the stream.
    heard = policy.half.heard
    assert [(kind, session_id) for kind, session_id, _ in heard] == [
        ("session_pause", "b"),
        ("session_resume", "b"),
    ]
    assert [time for _, _, time in heard] == pytest.approx([0.345, 0.69])


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
    # 0.10: the figures show a's pin: 2 free blocks = 32 tokens.
    # 0.50: b is admitted (its 32 tokens fit those 32) into the 2 free blocks.
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


def test_a_prompt_larger_than_the_whole_cache_does_not_hold_the_queue() -> None:
    # 10 blocks of 16 tokens: 160 tokens in all, 16 free. G (161 tokens) can never fit:
    # it goes through (the engine refuses it with its own 4xx) and counts against
    # nothing, so Y behind it is admitted as soon as it fits.
    half = ThunderAgent().admission()
    view = figures(half, free_blocks=1)
    giant, small = SessionData("G", 161), SessionData("Y", 16)
    assert list(half.admit([giant, small], view)) == [giant, small]
    # A prompt that fits the whole cache but not the free part still waits its turn.
    assert list(half.admit([SessionData("Z", 160)], figures(half, free_blocks=1))) == []


def test_a_program_admitted_again_is_counted_once() -> None:
    half = ThunderAgent().admission()
    view = figures(half, free_blocks=4)  # 64 tokens
    p = SessionData("P", 40)
    assert list(half.admit([p], view)) == [p]
    half.on_event(SessionEnd(session_id="P"))
    assert list(half.admit([p], view)) == [p]  # its first admission no longer counts
    assert list(half.admit([SessionData("T", 24)], view)) == [SessionData("T", 24)]
