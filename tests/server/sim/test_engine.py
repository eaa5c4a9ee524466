"""The simulated engine on scenarios worked out by hand, and its invariants as
properties over random small workloads."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentmars.sdk.events import AnyEvent, KVStats, ToolEnqueue, ToolStats
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import AdmissionHalf, EngineHalf, Policy
from agentmars.server.policies.registry import make_policy
from agentmars.server.policies.views import CallView, EngineView
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine, SimError, isolated_sessions
from tests.server.sim.factories import STEP_S, flat_profile, session, workload


def run(*sessions, policy="fcfs", profile=None, config=None, **fields):
    engine = SimEngine(
        workload(*sessions, **fields), make_policy(policy), profile or flat_profile(), config
    )
    return engine, engine.run()


def test_one_turn_takes_one_prefill_step_then_one_step_per_token() -> None:
    # 100-token prompt in one step (budget 256) gives the first token at 10 ms; the
    # other 4 tokens take one decode step each: the last at 50 ms.
    engine, record = run(session("a", [(100, 5, None)]))
    (call,) = record.sessions[0].calls
    assert call.first_token_s == pytest.approx(STEP_S)
    assert call.end_s == pytest.approx(5 * STEP_S)
    assert record.sessions[0].latency_s == pytest.approx(5 * STEP_S)
    assert record.steps == 5
    # KV computed: the 100 prompt tokens, then the 4 generated tokens fed back (the
    # 5th token's KV is never computed).
    assert record.computed_tokens == 104
    assert engine.kv.pool.num_free == engine.kv.pool.num_blocks


def test_prompt_is_computed_in_budget_sized_chunks() -> None:
    # 600 tokens at 256 per step: 256, 256, 88 -> first token after 3 steps.
    _, record = run(session("a", [(600, 1, None)]))
    assert record.sessions[0].calls[0].first_token_s == pytest.approx(3 * STEP_S)
    assert record.steps == 3


def test_next_turn_reuses_the_cached_prefix_after_a_tool() -> None:
    # Turn 0: 100 + 5 tokens, done at 50 ms; KV computed for 104 tokens = 6 full blocks.
    # Tool 1 s -> turn 1 submitted at 1.05 s with prompt 105 + 50 = 155; 96 tokens hit,
    # 59 computed in one step -> first token 1.06 s; 2 more tokens -> end 1.08 s.
    _, record = run(session("a", [(100, 5, 1.0), (50, 3, None)]))
    _, second = record.sessions[0].calls
    tool = record.sessions[0].tools[0]
    assert (tool.start_s, tool.end_s) == (pytest.approx(0.05), pytest.approx(1.05))
    assert second.prompt_tokens == 155
    assert second.cached_tokens == 96
    assert second.first_token_s == pytest.approx(1.06)
    assert second.end_s == pytest.approx(1.08)
    assert record.prefix_queries == 100 + 155
    assert record.prefix_hits == 96


def test_waiting_call_blocks_the_queue_until_its_whole_prompt_fits() -> None:
    # 4 blocks of 16 tokens. "a" holds 3 blocks (40-token prompt + 8 generated) until
    # it ends at 80 ms; "b" (40 tokens, 3 blocks) fits only once "a" is gone (vLLM
    # admits a call only when its whole prompt fits), so it starts at 80 ms.
    profile = flat_profile(num_gpu_blocks=4, max_model_len=64)
    _, record = run(session("a", [(40, 8, None)]), session("b", [(40, 8, None)]), profile=profile)
    ends = {s.session_id: s.end_s for s in record.sessions}
    assert ends["a"] == pytest.approx(8 * STEP_S)
    b_call = next(s for s in record.sessions if s.session_id == "b").calls[0]
    assert b_call.first_token_s == pytest.approx(9 * STEP_S)
    assert record.preemptions == 0


def test_newest_running_call_is_preempted_and_recomputed_when_kv_runs_out() -> None:
    # 5 blocks. a and b (prompt 30, 2 blocks each) both start at once. Each needs a 3rd
    # block once it reaches 33 tokens (step 4) -> 1 block left... a takes it; b, the
    # newest, cannot grow: it is preempted (its blocks return to the cache) and comes
    # back when a has finished.
    profile = flat_profile(num_gpu_blocks=5, max_model_len=80)
    _, record = run(session("a", [(30, 40, None)]), session("b", [(30, 40, None)]), profile=profile)
    calls = {s.session_id: s.calls[0] for s in record.sessions}
    assert calls["a"].preemptions == 0
    assert calls["b"].preemptions >= 1
    assert record.preemptions == calls["b"].preemptions
    # Everything b computed before its preemption and did not find again is redone.
    assert calls["b"].recomputed_tokens > 0
    total = sum(
        c.prompt_tokens + c.output_tokens - 1 - c.cached_tokens + c.recomputed_tokens
        for c in calls.values()
    )
    assert record.computed_tokens == total


def test_tools_share_the_host_cores_when_oversubscribed() -> None:
    # Two 1 s tools asking for one core each on one core run at half speed: 2 s each.
    config = SimConfig(tool_cores=1)
    sessions = [session(name, [(20, 1, 1.0), (5, 1, None)], tool_cpu_s=1.0) for name in ("a", "b")]
    _, record = run(*sessions, config=config)
    for s in record.sessions:
        assert s.tools[0].end_s - s.tools[0].start_s == pytest.approx(2.0)
    assert record.tool_busy_core_s == pytest.approx(2.0)


def test_the_agents_work_on_the_tool_cores_slows_the_tools() -> None:
    # One tool core; each call's end leaves its agent 2 CPU-seconds of work there.
    # Call 1 ends at 10 ms: the agent's work and the 10 s core-bound tool share the
    # core at half speed until the work is done (4 s later, 2 s of the tool done), then
    # the tool's last 8 s at full speed: 12 s instead of 10. The last call's work slows
    # nothing and the session ends with its call.
    sessions = [session("a", [(20, 1, 10.0), (5, 1, None)], tool_cpu_s=10.0)]
    _, alone = run(*sessions, config=SimConfig(tool_cores=1))
    _, shared = run(*sessions, config=SimConfig(tool_cores=1, agent_cpu_s=2.0))
    assert alone.sessions[0].tools[0].end_s - alone.sessions[0].tools[0].start_s == (
        pytest.approx(10.0)
    )
    (tool,) = shared.sessions[0].tools
    assert tool.end_s - tool.start_s == pytest.approx(12.0)
    assert shared.sessions[0].end_s == pytest.approx(alone.sessions[0].end_s + 2.0)
    assert shared.tool_busy_core_s == pytest.approx(10.0)


@pytest.mark.parametrize("agent_cpu_s", [-1.0, math.inf, math.nan])
def test_agent_cpu_must_be_finite_and_not_negative(agent_cpu_s: float) -> None:
    with pytest.raises(SimError, match="agent_cpu_s"):
        SimConfig(agent_cpu_s=agent_cpu_s)


def test_tool_slots_queue_tools_in_arrival_order() -> None:
    config = SimConfig(tool_slots=1)
    sessions = [session(name, [(20, 1, 1.0), (5, 1, None)]) for name in ("a", "b")]
    _, record = run(*sessions, config=config)
    tools = sorted((s.tools[0] for s in record.sessions), key=lambda t: t.start_s)
    assert tools[0].queue_s == pytest.approx(0.0)
    assert tools[1].start_s == pytest.approx(tools[0].end_s)


def test_closed_loop_keeps_concurrency_sessions_in_flight() -> None:
    sessions = [session(f"s{i}", [(20, 3, None)], arrival_s=100.0) for i in range(3)]
    _, record = run(*sessions, arrival="closed", concurrency=1)
    # arrival_s is ignored: one after the other, each 3 steps long.
    ends = sorted(s.end_s for s in record.sessions)
    assert ends == [pytest.approx(0.03), pytest.approx(0.06), pytest.approx(0.09)]


def test_isolated_sessions_are_each_run_alone_from_time_zero() -> None:
    w = workload(
        session("a", [(100, 5, None)], arrival_s=3.0), session("b", [(100, 5, None)], arrival_s=3.0)
    )
    alone = isolated_sessions(w, flat_profile())
    assert {k: v.latency_s for k, v in alone.items()} == {
        "a": pytest.approx(0.05),
        "b": pytest.approx(0.05),
    }


def test_workload_longer_than_the_context_limit_is_refused() -> None:
    with pytest.raises(SimError, match="context limit"):
        SimEngine(
            workload(session("a", [(2000, 5, None)])),
            make_policy("fcfs"),
            flat_profile(num_gpu_blocks=64),
        )


def test_policy_that_needs_a_cpu_tier_is_refused_without_one() -> None:
    with pytest.raises(SimError, match="cpu-tier"):
        SimEngine(
            workload(session("a", [(20, 5, None)])),
            make_policy("thunderagent-cpu"),
            flat_profile(cpu_kv_blocks=64),
            SimConfig(cpu_tier=False),
        )


def test_a_policy_that_uses_a_cpu_tier_runs_without_one() -> None:
    # Autellix swaps a preempted call where there is a tier; here it is recomputed.
    record = SimEngine(
        workload(session("a", [(20, 5, None)]), session("b", [(20, 5, None)])),
        make_policy("autellix"),
        flat_profile(),
        SimConfig(cpu_tier=False),
    ).run()
    assert len(record.sessions) == 2


class Heard(AdmissionHalf, EngineHalf):
    """A half (either) that keeps every event it hears."""

    def __init__(self) -> None:
        self.heard: list[AnyEvent] = []

    def on_event(self, event: AnyEvent) -> None:
        self.heard.append(event)


class Listening(Policy):
    """Stock decisions, halves that keep what they hear."""

    name = "listening"

    def admission(self) -> Heard:
        self.admission_half = Heard()
        return self.admission_half

    def engine(self) -> Heard:
        self.engine_half = Heard()
        return self.engine_half


class GrowthSeen(EngineHalf):
    """Stock decisions; notes the running calls' growth at every prompt chunk."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def chunk(self, call: CallView, tokens: int, fit_tokens: int, view: EngineView) -> int:
        self.seen.append(view.running_growth_blocks)
        return tokens


