"""The fidelity benchmark's parts that need no vLLM: the loads, the mix as the
simulator's workload, the simulated figures, the comparison; and the session-mix
helpers it shares (CPU pinning, the KV check, the engine line, the load figures).
The whole benchmark on vLLM is in tests/cli/test_bench_vllm.py (slow)."""

from __future__ import annotations

import math
import os

import pytest

from agentmars.bench.fidelity import (
    FidelityError,
    Load,
    compare,
    mix_workload,
    parse_loads,
    relative_error,
    simulate,
    worst_latency_error,
)
from agentmars.bench.session_mix import (
    ENGINE_LINE,
    EngineShape,
    LoadSampler,
    MixShape,
    ReplaySession,
    ReplayTurn,
    SessionMixError,
    build_mix,
    check_fits,
    pinned,
)
from agentmars.server.profiles.cost_model import (
    CostModel,
    FittedCost,
    Profile,
    StepShape,
    chunk_attention,
    load_profile,
)

ENGINE = EngineShape(vllm_python=os.devnull, model=os.devnull, num_blocks=64)  # type: ignore[arg-type]


def test_loads_are_named_rates() -> None:
    assert parse_loads("light=0.15, saturated=0.6") == [
        Load("light", 0.15),
        Load("saturated", 0.6),
    ]
    assert parse_loads("0.5") == [Load("0.5/s", 0.5)]
    for bad, message in [
        ("light=fast", "is not NAME=RATE"),
        ("x=0", "must be a positive number"),
        ("x=nan", "must be a positive number"),
        (" , ", "at least one rate"),
    ]:
        with pytest.raises(FidelityError, match=message):
            parse_loads(bad)


def test_the_simulator_replays_exactly_the_mix() -> None:
    mix = build_mix(MixShape(workload="react", sessions=6, max_turns=3))
    workload = mix_workload(mix, "w")
    for session, spec in zip(mix, workload.sessions, strict=True):
        assert (spec.session_id, spec.arrival_s) == (session.session_id, session.arrival_s)
        assert spec.shared_prefix_tokens == 0  # the replay's ids share no prefix either
        for turn, turn_spec in zip(session.turns, spec.turns, strict=True):
            assert turn_spec.append_tokens == len(turn.append)
            assert turn_spec.output_tokens == turn.output_tokens
            if turn.tool is None:
                assert turn_spec.tool is None
            else:
                assert turn_spec.tool is not None
                # The agents sleep: a tool is a wait that uses no CPU.
                assert (turn_spec.tool.wall_s, turn_spec.tool.cores) == (turn.tool_s, 0.0)


def _linear_profile() -> Profile:
    cost = FittedCost(c0=0.002, c1=1e-4, c2=4e-8, c3=3e-4, c4=2e-7, r_squared=1.0)
    return load_profile("cpu-tiny").model_copy(update={"cost": cost, "num_gpu_blocks": 64})


def test_a_lone_session_takes_its_steps_and_its_tool() -> None:
    # Two calls and a 3 s tool, worked out from the step-time model by hand.
    profile = _linear_profile()
    step = CostModel(profile).step_time
    first, second = (
        ReplayTurn(tuple(range(3, 1003)), 4, "bash", 3.0),
        ReplayTurn((5,) * 300, 2, None, 0.0),
    )
    mix = [ReplaySession("s", 0.0, (first, second))]
    prefill_1 = step(StepShape(prefill_tokens=1000, prefill_attention=chunk_attention(1000, 0)))
    decodes_1 = sum(step(StepShape(decode_seqs=1, decode_context=1000 + k)) for k in range(1, 4))
    # The second prompt is 1000 + 4 + 300 tokens; 7 blocks of 128 (896) are cached
    # (the first call's last output token was never computed, so 1003 tokens are).
    cached = 896
    tokens = 1304 - cached
    prefill_2 = step(
        StepShape(prefill_tokens=tokens, prefill_attention=chunk_attention(tokens, cached))
    )
    decodes_2 = step(StepShape(decode_seqs=1, decode_context=1305))
    figures = simulate(mix, "fcfs", profile, ENGINE)
    expected = prefill_1 + decodes_1 + 3.0 + prefill_2 + decodes_2
    assert figures["session_latency_s"]["mean"] == pytest.approx(expected, rel=1e-9)
    assert figures["ttft_after_tool_s"]["mean"] == pytest.approx(prefill_2, rel=1e-9)
    assert figures["prefix_cache_hit_rate"] == pytest.approx(cached / (1000 + 1304))
    # The API server's time per request (calibrate fits it) delays each call's start.
    slow = profile.model_copy(update={"request_overhead_s": 0.006})
    figures = simulate(mix, "fcfs", slow, ENGINE)
    assert figures["session_latency_s"]["mean"] == pytest.approx(expected + 2 * 0.006, rel=1e-9)
    assert figures["ttft_after_tool_s"]["mean"] == pytest.approx(prefill_2 + 0.006, rel=1e-9)


