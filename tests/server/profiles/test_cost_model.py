"""The cost model: derivations worked by hand, public figures, physical bounds, loading."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentmars.server.profiles.cost_model import (
    PROFILE_DIR,
    CostModel,
    FittedCost,
    Profile,
    ProfileError,
    StepShape,
    chunk_attention,
    load_profile,
    profile_json,
    profile_names,
)
from agentmars.server.profiles.gpu_profiles import (
    A100_SXM,
    GPT_J_6B,
    GPT_OSS_120B,
    H100_NVL,
    H100_SXM,
    H200_NVL,
    PUBLISHED_STEPS,
    QWEN3_CODER_30B,
    SEED001_A100,
    TESTBED_PROFILES,
    VICUNA_13B,
    PublishedStep,
    VllmDeployment,
    derive_profile,
    kv_bytes_per_token,
    kv_cache_memory_bytes,
    step_model,
    vllm_batch_defaults,
)
from agentmars.server.profiles.hardware import GIB, MIB, GpuSpec

TESTBEDS = sorted(TESTBED_PROFILES)
SEED000_TESTBEDS = [name for name in TESTBEDS if name.startswith(("h100-", "h200-"))]


def fitted_profile(**cost: float) -> Profile:
    """A small fitted profile with hand-picked coefficients."""
    coefficients = {"c0": 0.01, "c1": 1e-4, "c2": 1e-8, "c3": 1e-3, "c4": 1e-6, **cost}
    return Profile(
        name="hand",
        description="hand-picked coefficients",
        sources=[],
        block_size=16,
        num_gpu_blocks=1000,
        max_model_len=8000,
        max_num_seqs=64,
        max_num_batched_tokens=1000,
        kv_bytes_per_token=1000,
        cpu_kv_blocks=1000,
        cpu_kv_bandwidth_bytes_s=1e9,
        cost=FittedCost(**coefficients),
    )


# --- the models' arithmetic, by hand -----------------------------------------------------


def test_qwen3_coder_parameters_and_bytes_match_its_checkpoint() -> None:
    # Per layer: q/o 2*2048*4096 + k/v 2*2048*512 = 18,874,368; router 2048*128 = 262,144;
    # experts 128 * 3*2048*768 = 603,979,776. 48 layers + 2 * 151,936*2048 embeddings.
    assert QWEN3_CODER_30B.total_params == 48 * (18_874_368 + 262_144 + 603_979_776) + 2 * (
        151_936 * 2048
    )
    assert QWEN3_CODER_30B.total_params == 30_531_911_680
    # The BF16 safetensors hold 61,064,216,576 bytes (the rest: norm weights).
    assert QWEN3_CODER_30B.checkpoint_bytes == pytest.approx(61_064_216_576, rel=1e-4)
    # "3.3B activated" (model card) counts 8 experts, attention, routers, the output
    # projection and the input embedding (a gather, not a multiply: not in ours).
    active = QWEN3_CODER_30B.active_params
    assert active + QWEN3_CODER_30B.vocab_params == pytest.approx(3.35e9, rel=0.01)
    assert kv_bytes_per_token(QWEN3_CODER_30B) == 2 * 48 * 4 * 128 * 2 == 98_304


def test_gpt_oss_parameters_and_kv_group_match_its_model_card() -> None:
    # Model card: 116.83B parameters, 5.13B active per token (with the unembedding).
    assert GPT_OSS_120B.total_params == pytest.approx(116.83e9, rel=0.002)
    assert GPT_OSS_120B.active_params == pytest.approx(5.13e9, rel=0.002)
    # MXFP4 experts (4.25 bits) + BF16 rest = the 60.7 GiB checkpoint.
    assert GPT_OSS_120B.checkpoint_bytes / GIB == pytest.approx(60.69, abs=0.01)
    # One block id covers 18 layers (the full-attention group), 2*8*64*2 bytes each.
    assert kv_bytes_per_token(GPT_OSS_120B) == 18 * 2 * 8 * 64 * 2 == 36_864


def test_gpt_j_parameters_match_its_model_card() -> None:
    # Per layer: q/k/v/o 4*4096*4096 = 67,108,864; an ungated MLP (fc_in, fc_out)
    # 2*4096*16384 = 134,217,728. 28 layers + 2 * 50,400*4096 (untied lm_head).
    assert GPT_J_6B.expert_params == 2 * 4096 * 16384
    assert GPT_J_6B.total_params == 28 * (67_108_864 + 134_217_728) + 2 * 50_400 * 4096
    assert GPT_J_6B.total_params == 6_050_021_376
    # Model card: 6,053,381,344 (with biases and layer norms).
    assert GPT_J_6B.total_params == pytest.approx(6_053_381_344, rel=1e-3)
    # Served in BF16: 12,100,042,752 B = 11.269 GiB.
    assert GPT_J_6B.checkpoint_bytes == 12_100_042_752
    # Full multi-head attention: 2 (K, V) * 28 layers * 16 heads * 256 * 2 B.
    assert kv_bytes_per_token(GPT_J_6B) == 2 * 28 * 16 * 256 * 2 == 458_752


def test_vicuna_parameters_are_llama2_13b() -> None:
    # Per layer: attention 4*5120*5120 = 104,857,600; gated MLP 3*5120*13824 =
    # 212,336,640. 40 layers + 2 * 32,000*5120.
    assert VICUNA_13B.total_params == 40 * (104_857_600 + 212_336_640) + 2 * 32_000 * 5120
    # Llama-2-13B's 13,015,864,320 less its 81 RMSNorm weight vectors of 5120.
    assert VICUNA_13B.total_params == 13_015_864_320 - 81 * 5120 == 13_015_449_600
    assert VICUNA_13B.checkpoint_bytes / GIB == pytest.approx(24.243, abs=0.001)
    assert kv_bytes_per_token(VICUNA_13B) == 2 * 40 * 40 * 128 * 2 == 819_200


def test_gated_models_json_is_unchanged_by_the_mlp_field() -> None:
    # mlp_projections is written only where it is not the gated default (3).
    for name in [*SEED000_TESTBEDS, "a100-vicuna-13b"]:
        assert '"mlp_projections"' not in (PROFILE_DIR / f"{name}.json").read_text(), name
    assert '"mlp_projections": 2' in (PROFILE_DIR / "a100-gptj-6b.json").read_text()
    for name, spec in (("a100-gptj-6b", GPT_J_6B), ("a100-vicuna-13b", VICUNA_13B)):
        cost = load_profile(name).cost
        assert cost.kind == "roofline"
        assert cost.model == spec


# --- KV capacity against vLLM's logs -----------------------------------------------------


def test_kv_memory_reproduces_vllm_logs_on_an_h100() -> None:
    # Qwen3-Coder-30B-A3B on an 80 GB card at 0.90, --max-num-seqs 8: vLLM logged
    # "GPU KV cache size: 150,272 tokens".
    few_seqs = VllmDeployment(max_num_seqs=8)
    weights = QWEN3_CODER_30B.checkpoint_bytes
    memory = kv_cache_memory_bytes(H100_SXM, QWEN3_CODER_30B, weights, few_seqs)
    assert memory / kv_bytes_per_token(QWEN3_CODER_30B) == pytest.approx(150_272, rel=0.05)
    # gpt-oss-120b, 65.97 GiB of weights (vLLM 0.10.1, Marlin): "Available KV cache
    # memory: -2.14 GiB" at the default 0.90 (vLLM issue #23278), 1.71 GiB at 0.95
    # (issue #27508).
    weights = 65.97 * GIB
    default = kv_cache_memory_bytes(H100_SXM, GPT_OSS_120B, weights, VllmDeployment())
    assert default / GIB == pytest.approx(-2.14, abs=0.3)
    high = VllmDeployment(gpu_memory_utilization=0.95)
    assert kv_cache_memory_bytes(H100_SXM, GPT_OSS_120B, weights, high) / GIB == pytest.approx(
        1.71, abs=0.3
    )


@pytest.mark.parametrize(
    ("name", "kv_tokens"),
    [
        # CUDA sees nvidia-smi's total less 0.467 GiB: H100 NVL 95830 MiB -> 93.117 GiB,
        # H200 NVL 143771 MiB -> 139.933 GiB. KV = 0.9 * that - weights - sampler peak
        # (38.7 B * 1024 seqs * vocab) - 0.13 GiB, over the KV bytes of one token.
        # Qwen: 83.805 - 56.870 - 5.607 - 0.13 = 21.198 GiB / 96 KiB.
        ("h100-qwen3-coder-30b", 21.198 * GIB / 98_304),
        # 125.940 - 56.870 - 5.607 - 0.13 = 63.333 GiB / 96 KiB.
        ("h200-qwen3-coder-30b", 63.333 * GIB / 98_304),
        # GPT-OSS: 83.805 - 64.38 - 7.421 - 0.13 = 11.874 GiB / 36 KiB.
        ("h100-gpt-oss-120b", 11.874 * GIB / 36_864),
        # 125.940 - 64.38 - 7.421 - 0.13 = 54.009 GiB / 36 KiB.
        ("h200-gpt-oss-120b", 54.009 * GIB / 36_864),
    ],
)
def test_testbed_kv_capacity_is_the_hand_derivation(name: str, kv_tokens: float) -> None:
    profile = load_profile(name)
    assert profile.block_size == 16
    assert profile.num_gpu_blocks * profile.block_size == pytest.approx(kv_tokens, rel=0.002)
    assert profile.cpu_kv_blocks == profile.num_gpu_blocks
    # PCIe Gen5 x16 (64 GB/s) at 80%.
    assert profile.cpu_kv_bandwidth_bytes_s == pytest.approx(51.2e9)


def test_testbed_limits_are_vllm_defaults_and_fit_one_longest_request() -> None:
    for name in TESTBEDS:
        profile = load_profile(name)
        gpu = TESTBED_PROFILES[name][0]
        limits = (profile.max_num_seqs, profile.max_num_batched_tokens)
        assert limits == vllm_batch_defaults(gpu)
        # Only seed 000's NVL cards have 70 GiB or more and are not A100s.
        assert limits == ((1024, 8192) if name in SEED000_TESTBEDS else (256, 2048)), name
        assert profile.max_model_len <= profile.num_gpu_blocks * profile.block_size
    # 262,144 positions need 24 GiB of KV; an H100 NVL at 0.9 has 21.2 GiB, so the
    # limit is what fits (vLLM would refuse to start at 262,144).
    assert load_profile("h100-qwen3-coder-30b").max_model_len == 14470 * 16
    assert load_profile("h200-qwen3-coder-30b").max_model_len == 262_144
    assert load_profile("h100-gpt-oss-120b").max_model_len == 131_072


def test_profile_files_are_what_the_derivation_gives() -> None:
    for name, (gpu, model, deployment) in TESTBED_PROFILES.items():
        shipped = PROFILE_DIR / f"{name}.json"
        expected = profile_json(derive_profile(name, gpu, model, deployment))
        assert shipped.read_text() == expected, name


def test_seed000_deployments_are_vllm_defaults() -> None:
    # Leaving the deployment out picks vLLM's defaults for the GPU.
    for name in SEED000_TESTBEDS:
        gpu, model, deployment = TESTBED_PROFILES[name]
        assert deployment == VllmDeployment()
        assert derive_profile(name, gpu, model) == load_profile(name)


# --- seed 001: A100 80GB, vLLM memory capped at 40 GiB -------------------------------------


def test_vllm_batch_defaults_follow_vllm_get_batch_defaults() -> None:
    # vLLM 0.32.0 EngineArgs.get_batch_defaults, OpenAI server.
    assert vllm_batch_defaults(H100_NVL) == (1024, 8192)
    assert vllm_batch_defaults(H200_NVL) == (1024, 8192)  # 139.9 GiB < 160
    assert vllm_batch_defaults(A100_SXM) == (256, 2048)  # 79.5 GiB, but an A100
    big = GpuSpec(
        name="NVIDIA B200",
        memory_bytes=180 * GIB,
        hbm_bandwidth_bytes_s=8e12,
        dense_bf16_flops=2.25e15,
        host_link_bytes_s=64e9,
    )
    assert vllm_batch_defaults(big) == (1024, 16384)
    small = big.model_copy(update={"name": "NVIDIA L40S", "memory_bytes": 45 * GIB})
    assert vllm_batch_defaults(small) == (256, 2048)


def test_seed001_memory_cap_is_40_gib_of_vllm_budget() -> None:
    # CUDA sees nvidia-smi's 81920 MiB less 0.467 GiB: 79.533 GiB.
    assert A100_SXM.memory_bytes / GIB == pytest.approx(81920 * MIB / GIB - 0.467, abs=0.001)
    budget = SEED001_A100.gpu_memory_utilization * A100_SXM.memory_bytes
    assert budget == pytest.approx(40 * GIB)
    assert SEED001_A100.gpu_memory_utilization == pytest.approx(0.5029, abs=1e-4)
    for name in ("a100-gptj-6b", "a100-vicuna-13b"):
        assert "memory capped at 40 GiB (gpu_memory_utilization 0.5029)" in (
            load_profile(name).description
        )


@pytest.mark.parametrize(
    ("name", "weights", "vocab", "per_token", "blocks"),
    [
        # 40 GiB - 12,100,042,752 B of weights - 38.7 B * 256 seqs * 50,400 (0.465 GiB)
        # - 0.13 GiB = 28.136 GiB of KV; over 16 tokens * 448 KiB = 7 MiB per block.
        ("a100-gptj-6b", 12_100_042_752, 50_400, 458_752, 4115),
        # 40 - 24.243 - 0.295 (38.7 * 256 * 32,000 B) - 0.13 = 15.332 GiB; over
        # 16 * 800 KiB = 12.5 MiB per block.
        ("a100-vicuna-13b", 26_030_899_200, 32_000, 819_200, 1255),
    ],
)
def test_a100_kv_capacity_is_the_hand_derivation(
    name: str, weights: int, vocab: int, per_token: int, blocks: int
) -> None:
    kv_bytes = 40 * GIB - weights - 38.7 * 256 * vocab - int(0.13 * GIB)
    assert int(kv_bytes // (16 * per_token)) == blocks
    profile = load_profile(name)
    assert profile.block_size == 16
    assert profile.kv_bytes_per_token == per_token
    assert profile.num_gpu_blocks == blocks
    assert profile.cpu_kv_blocks == blocks
    # PCIe Gen4 x16 (32 GB/s a direction) at 80%.
    assert profile.cpu_kv_bandwidth_bytes_s == pytest.approx(25.6e9)


def test_a100_context_limits_are_the_models() -> None:
    # Both models' full context fits: GPT-J 2048 of 65,840 tokens, Vicuna 4096 of 20,080.
    assert load_profile("a100-gptj-6b").max_model_len == 2048
    assert load_profile("a100-vicuna-13b").max_model_len == 4096


def test_a100_vicuna_decode_step_by_hand() -> None:
    model = CostModel(load_profile("a100-vicuna-13b"))
    bandwidth = 2.039e12 * 0.8
    compute = 312e12 * 0.5
    # One sequence at 2048 tokens: every weight but the input embedding (a row gather)
    # streamed once (memory-bound), then its KV read once, plus 1.5 ms.
    weights = (26_030_899_200 - 2 * 32_000 * 5120) / bandwidth
    linear_flops = 2 * 40 * (104_857_600 + 212_336_640) + 2 * 32_000 * 5120
    assert weights > linear_flops / compute
    kv = 2048 * 819_200 / bandwidth
    assert 2048 * 4 * 40 * 128 * 40 / compute < kv
    assert model.decode_time(2048, 1) == pytest.approx(0.0015 + weights + kv)
    # 10 blocks * 16 tokens * 819,200 B over 25.6 GB/s.
    assert model.transfer_time(10) == pytest.approx(10 * 16 * 819_200 / 25.6e9)


def test_a100_prefill_is_compute_bound_at_the_a100_peak() -> None:
    # One 2048-token GPT-J chunk from scratch: 2048 tokens * 11.27 GFLOP at 156 TFLOP/s
    # (50% of 312) for the GEMMs, the weights read once in less, attention on top.
    model = CostModel(load_profile("a100-gptj-6b"))
    linear = 2048 * 2 * 28 * (67_108_864 + 134_217_728) / (312e12 * 0.5)
    attention_flops = 4 * 16 * 256 * 28 * chunk_attention(2048, 0)
    attention_bytes = 458_752 * (chunk_attention(2048, 0) / 128 + 2048)
    attention = max(attention_flops / (312e12 * 0.5), attention_bytes / (2.039e12 * 0.8))
    assert model.prefill_time(2048) == pytest.approx(0.0015 + linear + attention)


# --- speed against public measurements and physical bounds --------------------------------


@pytest.mark.parametrize("published", PUBLISHED_STEPS, ids=lambda p: p.what[:40])
def test_h100_step_times_are_within_20_percent_of_published_vllm(
    published: PublishedStep,
) -> None:
    predicted = step_model(H100_SXM, published.model).step_time(published.shape)
    assert predicted == pytest.approx(published.measured_s, rel=0.2)


@pytest.mark.parametrize("name", TESTBEDS)
def test_throughput_stays_under_the_roofline_ceilings(name: str) -> None:
    profile = load_profile(name)
    model = CostModel(profile)
    cost = profile.cost
    assert cost.kind == "roofline"
    gpu, spec = cost.gpu, cost.model
    # Prefill can never beat peak FLOP/s on the linear layers alone...
    prefill_rate = 8192 / model.prefill_time(8192)
    assert prefill_rate < gpu.dense_bf16_flops / spec.linear_flops_per_token
    # ...and reaches a plausible fraction of it (public H100 runs: 20-50%).
    assert prefill_rate > 0.15 * gpu.dense_bf16_flops / spec.linear_flops_per_token
    # A decode step reads at least the dense weights at peak bandwidth.
    assert model.decode_time(2048, 1) > spec.dense_weight_bytes_read / gpu.hbm_bandwidth_bytes_s
    # Batching pays: 256 sequences decode far more tokens per second than one.
    assert 256 / model.decode_time(2048, 256) > 10 / model.decode_time(2048, 1)


@pytest.mark.parametrize("model_name", ["qwen3-coder-30b", "gpt-oss-120b"])
def test_h200_decodes_faster_and_prefills_as_fast_as_h100(model_name: str) -> None:
    h100 = CostModel(load_profile(f"h100-{model_name}"))
    h200 = CostModel(load_profile(f"h200-{model_name}"))
    # Same compute (835 TFLOP/s), 4.8 against 3.9 TB/s.
    assert h200.prefill_time(8192) == pytest.approx(h100.prefill_time(8192), rel=0.02)
    ratio = h100.decode_time(2048, 64) / h200.decode_time(2048, 64)
    assert 1.05 < ratio <= 4.8 / 3.9


# --- the model's properties -----------------------------------------------------------------

shapes = st.builds(
    StepShape,
    prefill_tokens=st.integers(0, 16_384),
    prefill_attention=st.integers(0, 10**9),
    decode_seqs=st.integers(0, 1024),
    decode_context=st.integers(0, 10**8),
)
growth = st.tuples(*(st.integers(0, 10**6) for _ in range(4)))


@pytest.mark.parametrize("name", TESTBEDS)
@given(shape=shapes, more=growth)
def test_more_work_is_never_faster(name: str, shape: StepShape, more: tuple[int, ...]) -> None:
    model = CostModel(load_profile(name))
    bigger = StepShape(
        shape.prefill_tokens + more[0],
        shape.prefill_attention + more[1],
        shape.decode_seqs + more[2],
        shape.decode_context + more[3],
    )
    assert 0 < model.step_time(shape) <= model.step_time(bigger)


@given(tokens=st.integers(1, 50_000), before=st.integers(0, 100_000), extra=st.integers(1, 5000))
def test_longer_prompts_and_contexts_take_longer(tokens: int, before: int, extra: int) -> None:
    for name in TESTBEDS:
        model = CostModel(load_profile(name))
        assert model.prefill_time(tokens, before) < model.prefill_time(tokens + extra, before)
        assert model.prefill_time(tokens, before) <= model.prefill_time(tokens, before + extra)
        assert model.decode_time(before + 1, 4) <= model.decode_time(before + 1 + extra, 4)


def test_fitted_step_time_and_chunked_prefill_by_hand() -> None:
    model = CostModel(fitted_profile())
    # 0.01 + 1e-4*100 + 1e-8*5050 + 1e-3*3 + 1e-6*3000
    assert model.step_time(StepShape(100, 5050, 3, 3000)) == pytest.approx(0.0260505)
    # 2500 tokens in chunks of 1000, 1000, 500 after 200 cached tokens:
    # attention 1000*(200+500.5) + 1000*(1200+500.5) + 500*(2200+250.5) = 3,626,250.
    assert chunk_attention(500, 2200) == 1_225_250
    assert model.prefill_time(2500, 200) == pytest.approx(3 * 0.01 + 0.25 + 0.0362625)
    assert model.prefill_time(0) == 0.0
    # Two sequences of 1000 tokens each read 2000 context tokens.
    assert model.decode_time(1000, 2) == pytest.approx(0.01 + 0.002 + 0.002)


def test_transfer_time_moves_block_bytes_at_the_tier_bandwidth() -> None:
    model = CostModel(load_profile("h100-qwen3-coder-30b"))
    # 10 blocks * 16 tokens * 98,304 B / 51.2 GB/s
    assert model.transfer_time(10) == pytest.approx(10 * 16 * 98_304 / 51.2e9)
    assert model.transfer_time(0) == 0.0


def test_step_time_is_cheap() -> None:
    # A budget, not a benchmark: the engine calls it up to ~10^6 times per run.
    model = CostModel(load_profile("h100-gpt-oss-120b"))
    shape = StepShape(512, 2_000_000, 64, 200_000)
    started = time.perf_counter()
    for _ in range(100_000):
        model.step_time(shape)
    assert time.perf_counter() - started < 2.0


# --- loading ------------------------------------------------------------------------------


def test_registered_names_include_the_testbeds() -> None:
    assert set(TESTBEDS) <= set(profile_names())


def test_unknown_profile_lists_the_known_names() -> None:
    with pytest.raises(ProfileError, match="unknown profile 'h300-x'") as caught:
        load_profile("h300-x")
    assert "h100-qwen3-coder-30b" in str(caught.value)


def test_a_profile_file_loads_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(profile_json(fitted_profile()))
    assert load_profile(str(path)) == fitted_profile()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("num_gpu_blocks"), "num_gpu_blocks: Field required"),
        (lambda d: d.update(block_size=0), "block_size: Input should be greater than 0"),
        (lambda d: d.update(colour="red"), "colour: Extra inputs are not permitted"),
        (lambda d: d["cost"].update(kind="magic"), "cost: Input tag 'magic'"),
        (lambda d: d["cost"].update(c3=-1.0), "cost.fitted.c3: Input should be greater"),
        (lambda d: d.update(max_model_len=10**6), "does not fit in the KV cache"),
        (lambda d: d.update(max_num_seqs=5000), "must be at least max_num_seqs"),
    ],
)
def test_bad_profile_files_say_which_field(tmp_path: Path, edit: object, message: str) -> None:
    data = json.loads(profile_json(fitted_profile()))
    assert callable(edit)
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"bad\.json") as caught:
        load_profile(str(path))
    assert message in str(caught.value)


def test_a_profile_that_is_not_json_says_so(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not readable JSON"):
        load_profile(str(path))