class Growing(Policy):
    name = "growing"

    def engine(self) -> GrowthSeen:
        self.engine_half = GrowthSeen()
        return self.engine_half


def test_the_running_calls_growth_counts_the_rest_of_a_prompt_in_chunks() -> None:
    # 600 prompt tokens and 1 to generate: 38 blocks of 16 at the end. Chunks of 256:
    # before the first nothing runs; before the second the call holds 16 blocks, 22 to
    # go; before the third 32, 6 to go.
    policy = Growing()
    SimEngine(workload(session("a", [(600, 1, None)])), policy, flat_profile()).run()
    assert policy.engine_half.seen == [0, 22, 6]


def test_both_halves_hear_the_same_stream() -> None:
    policy = Listening()
    spec = session("a", [(20, 3, 0.045), (4, 2, None)])
    engine = SimEngine(workload(spec), policy, flat_profile(num_gpu_blocks=8))
    record = engine.run()
    heard = policy.admission_half.heard
    assert heard == policy.engine_half.heard
    assert policy.admission_half is not policy.engine_half
    # 0.00: the first KV figures (before anything arrived), a admitted and its call
    #       sent. 0.01 first token, 0.03 its 3rd and last: the tool is queued and
    #       starts at once (16 cores), tool figures 1 active.
    # 0.075: the tool ends (0.045 s): tool figures 0 active, its mean duration; the 2nd
    #       call (20 + 3 + 4 = 27 tokens) is sent: first token 0.085, end 0.095.
    # 0.10: the KV figures changed at 0.00 (a's call took 2 blocks): the next sample is
    #       at 0.10, after the session's end: all 8 blocks free again, 5 steps (1
    #       prefill + 2 decode, 1 prefill + 1 decode).
    timeline = [(round(event.mono_ns / 1e9, 6), event.kind) for event in heard]
    assert timeline == [
        (0.0, "kv_stats"),
        (0.0, "session_start"),
        (0.0, "llm_submit"),
        (0.01, "llm_first_token"),
        (0.03, "llm_end"),
        (0.03, "tool_enqueue"),
        (0.03, "tool_start"),
        (0.03, "tool_stats"),
        (0.075, "tool_end"),
        (0.075, "tool_stats"),
        (0.075, "llm_submit"),
        (0.085, "llm_first_token"),
        (0.095, "llm_end"),
        (0.095, "session_end"),
        (0.1, "kv_stats"),
    ]
    assert all(event.source == "sim" for event in heard)
    figures = [event for event in heard if isinstance(event, KVStats)]
    assert [(f.total_blocks, f.free_blocks, f.used_blocks, f.steps) for f in figures] == [
        (8, 8, 0, 0),
        (8, 8, 0, 5),
    ]
    tools = [event for event in heard if isinstance(event, ToolStats)]
    assert [(t.active, t.queued, sorted(t.exec_ema_s)) for t in tools] == [
        (1, 0, []),
        (0, 0, ["bash"]),
    ]
    assert tools[-1].exec_ema_s["bash"] == pytest.approx(0.045)
    # The admission half's view holds the newest figures.
    assert engine.admission_view.kv == figures[-1]
    assert record.steps == 5


