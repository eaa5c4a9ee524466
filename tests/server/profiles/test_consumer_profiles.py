"""Seed 002's consumer-GPU profiles: the derivation by hand, and the SM-share curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentmars.server.profiles.cost_model import (
    PROFILE_DIR,
    SM_PHASES,
    CostModel,
    Profile,
    ProfileError,
    chunk_attention,
    load_profile,
    profile_json,
)
from agentmars.server.profiles.gpu_profiles import (
    CUDA_RESERVED_BYTES,
    LLAMA3_8B,
    QWEN25_3B,
    QWEN25_7B,
    RTX_5090,
    RTX_A5000,
    SM_SHARES,
    TESTBED_PROFILES,
    bandwidth_saturation_share,
    kv_bytes_per_token,
    vllm_batch_defaults,
)
from agentmars.server.profiles.hardware import GIB, MIB

CONSUMER = [
    "rtx-a5000-qwen2.5-3b",
    "rtx-a5000-qwen2.5-7b",
    "rtx-a5000-llama3-8b",
    "rtx5090-qwen2.5-3b",
    "rtx5090-qwen2.5-7b",
    "rtx5090-llama3-8b",
]


# --- the models' arithmetic, by hand -----------------------------------------------------


def test_qwen25_3b_parameters_match_its_model_card() -> None:
    # Per layer: q/o 2*2048*2048 + k/v 2*2048*256 = 9,437,184; gated MLP 3*2048*11008 =
    # 67,633,152. 36 layers + one tied 151,936*2048 embedding.
    assert QWEN25_3B.total_params == 36 * (9_437_184 + 67_633_152) + 151_936 * 2048
    assert QWEN25_3B.total_params == 3_085_697_024  # model card: 3.09B
    # Non-embedding parameters (model card: 2.77B).
    assert QWEN25_3B.linear_params_per_token == pytest.approx(2.77e9, rel=0.002)
    # Tied: the output projection is the embedding, read every step.
    assert QWEN25_3B.dense_weight_bytes_read == (36 * 9_437_184 + 151_936 * 2048) * 2
    assert kv_bytes_per_token(QWEN25_3B) == 2 * 36 * 2 * 128 * 2 == 36_864


def test_qwen25_7b_parameters_match_its_model_card() -> None:
    # Per layer: 2*3584*3584 + 2*3584*512 = 29,360,128; MLP 3*3584*18944 = 203,685,888.
    assert QWEN25_7B.total_params == 28 * (29_360_128 + 203_685_888) + 2 * 152_064 * 3584
    assert QWEN25_7B.total_params == 7_615_283_200  # model card: 7.61B
    assert QWEN25_7B.linear_params_per_token == pytest.approx(6.53e9, rel=0.002)
    assert QWEN25_7B.checkpoint_bytes / GIB == pytest.approx(14.185, abs=0.001)
    assert kv_bytes_per_token(QWEN25_7B) == 2 * 28 * 4 * 128 * 2 == 57_344


def test_llama3_8b_parameters_are_its_checkpoints_less_norms() -> None:
    # Per layer: 2*4096*4096 + 2*4096*1024 = 41,943,040; MLP 3*4096*14336 = 176,160,768.
    assert LLAMA3_8B.total_params == 32 * (41_943_040 + 176_160_768) + 2 * 128_256 * 4096
    # 8,030,261,248 less 65 RMSNorm weight vectors of 4096.
    assert LLAMA3_8B.total_params == 8_030_261_248 - 65 * 4096 == 8_029_995_008
    assert kv_bytes_per_token(LLAMA3_8B) == 2 * 32 * 8 * 128 * 2 == 131_072


# --- the GPUs and the deployment ---------------------------------------------------------


def test_consumer_gpus_are_their_datasheets_as_cuda_sees_them() -> None:
    assert RTX_A5000.memory_bytes == 24564 * MIB - CUDA_RESERVED_BYTES
    assert RTX_5090.memory_bytes == 32607 * MIB - CUDA_RESERVED_BYTES
    assert (RTX_A5000.hbm_bandwidth_bytes_s, RTX_A5000.dense_bf16_flops) == (768e9, 111.1e12)
    assert (RTX_5090.hbm_bandwidth_bytes_s, RTX_5090.dense_bf16_flops) == (1792e9, 209.5e12)
    # Both under 70 GiB: vLLM's small-GPU defaults.
    assert vllm_batch_defaults(RTX_A5000) == vllm_batch_defaults(RTX_5090) == (256, 2048)


@pytest.mark.parametrize(
    ("name", "memory_mib", "weights", "vocab", "per_token", "blocks"),
    [
        # 0.9 * (24564 MiB - 0.467 GiB) = 21.169 GiB - 5.748 GiB of weights - 38.7 * 256 *
        # 151,936 (1.402 GiB) - 0.13 GiB = 13.889 GiB over 16 * 36 KiB per block.
        ("rtx-a5000-qwen2.5-3b", 24564, 6_171_394_048, 151_936, 36_864, 25_284),
        # 21.169 - 14.185 - 1.403 - 0.13 = 5.451 GiB over 16 * 56 KiB.
        ("rtx-a5000-qwen2.5-7b", 24564, 15_230_566_400, 152_064, 57_344, 6379),
        # 21.169 - 14.957 - 1.183 - 0.13 = 4.898 GiB over 16 * 128 KiB = 2 MiB.
        ("rtx-a5000-llama3-8b", 24564, 16_059_990_016, 128_256, 131_072, 2507),
        # 0.9 * (32607 MiB - 0.467 GiB) = 28.238 GiB.
        ("rtx5090-qwen2.5-3b", 32607, 6_171_394_048, 151_936, 36_864, 38_153),
        ("rtx5090-qwen2.5-7b", 32607, 15_230_566_400, 152_064, 57_344, 14_652),
        ("rtx5090-llama3-8b", 32607, 16_059_990_016, 128_256, 131_072, 6127),
    ],
)
def test_consumer_kv_capacity_is_the_hand_derivation(
    name: str, memory_mib: int, weights: int, vocab: int, per_token: int, blocks: int
) -> None:
    budget = 0.9 * (memory_mib * MIB - CUDA_RESERVED_BYTES)
    kv_bytes = budget - weights - 38.7 * 256 * vocab - int(0.13 * GIB)
    assert int(kv_bytes // (16 * per_token)) == blocks
    profile = load_profile(name)
    assert (profile.block_size, profile.kv_bytes_per_token) == (16, per_token)
    assert profile.num_gpu_blocks == profile.cpu_kv_blocks == blocks
    assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (256, 2048)
    # Every model's whole context fits: 32,768 (Qwen2.5) and 8,192 (Llama-3).
    assert profile.max_model_len == (8192 if "llama" in name else 32_768)
    # PCIe Gen4 x16 on the A5000, Gen5 x16 on the 5090, at 80%.
    expected = 25.6e9 if name.startswith("rtx-a5000") else 51.2e9
    assert profile.cpu_kv_bandwidth_bytes_s == pytest.approx(expected)


def test_a5000_qwen7b_decode_step_by_hand() -> None:
    model = CostModel(load_profile("rtx-a5000-qwen2.5-7b"))
    bandwidth = 768e9 * 0.8
    compute = 111.1e12 * 0.5
    # One sequence at 2048 tokens: every weight but the input embedding streamed once
    # (memory-bound), then its KV read once, plus 1.5 ms.
    weights = (7_615_283_200 - 152_064 * 3584) * 2 / bandwidth
    linear_flops = 2 * 28 * (29_360_128 + 203_685_888) + 2 * 152_064 * 3584
    assert weights > linear_flops / compute
    kv = 2048 * 57_344 / bandwidth
    assert 2048 * 4 * 28 * 128 * 28 / compute < kv
    assert model.decode_time(2048, 1) == pytest.approx(0.0015 + weights + kv)
    assert model.decode_time(2048, 1) == pytest.approx(0.024706, abs=1e-6)


def test_5090_llama3_prefill_chunk_by_hand() -> None:
    # One 2048-token chunk from scratch: the GEMMs compute-bound at half of 209.5 TFLOP/s.
    model = CostModel(load_profile("rtx5090-llama3-8b"))
    compute = 209.5e12 * 0.5
    linear = 2048 * 2 * 32 * (41_943_040 + 176_160_768) / compute
    assert linear > (8_029_995_008 - 128_256 * 4096) * 2 / (1792e9 * 0.8)
    pairs = chunk_attention(2048, 0)
    attention_flops = 4 * 32 * 128 * 32 * pairs
    attention_bytes = 131_072 * (pairs / 128 + 2048)
    attention = max(attention_flops / compute, attention_bytes / (1792e9 * 0.8))
    assert model.prefill_time(2048) == pytest.approx(0.0015 + linear + attention)
    assert model.prefill_time(2048) == pytest.approx(0.2849, abs=1e-4)


# --- the SM-share curves -----------------------------------------------------------------


def test_only_seed002_profiles_have_curves_and_the_others_json_is_unchanged() -> None:
    for name in sorted(TESTBED_PROFILES):
        text = (PROFILE_DIR / f"{name}.json").read_text()
        has = name in CONSUMER
        assert ('"sm_share_curves"' in text) == has, name
        assert bool(load_profile(name).sm_share_curves) == has, name
    assert '"sm_share_curves"' not in (PROFILE_DIR / "cpu-tiny.json").read_text()


def test_bandwidth_saturation_share_is_littles_law() -> None:
    # 80% of the bandwidth x 600 ns in flight, over 1536 threads x 16 B per SM.
    assert bandwidth_saturation_share(RTX_A5000, QWEN25_7B) == pytest.approx(
        768e9 * 0.8 * 600e-9 / (64 * 1536 * 16)
    )
    assert bandwidth_saturation_share(RTX_A5000, QWEN25_7B) == pytest.approx(0.2344, abs=1e-4)
    assert bandwidth_saturation_share(RTX_5090, QWEN25_7B) == pytest.approx(
        1792e9 * 0.8 * 600e-9 / (170 * 1536 * 16)
    )


def test_a5000_qwen7b_decode_curve_at_a_tenth_by_hand() -> None:
    # Four sequences at 3,000 tokens on 10% of the SMs: 10% of the FLOP/s, and
    # 0.1 / 0.2344 of the bandwidth (it saturates past 0.2344).
    profile = load_profile("rtx-a5000-qwen2.5-7b")
    weights = (7_615_283_200 - 152_064 * 3584) * 2
    kv = 4 * 3000 * 57_344
    linear_flops = 4 * (2 * 28 * (29_360_128 + 203_685_888) + 2 * 152_064 * 3584)
    attention_flops = 4 * 28 * 128 * 28 * 4 * 3000

    def step(share: float) -> float:
        compute = 111.1e12 * 0.5 * share
        bandwidth = 768e9 * 0.8 * min(1.0, share / (768e9 * 0.8 * 600e-9 / (64 * 1536 * 16)))
        linear = max(linear_flops / compute, weights / bandwidth)
        return 0.0015 + linear + max(attention_flops / compute, kv / bandwidth)

    assert profile.sm_throughput("decode", 0.1) == pytest.approx(step(1) / step(0.1), abs=1e-4)
    assert profile.sm_throughput("decode", 0.1) == pytest.approx(0.4415, abs=1e-4)


@pytest.mark.parametrize("name", CONSUMER)
def test_curves_are_seed002_fig3_shaped(name: str) -> None:
    profile = load_profile(name)
    curves = profile.sm_share_curves
    assert set(curves) == set(SM_PHASES)
    for phase, points in curves.items():
        assert [share for share, _ in points] == list(SM_SHARES)
        values = [value for _, value in points]
        assert values == sorted(values), phase  # Assumption 1: non-decreasing
        assert points[-1] == (1.0, 1.0)
        assert all(0 < value <= 1 for value in values)
    decode, cold, resume = (dict(curves[phase]) for phase in SM_PHASES)
    for share in SM_SHARES:
        # Resume prefill stays between decode and cold prefill.
        assert cold[share] <= resume[share] <= decode[share], share
    # Decode rises quickly and saturates early; cold prefill grows about linearly.
    assert decode[0.3] > 0.95 > cold[0.3]
    assert decode[0.3] > resume[0.3] > cold[0.3]
    assert decode[0.1] > 0.4
    for share in SM_SHARES:
        assert cold[share] == pytest.approx(share, abs=0.01)

    def knee(values: dict[float, float]) -> float:
        return min(share for share in SM_SHARES if values[share] >= 0.95)

    assert knee(decode) < knee(resume) < knee(cold)


def test_curves_differ_between_the_gpus() -> None:
    a5000 = load_profile("rtx-a5000-qwen2.5-7b").sm_share_curves
    rtx5090 = load_profile("rtx5090-qwen2.5-7b").sm_share_curves
    # The 5090 saturates its bandwidth at a smaller share (0.206 against 0.234), and its
    # lower FLOP/s-to-bandwidth ratio keeps a 56-token resume compute-bound longer.
    assert dict(rtx5090["decode"])[0.2] > dict(a5000["decode"])[0.2]
    assert dict(rtx5090["resume_prefill"])[0.6] < dict(a5000["resume_prefill"])[0.6]


def test_sm_throughput_interpolates_through_the_points() -> None:
    profile = load_profile("rtx-a5000-qwen2.5-3b")
    for phase in SM_PHASES:
        points = dict(profile.sm_share_curves[phase])
        for share, value in points.items():
            assert profile.sm_throughput(phase, share) == value
        # Linear between points, and from (0, 0) to the first.
        assert profile.sm_throughput(phase, 0.15) == pytest.approx((points[0.1] + points[0.2]) / 2)
        assert profile.sm_throughput(phase, 0.37) == pytest.approx(
            points[0.3] + 0.7 * (points[0.4] - points[0.3])
        )
        assert profile.sm_throughput(phase, 0.05) == pytest.approx(points[0.1] / 2)
        assert profile.sm_throughput(phase, 0.0) == 0.0
        assert profile.sm_throughput(phase, 1.0) == 1.0
        grid = [i / 100 for i in range(101)]
        values = [profile.sm_throughput(phase, share) for share in grid]
        assert values == sorted(values)


def test_sm_throughput_refuses_bad_input() -> None:
    profile = load_profile("rtx5090-qwen2.5-7b")
    with pytest.raises(ValueError, match="unknown phase 'prefill'"):
        profile.sm_throughput("prefill", 0.5)
    for share in (-0.1, 1.01, math.nan):
        with pytest.raises(ValueError, match="outside"):
            profile.sm_throughput("decode", share)
    without = load_profile("h100-qwen3-coder-30b")
    assert not without.sm_share_curves
    with pytest.raises(ValueError, match="has no SM-share curves"):
        without.sm_throughput("decode", 0.5)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("resume_prefill"), "exactly the phases"),
        (lambda c: c["decode"].pop(), "last point must be"),
        (lambda c: c["decode"].__setitem__(1, [0.2, 0.1]), "non-decreasing"),
        (lambda c: c["decode"].__setitem__(1, [0.1, 0.9]), "shares must increase"),
        (lambda c: c["cold_prefill"].__setitem__(0, [0.1, 0.0]), "in (0, 1]"),
    ],
)
def test_bad_curves_in_a_profile_file_say_so(tmp_path: Path, edit: object, message: str) -> None:
    data = json.loads((PROFILE_DIR / "rtx-a5000-qwen2.5-7b.json").read_text())
    assert callable(edit)
    edit(data["sm_share_curves"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"bad\.json") as caught:
        load_profile(str(path))
    assert message in str(caught.value)


def test_curves_survive_the_json_round_trip(tmp_path: Path) -> None:
    profile = load_profile("rtx5090-llama3-8b")
    path = tmp_path / "copy.json"
    path.write_text(profile_json(profile))
    assert load_profile(str(path)) == profile
    without = Profile.model_validate({**json.loads(profile_json(profile)), "sm_share_curves": {}})
    assert '"sm_share_curves"' not in profile_json(without)
