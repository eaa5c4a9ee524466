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
    GPT_OSS_120B,
    H100_SXM,
    PUBLISHED_STEPS,
    QWEN3_CODER_30B,
    TESTBED_PROFILES,
    PublishedStep,
    VllmDeployment,
    derive_profile,
    kv_bytes_per_token,
    kv_cache_memory_bytes,
    step_model,
)
from agentmars.server.profiles.hardware import GIB

TESTBEDS = sorted(TESTBED_PROFILES)


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
        assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (1024, 8192)
        assert profile.max_model_len <= profile.num_gpu_blocks * profile.block_size
    # 262,144 positions need 24 GiB of KV; an H100 NVL at 0.9 has 21.2 GiB, so the
    # limit is what fits (vLLM would refuse to start at 262,144).
    assert load_profile("h100-qwen3-coder-30b").max_model_len == 14470 * 16
    assert load_profile("h200-qwen3-coder-30b").max_model_len == 262_144
    assert load_profile("h100-gpt-oss-120b").max_model_len == 131_072


def test_profile_files_are_what_the_derivation_gives() -> None:
    for name, (gpu, model) in TESTBED_PROFILES.items():
        shipped = PROFILE_DIR / f"{name}.json"
        assert shipped.read_text() == profile_json(derive_profile(name, gpu, model)), name


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