def test_the_agent_instance_reaches_the_records_and_the_stream() -> None:
    # Two branches of one task and a session of its own (seed 004's unit: the instance).
    policy = Listening()
    specs = [
        session("t.0", [(20, 3, None)], task_id="t"),
        session("t.1", [(20, 3, None)], task_id="t"),
        session("solo", [(20, 3, None)]),
    ]
    record = SimEngine(workload(*specs), policy, flat_profile(num_gpu_blocks=16)).run()
    assert {r.session_id: r.task_id for r in record.sessions} == {
        "t.0": "t", "t.1": "t", "solo": None,
    }  # fmt: skip
    starts = [e for e in policy.engine_half.heard if e.kind == "session_start"]
    assert {e.session_id: e.metadata for e in starts} == {
        "t.0": {"task_id": "t"}, "t.1": {"task_id": "t"}, "solo": {},
    }  # fmt: skip


def test_a_kv_figure_reaches_the_admission_half_at_the_next_sample() -> None:
    policy = Listening()
    # One call of 20 tokens and 20 out: it takes 2 blocks at 0.00 and ends at 0.20.
    spec = session("a", [(20, 20, None)])
    config = SimConfig(kv_stats_interval_s=0.05)
    SimEngine(workload(spec), policy, flat_profile(num_gpu_blocks=8), config).run()
    figures = [
        (round(event.mono_ns / 1e9, 6), event.free_blocks)
        for event in policy.admission_half.heard
        if isinstance(event, KVStats)
    ]
    # 0.00: 8 free, then the call takes 2 blocks: the next sample, 0.05, shows 6.
    # 0.05: the decode jump to the call's end (0.01-0.05 was cut at that sample) takes
    # at its start the 3rd block the call's 33rd token needs: shown at 0.10.
    # 0.20: the call ends: 0.25 shows all 8 free. Nothing changes in between, so
    # nothing else is published (no sample at 0.15 or 0.20).
    assert figures == [(0.0, 8), (0.05, 6), (0.1, 5), (0.25, 8)]