def test_the_comparison_gives_each_models_error() -> None:
    real = {
        "session_latency_s": {"mean": 10.0, "p50": 9.0, "p95": 20.0},
        "ttft_after_tool_s": {"mean": 1.0},
        "prefix_cache_hit_rate": 0.5,
    }
    sim = {
        "session_latency_s": {"mean": 9.0, "p50": 9.0, "p95": 23.0},
        "ttft_after_tool_s": {"mean": 1.5},
        "prefix_cache_hit_rate": 0.4,
    }
    rows = compare(real, {"sim": sim})
    assert rows["mean latency s"] == {"real": 10.0, "sim": 9.0, "sim error": pytest.approx(-0.1)}
    assert rows["P95 latency s"]["sim error"] == pytest.approx(0.15)
    assert rows["mean TTFT after tool s"]["sim error"] == pytest.approx(0.5)
    assert rows["prefix hit rate"]["sim error"] == pytest.approx(-0.2)
    assert worst_latency_error({"points": [{"comparison": rows}]}) == pytest.approx(0.15)
    assert math.isnan(relative_error(1.0, 0.0)) and math.isnan(relative_error(1.0, math.nan))


def test_vllm_needs_more_kv_than_the_longest_context() -> None:
    # 32 blocks of 128 are exactly 4096 tokens, but one block is vLLM's null block.
    with pytest.raises(SessionMixError, match="needs 33 blocks of 128 tokens"):
        check_fits(32, 4096)
    check_fits(33, 4096)


def test_the_engine_line_of_either_server_is_read() -> None:
    vllm = "agentmars: gateway on http://127.0.0.1:8080, engine http://127.0.0.1:9000"
    twin = (
        "agentmars: gateway on http://127.0.0.1:8080, simulated engine (cpu-host, policy "
        "fcfs) http://127.0.0.1:9001"
    )
    for line, url in [(vllm, "http://127.0.0.1:9000"), (twin, "http://127.0.0.1:9001")]:
        match = ENGINE_LINE.search(line)
        assert match is not None and match.group(1) == url


def test_cpu_lists_and_pinning() -> None:
    # The sandbox's parser of core lists, shared.
    for bad in ("a", "1-", "-1"):
        with pytest.raises(SessionMixError, match="cannot run the agents on CPUs"), pinned(bad):
            pass
    before = os.sched_getaffinity(0)
    one = min(before)
    with pinned(str(one)):
        assert os.sched_getaffinity(0) == {one}
    assert os.sched_getaffinity(0) == before
    with pytest.raises(SessionMixError, match="cannot run the agents on CPUs"), pinned("4096"):
        pass
    assert os.sched_getaffinity(0) == before


def test_the_engine_load_figures() -> None:
    sampler = LoadSampler("http://127.0.0.1:9")
    assert sampler.figures() == {"samples": 0}
    sampler.samples = [(0.5, 0, 0, 0.0), (1.0, 2, 3, 0.5), (1.5, 1, 1, 0.25), (2.0, 1, 0, 0.25)]
    figures = sampler.figures()
    assert figures["busy_fraction"] == 0.75
    assert (figures["waiting_mean"], figures["waiting_max"]) == (1.0, 3)
    assert (figures["kv_usage_mean"], figures["kv_usage_max"]) == (0.25, 0.5)
