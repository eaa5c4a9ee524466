"""``agentserve`` (seed 002): each rule on a small case worked out by hand — the kind of
each call, Q_D and Q_P under the budget, Algorithm 1's control loop and its clamps,
the Green Context rounding, and the simulator's SM partition (a cold prefill beside
a decode does not slow the decode beyond its reserved share's step time)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentmars.sdk.events import LLMEnd, SessionEnd
from agentmars.server.policies.agentserve import AgentServe, AgentServeEngine
from agentmars.server.policies.agentserve.classify import Classified, Kind, Queue, queue_of
from agentmars.server.policies.agentserve.partition import green_context_share
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import EngineHalf, Policy
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost, Profile
from agentmars.server.sim.engine import SimEngine, SimError
from agentmars.server.workloads.model import Workload
from tests.server.policies.scenarios import calls, run, session, turn
from tests.server.policies.views import CallData, EngineData, LinearCosts, call

VIEW = EngineData()  # blocks of 16 tokens


def engine(**settings: float) -> AgentServeEngine:
    return AgentServe(**settings).engine()  # type: ignore[arg-type]


def ended(half: AgentServeEngine, session_id: str, prompt: int, output: int) -> None:
    """The stream tells the half that the session's call ended with this context."""
    half.on_event(
        LLMEnd(session_id=session_id, call_id="c", prompt_tokens=prompt, output_tokens=output)
    )


# --- classification ---------------------------------------------------------------------


def test_a_sessions_first_call_is_a_cold_prefill() -> None:
    half = engine()
    first = call("a", prompt_tokens=3000, follows_tool=False)
    assert half.classify(first, VIEW) == Classified(Kind.COLD, 3000)
    # A shared system prompt found in the cache does not make it a resume.
    assert half.classify(replace(first, cached_tokens=2048), VIEW).kind is Kind.COLD
    assert half.queue(first, VIEW) is Queue.PREFILL


def test_a_call_after_a_tool_with_its_context_cached_is_a_resume_prefill() -> None:
    half = engine()
    ended(half, "a", 3000, 40)  # context 3,040: 3,039 computed, 189 full blocks = 3,024
    after = call("a", 1, prompt_tokens=3100, follows_tool=True)
    # Waiting: the half expects the previous context's full blocks to hit.
    assert half.classify(after, VIEW) == Classified(Kind.RESUME, 3100 - 3024)
    # Admitted with them cached: a resume of the tokens past them.
    assert half.classify(replace(after, cached_tokens=3024), VIEW) == Classified(Kind.RESUME, 76)
    assert half.queue(after, VIEW) is Queue.DECODE


def test_a_call_whose_context_was_evicted_is_a_cold_prefill() -> None:
    half = engine()
    ended(half, "a", 3000, 40)
    after = call("a", 1, prompt_tokens=3100, follows_tool=True)
    # The engine's lookup found none of it, or only part of it: its context went.
    assert half.classify(replace(after, cached_tokens=0), VIEW) == Classified(Kind.COLD, 3100)
    assert half.classify(replace(after, cached_tokens=1024), VIEW) == Classified(Kind.COLD, 2076)
    assert half.queue(replace(after, cached_tokens=0), VIEW) is Queue.PREFILL


def test_without_the_sessions_history_a_cache_hit_after_a_tool_is_a_resume() -> None:
    half = engine()
    after = call("a", 1, prompt_tokens=500, follows_tool=True)
    assert half.classify(after, VIEW).kind is Kind.COLD  # waiting: nothing expected
    assert half.classify(replace(after, cached_tokens=448), VIEW) == Classified(Kind.RESUME, 52)
    # The session's end forgets what the stream said of it.
    ended(half, "b", 100, 10)
    half.on_event(SessionEnd(session_id="b"))
    assert half.contexts.tokens == {}


def test_a_running_call_past_its_prompt_is_a_decode() -> None:
    half = engine()
    decoding = call("a", prompt_tokens=100, output_tokens=3, num_computed_tokens=102)
    assert half.classify(decoding, VIEW) == Classified(Kind.DECODE, 0)
    assert half.queue(decoding, VIEW) is Queue.DECODE