class AdmissionNeedingACPUTier(AdmissionHalf):
    needs = frozenset({Capability.CPU_TIER})


class NeedsACPUTierAtTheGateway(Policy):
    name = "needs-cpu-at-the-gateway"

    def admission(self) -> AdmissionHalf:
        return AdmissionNeedingACPUTier()


def test_each_half_is_checked_against_what_its_host_provides() -> None:
    spec = session("a", [(20, 5, None)])
    with pytest.raises(SimError, match="the simulated gateway cannot run policy"):
        SimEngine(
            workload(spec), NeedsACPUTierAtTheGateway(), flat_profile(), SimConfig(cpu_tier=False)
        )
    with pytest.raises(SimError, match="the simulated engine cannot run policy 'thunderagent-cpu'"):
        SimEngine(
            workload(spec),
            make_policy("thunderagent-cpu"),
            flat_profile(),
            SimConfig(cpu_tier=False),
        )
    # With a CPU tier (the default when the engine half needs one) both start.
    with_tier = flat_profile(cpu_kv_blocks=16)
    SimEngine(workload(spec), NeedsACPUTierAtTheGateway(), with_tier, SimConfig(cpu_tier=True))
    engine = SimEngine(workload(spec), make_policy("thunderagent-cpu"), with_tier)
    assert engine.replicas[0].cpu_total_blocks == 16


def test_a_profile_without_cpu_blocks_provides_no_cpu_tier() -> None:
    # flat_profile() has cpu_kv_blocks=0: there is no tier to swap or offload to.
    with pytest.raises(SimError, match="cpu-tier"):
        SimEngine(
            workload(session("a", [(20, 5, None)])), make_policy("thunderagent-cpu"), flat_profile()
        )


# --- invariants -------------------------------------------------------------------------

turns = st.lists(
    st.tuples(st.integers(1, 120), st.integers(1, 40), st.floats(0.0, 2.0)), min_size=1, max_size=4
)
sessions_strategy = st.lists(st.tuples(turns, st.floats(0.0, 3.0)), min_size=1, max_size=5)


def build(raw):
    specs = []
    for index, (raw_turns, arrival) in enumerate(raw):
        shaped = [
            (a, o, w if i < len(raw_turns) - 1 else None) for i, (a, o, w) in enumerate(raw_turns)
        ]
        specs.append(session(f"s{index}", shaped, arrival_s=arrival, tool_cpu_s=0.5))
    return specs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=sessions_strategy,
    # From 40 blocks (640 tokens): the longest session the strategy makes must fit.
    blocks=st.integers(40, 64),
    policy=st.sampled_from(["fcfs", "continuum", "vtc", "continuum-dy"]),
)
def test_invariants(raw, blocks: int, policy: str) -> None:
    specs = build(raw)
    profile = flat_profile(num_gpu_blocks=blocks, max_num_batched_tokens=64, max_num_seqs=3)
    engine, record = run(*specs, policy=policy, profile=profile, config=SimConfig(tool_cores=1))
    # Every session finished, every call produced all its tokens, in time order.
    assert sorted(s.session_id for s in record.sessions) == sorted(s.session_id for s in specs)
    for s in record.sessions:
        spec = next(x for x in specs if x.session_id == s.session_id)
        assert [c.output_tokens for c in s.calls] == [t.output_tokens for t in spec.turns]
        for c in s.calls:
            assert c.submit_s <= c.first_token_s <= c.end_s
    # No block is leaked or over-allocated: all free again, no pin left.
    assert engine.kv.pool.num_free == blocks and not engine.kv.pins and engine.kv.pinned_blocks == 0
    # Every token is computed once, plus what preemptions made it recompute.
    calls = [c for s in record.sessions for c in s.calls]
    expected = sum(
        c.prompt_tokens + c.output_tokens - 1 - c.cached_tokens + c.recomputed_tokens for c in calls
    )
    assert record.computed_tokens == expected
    assert record.preemptions == sum(c.preemptions for c in calls)
    assert all(c.recomputed_tokens == 0 for c in calls if c.preemptions == 0)


@settings(max_examples=20, deadline=None)
@given(
    raw=sessions_strategy,
    policy=st.sampled_from(["fcfs", "continuum", "autellix", "thunderagent-cpu"]),
)
def test_same_input_same_run(raw, policy: str) -> None:
    specs = build(raw)
    profile = flat_profile(num_gpu_blocks=40, cpu_kv_blocks=100, max_num_batched_tokens=64)
    first = dataclasses.asdict(run(*specs, policy=policy, profile=profile)[1])
    second = dataclasses.asdict(run(*specs, policy=policy, profile=profile)[1])
    assert first == second