def test_over_budget_resume_prefills_go_to_the_prefill_queue() -> None:
    # Algorithm 1 lines 13-17, at B_prefill = 64.
    assert queue_of(Classified(Kind.RESUME, 64), 64) is Queue.DECODE
    assert queue_of(Classified(Kind.RESUME, 65), 64) is Queue.PREFILL
    assert queue_of(Classified(Kind.COLD, 10), 64) is Queue.PREFILL
    assert queue_of(Classified(Kind.DECODE, 0), 0) is Queue.DECODE
    # Through the half: the default budget starts at B_max = 512.
    half = engine()
    ended(half, "a", 100, 12)  # 111 computed: 6 full blocks, 96 tokens expected cached
    long = call("a", 1, prompt_tokens=96 + 513, follows_tool=True, arrival_s=1.0)
    short = call("a", 1, prompt_tokens=96 + 512, follows_tool=True, arrival_s=2.0)
    cold = call("b", prompt_tokens=40, arrival_s=0.0)
    assert half.runs_with_decodes(short, VIEW) and not half.runs_with_decodes(long, VIEW)
    # Q_D first, then Q_P by arrival.
    ordered = sorted([cold, long, short], key=lambda c: half.priority(c, VIEW))
    assert ordered == [short, cold, long]


# --- Algorithm 1's control loop ------------------------------------------------------------

# One decoding call of 100 tokens; a decode step alone takes 10 ms (the baseline), so
# theta_low = 1.1 x 10 = 11 ms and theta_high = 1.5 x 10 = 15 ms.
DECODING = call("a", prompt_tokens=99, output_tokens=1, num_computed_tokens=99)
LOOP = EngineData(costs=LinearCosts(decode_step_s=0.01), running=[DECODING])


def measured(view: EngineData, steps: int, seconds: float) -> EngineData:
    """The view after ``steps`` more decode steps taking ``seconds`` in all."""
    return replace(
        view, decode_steps=view.decode_steps + steps, decode_time_s=view.decode_time_s + seconds
    )


def test_above_theta_high_the_budget_shrinks_and_the_decode_share_grows() -> None:
    half = engine()
    assert (half.control.b_prefill, half.decode_sm_share(LOOP)) == (512, 0.2)
    view = measured(LOOP, 10, 0.2)  # TPOT_step = 0.2 / 10 = 20 ms > 15 ms
    half.tick(view)
    last = half.control.last
    assert last is not None and last.action == "protect"
    assert last.tpot_s == pytest.approx(0.02)
    assert (last.theta_low_s, last.theta_high_s) == (pytest.approx(0.011), pytest.approx(0.015))
    assert (half.control.b_prefill, half.decode_sm_share(view)) == (448, 0.3)
    # Eight more protective intervals: 448 - 8 x 64 < 32 stops at B_min; R_min 1.0 = S.
    for _ in range(8):
        view = measured(view, 10, 0.2)
        half.tick(view)
    assert (half.control.b_prefill, half.control.r_min) == (32, 1.0)
    assert half.decode_sm_share(view) == 1.0


def test_below_theta_low_both_relax_to_b_max_and_r_base() -> None:
    half = engine()
    half.control.b_prefill, half.control.r_min = 100, 0.5
    view = measured(LOOP, 10, 0.1)  # 10 ms < 11 ms
    half.tick(view)
    assert (half.control.b_prefill, half.control.r_min) == (164, 0.4)
    for _ in range(10):
        view = measured(view, 10, 0.1)
        half.tick(view)
    assert (half.control.b_prefill, half.control.r_min) == (512, 0.2)


def test_the_static_split_never_moves_the_budget_or_the_share() -> None:
    half = make_policy("agentserve-static").engine()
    view = LOOP
    for _ in range(5):
        view = measured(view, 10, 0.2)  # 20 ms: AgentServe would protect
        half.tick(view)
    assert (half.control.b_prefill, half.decode_sm_share(view)) == (512, 0.2)