@settings(max_examples=40, deadline=None)
@given(raw=sessions_strategy)
def test_a_prefix_that_survives_is_reused_in_full(raw) -> None:
    # With room for everything nothing is evicted, so each next turn finds every full
    # block of what its session computed before: (prompt + output - 1) // 16 blocks.
    specs = build(raw)
    _, record = run(*specs, profile=flat_profile(num_gpu_blocks=4096, max_model_len=4096))
    assert not record.evictions
    for s in record.sessions:
        for before, after in zip(s.calls, s.calls[1:], strict=False):
            assert (
                after.cached_tokens == (before.prompt_tokens + before.output_tokens - 1) // 16 * 16
            )


@settings(max_examples=30, deadline=None)
@given(raw=sessions_strategy, policy=st.sampled_from(["fcfs", "continuum", "infercept"]))
def test_decode_jumps_change_nothing_but_the_work(raw, policy: str) -> None:
    specs = build(raw)
    profile = flat_profile(num_gpu_blocks=48, cpu_kv_blocks=100, max_num_batched_tokens=64)
    timings = []
    for jumps in (True, False):
        _, record = run(
            *specs, policy=policy, profile=profile, config=SimConfig(decode_jumps=jumps)
        )
        calls = [c for s in sorted(record.sessions, key=lambda s: s.session_id) for c in s.calls]
        timings.append(
            (
                [(c.first_token_s, c.end_s, c.cached_tokens, c.recomputed_tokens) for c in calls],
                record.steps,
                record.computed_tokens,
                record.preemptions,
            )
        )
    assert _same(timings[0], timings[1])


def _same(a, b) -> bool:
    assert a == b  # to the last bit: a jump sums the very step times stepping takes
    return True


def _timings(record) -> list[tuple[str, float, float, list[tuple[float, float, float]]]]:
    """Every session's admission and end, and every call's submit, first token and end."""
    return [
        (
            s.session_id,
            s.admitted_s,
            s.end_s,
            [(c.submit_s, c.first_token_s, c.end_s) for c in s.calls],
        )
        for s in sorted(record.sessions, key=lambda s: s.session_id)
    ]


@pytest.mark.parametrize("policy", ["fcfs", "continuum"])
def test_decode_jumps_time_concurrent_sessions_exactly_as_steps_on_a_real_profile(
    policy: str,
) -> None:
    # h100-qwen3-coder-30b charges every decode step for the KV it reads (its context
    # cost is not zero), so a jump that mis-sums the batch's context (e.g. counting
    # each sequence's KV once per sequence) ends its calls late. Five sessions overlap
    # in long decode stretches between prefills, tools and arrivals.
    profile = load_profile("h100-qwen3-coder-30b")
    specs = [
        session(
            f"s{i}",
            [
                (3000 + 700 * i, 120 + 37 * i, 0.4 + 0.1 * i),
                (900, 90 + 11 * i, 0.2),
                (400, 150, None),
            ],
            arrival_s=0.05 * i,
        )
        for i in range(5)
    ]
    runs = [
        run(*specs, policy=policy, profile=profile, config=SimConfig(decode_jumps=jumps))[1]
        for jumps in (True, False)
    ]
    jumped, stepped = runs
    assert _timings(jumped) == _timings(stepped)
    assert jumped.steps == stepped.steps


def test_kv_figures_stay_consistent_when_pins_share_a_prefix() -> None:
    # Two sessions share a 64-token (4-block) system prompt and both pin their KV
    # (Continuum) while their tools run: the shared blocks are held by both pins, so
    # the pins' sum counts them twice. The kv_stats the admission half gets must still
    # be a valid figure (pinned <= used), as on the real stack.
    shared = {"prefix_group": "sys", "shared_prefix_tokens": 64}
    engine = SimEngine(
        workload(
            session("a", [(96, 4, 1.0), (16, 4, None)], **shared),
            session("b", [(96, 4, 1.0), (16, 4, None)], arrival_s=0.01, **shared),
        ),
        make_policy("continuum"),
        flat_profile(),
    )
    heard: list[KVStats] = []
    deliver = engine.admission.on_event

    def keep(event: AnyEvent) -> None:
        if isinstance(event, KVStats):
            heard.append(event)
        deliver(event)

    engine.admission.on_event = keep  # type: ignore[method-assign]
    record = engine.run()
    assert len(record.sessions) == 2
    assert any(stats.pins == 2 for stats in heard)
    assert all(stats.pinned_blocks <= stats.used_blocks for stats in heard)