def test_between_the_thresholds_both_hold() -> None:
    half = engine()
    half.control.b_prefill, half.control.r_min = 256, 0.5
    half.tick(measured(LOOP, 4, 0.052))  # 13 ms, between 11 and 15
    assert half.control.last is not None and half.control.last.action == "hold"
    assert (half.control.b_prefill, half.control.r_min) == (256, 0.5)


def test_an_interval_without_decode_steps_relaxes() -> None:
    half = engine()
    half.control.b_prefill, half.control.r_min = 32, 1.0
    half.tick(LOOP)  # no decode step since the start
    assert (half.control.b_prefill, half.control.r_min) == (96, 0.9)


def test_absolute_thresholds_and_a_learned_baseline_without_costs() -> None:
    half = engine(theta_low_s=0.005, theta_high_s=0.008)
    half.tick(measured(LOOP, 2, 0.02))  # 10 ms > 8 ms
    assert half.control.last is not None and half.control.last.action == "protect"
    # No cost model: the baseline is the lowest TPOT_step seen (20 ms, then 10 ms).
    half = engine()
    view = replace(LOOP, has_costs=False)
    view = measured(view, 1, 0.02)
    half.tick(view)  # 20 ms against itself: below 1.1 x 20, relax
    assert half.control.last is not None and half.control.last.action == "relax"
    view = measured(view, 1, 0.01)
    half.tick(view)  # 10 ms is the new lowest
    view = measured(view, 1, 0.016)
    half.tick(view)  # 16 ms > 1.5 x 10
    assert half.control.last.action == "protect"


def test_the_reservation_is_rounded_up_to_the_next_green_context() -> None:
    assert green_context_share(0.37) == 0.4  # seed 002 §III-C's example
    assert green_context_share(0.2 + 0.1) == 0.3  # 0.30000000000000004 is 30%
    assert green_context_share(0.0) == 0.1
    assert green_context_share(1.0) == 1.0
    assert green_context_share(0.3, contexts=4) == 0.5


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="b_min"):
        AgentServe(b_min=600)
    with pytest.raises(ValueError, match="together"):
        AgentServe(theta_high_s=0.05)
    with pytest.raises(ValueError, match="share"):
        AgentServe(r_base=1.5)
    policy = make_policy("agentserve:b_max=256:delta_r=0.2")
    assert policy.settings()["b_max"] == 256 and policy.settings()["delta_r"] == 0.2


# --- the SM partition in the simulator ------------------------------------------------------

# A step costs 10 ms plus 1 ms a prompt token on the whole GPU; on half the SMs a
# decode runs at 0.8 of its whole-GPU rate and a prefill at 0.5.
CURVES = {
    "decode": ((0.5, 0.8), (1.0, 1.0)),
    "cold_prefill": ((0.5, 0.5), (1.0, 1.0)),
    "resume_prefill": ((0.5, 0.6), (1.0, 1.0)),
}


def curved_profile(curves: bool = True) -> Profile:
    return Profile(
        name="hand-sm",
        description="10 ms steps plus 1 ms a prompt token, with SM-share curves",
        sources=["tests/server/policies/test_agentserve.py"],
        block_size=16,
        num_gpu_blocks=64,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        kv_bytes_per_token=1,
        cpu_kv_blocks=0,
        cpu_kv_bandwidth_bytes_s=1600.0,
        cost=FittedCost(c0=0.01, c1=0.001, c2=0.0, c3=0.0, c4=0.0),
        sm_share_curves=CURVES if curves else {},
    )


def two_sessions(policy: Policy | str, profile: Profile) -> SimEngine:
    """ "a" decodes 200 tokens after a 16-token prompt; "b" arrives at 0.1 s with a
    400-token cold prompt (one chunk: the budget is 512 tokens a step, a's decode
    included) and answers in 2 tokens."""
    workload = Workload(
        name="hand",
        sessions=(
            session("a", turn(16, 200)),
            session("b", turn(400, 2), arrival_s=0.1),
        ),
    )
    chosen = make_policy(policy) if isinstance(policy, str) else policy
    return SimEngine(workload, chosen, profile)


# Half the SMs for decoding all run long; the first tick (at 1,000 s) never comes.
HALF = "agentserve:r_base=0.5:control_interval_s=1000"


def test_a_cold_prefill_does_not_slow_a_decode_beyond_its_shares_step_time() -> None:
    sim = two_sessions(HALF, curved_profile())
    record = sim.run()
    (a,) = calls(record, "a")
    (b,) = calls(record, "b")
    # a's prompt is a cold prefill, alone on the prefill half: (10 + 16) ms / 0.5.
    assert a.first_token_s == pytest.approx(0.052)
    # Every decode step, those beside b's 400-token prefill included: 10 ms / 0.8.
    assert a.tpot_s == pytest.approx(0.0125)
    assert record.decode_time_s / record.decode_steps == pytest.approx(0.0125)
    # b waits for a's step in flight (a's steps end at 0.052 + k x 12.5 ms: 0.102),
    # then its prefill runs on the other half: (10 + 400) ms / 0.5 = 0.82 s.
    assert b.first_token_s - b.submit_s == pytest.approx(0.102 + 0.82 - 0.1)


def test_in_one_shared_step_the_cold_prefill_stalls_the_decode() -> None:
    # FCFS (and agentserve on a profile without curves): one step holds a's decode and
    # b's prefill, 10 + 400 ms, so a's mean TPOT rises well above 10 ms.
    shared = calls(two_sessions("fcfs", curved_profile()).run(), "a")[0]
    alone = calls(two_sessions(HALF, curved_profile(curves=False)).run(), "a")[0]
    assert shared.tpot_s == pytest.approx(alone.tpot_s)
    # 198 steps of 10 ms and one of 410 ms over 199 intervals.
    assert shared.tpot_s == pytest.approx((198 * 0.01 + 0.41) / 199)


def test_agentserve_runs_without_curves_and_a_policy_needing_them_is_refused() -> None:
    # No curves: agentserve only uses the partition, and runs without it.
    record = run("agentserve", session("a", turn(16, 5, tool_s=0.1), turn(16, 5)))
    assert [c.output_tokens for c in calls(record, "a")] == [5, 5]

    class NeedsPartition(EngineHalf):
        needs = frozenset({Capability.SM_PARTITION})

    class Partitioned(Policy):
        name = "needs-partition"

        def engine(self) -> EngineHalf:
            return NeedsPartition()

    with pytest.raises(SimError, match="sm-partition"):
        two_sessions(Partitioned(), curved_profile(curves=False))
    two_sessions(Partitioned(), curved_profile())  # with curves it starts


def test_short_resume_prefills_run_with_the_decodes_long_ones_beside_them() -> None:
    sim = two_sessions(HALF, curved_profile())
    half = sim.engine_half
    assert isinstance(half, AgentServeEngine)
    ended(half, "a", 100, 12)
    short = CallData("a/1", "a", 1, prompt_tokens=96 + 40, follows_tool=True)
    engine = sim.replicas[0]
    assert half.runs_with_decodes(short, engine)
    assert not half.runs_with_decodes(replace(short, prompt_tokens=96 + 600), engine)


def test_the_vllm_plugin_never_claims_the_sm_partition_and_agentserve_starts_there() -> None:
    from agentmars.server.engines.vllm.plugin_config import PluginConfig
    from agentmars.server.policies.capabilities import refuse_unless

    config = PluginConfig.from_env(
        {"AGENTMARS_PROFILE": "rtx-a5000-qwen2.5-7b", "AGENTMARS_HINTS_ADDR": "tcp://x:1"}
    )
    assert Capability.SM_PARTITION not in config.provides()
    half = AgentServe().engine()
    refuse_unless("agentserve", half.needs, config.provides(), "the vLLM plugin")