class ToolPriorityByName(AdmissionHalf):
    """Admits everyone; ranks each session's tools by a fixed table."""

    def __init__(self) -> None:
        self.ranks = {"a": 0, "b": 5, "c": 1}
        self.enqueued: list[tuple[str, int | None]] = []

    def tool_priority(self, session_id: str) -> int:
        return self.ranks[session_id]

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, ToolEnqueue):
            self.enqueued.append((event.session_id, event.priority))


class RanksTools(Policy):
    name = "test-ranks-tools"

    def admission(self) -> ToolPriorityByName:
        self.admission_half = ToolPriorityByName()
        return self.admission_half


def test_the_host_admits_queued_tools_by_the_admission_halfs_priority() -> None:
    # One tool slot. The three calls (20 tokens, 1 output token each) run in one step
    # and end at 10 ms, queueing their 1 s tools in order a, b, c: a takes the slot,
    # then c (priority 1) before b (priority 5) though b queued first.
    policy = RanksTools()
    specs = [session(name, [(20, 1, 1.0), (4, 1, None)]) for name in "abc"]
    record = SimEngine(workload(*specs), policy, flat_profile(), SimConfig(tool_slots=1)).run()
    starts = {s.session_id: s.tools[0].start_s for s in record.sessions}
    assert starts == {
        "a": pytest.approx(STEP_S),
        "c": pytest.approx(STEP_S + 1.0),
        "b": pytest.approx(STEP_S + 2.0),
    }
    # The priority is in the tool_enqueue events too, as the sandbox pool reports it.
    assert policy.admission_half.enqueued == [("a", 0), ("b", 5), ("c", 1)]


def test_a_session_that_waits_for_others_arrives_when_the_last_of_them_ends() -> None:
    # MapReduce: two maps at 0 (5 and 3 tokens: they end at 50 and 30 ms, one step
    # each, batched); the reduce, due at 0, waits for both: it arrives at 50 ms and
    # takes a prefill step and 1 more decode step (2 tokens): it ends at 70 ms.
    _, record = run(
        session("m.0", [(100, 5, None)], task_id="m"),
        session("m.1", [(100, 3, None)], task_id="m"),
        session("m.r", [(20, 2, None)], task_id="m", after=("m.0", "m.1")),
    )
    times = {s.session_id: (s.arrival_s, s.end_s) for s in record.sessions}
    assert times["m.r"] == pytest.approx((5 * STEP_S, 7 * STEP_S))
    assert times["m.1"][1] < times["m.0"][1] == pytest.approx(5 * STEP_S)
    # In a closed loop of one, the waiting session holds the loop's place: no deadlock.
    _, closed = run(
        session("a", [(100, 2, None)]),
        session("b", [(100, 2, None)], after=("a",)),
        arrival="closed",
        concurrency=1,
    )
    assert [s.session_id for s in closed.sessions] == ["a", "b"]


def test_a_waiting_session_runs_alone_without_what_it_waits_for_for_t_ideal() -> None:
    maps_and_reduce = workload(
        session("m.0", [(100, 5, None)]),
        session("m.r", [(20, 2, None)], after=("m.0",)),
    )
    alone = isolated_sessions(maps_and_reduce, flat_profile())
    # The reduce alone: its prefill step with the first token, then one more.
    assert alone["m.r"].latency_s == pytest.approx(2 * STEP_S)


def test_a_dependency_must_be_a_session_listed_before() -> None:
    with pytest.raises(ValueError, match=r"comes after \['z'\]"):
        workload(session("a", [(10, 1, None)], after=("z",)))
    with pytest.raises(ValueError, match=r"comes after \['b'\]"):
        workload(session("a", [(10, 1, None)], after=("b",)), session("b", [(10, 1, None)]))
