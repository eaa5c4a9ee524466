"""The GPU profiles, derived from first principles; this module writes their JSON files.

Seed 000 §6.2's testbeds (one GPU, TP=1): an NVIDIA H100 NVL and an H200 NVL, each
serving Qwen3-Coder-30B-A3B-Instruct (262K context) or GPT-OSS-120B (131K context)
on vLLM with its defaults. Seed 001 §4's testbed: an A100 80GB SXM serving GPT-J 6B or
Vicuna-13B v1.5 with vLLM's memory capped at 40 GB (its Llama-3-70B on two A100s,
TP=2, has no profile: the roofline models one GPU, docs/cost-model.md says why). Seed
002 §IV-A's testbeds: an RTX A5000 and an RTX 5090, each serving Qwen2.5-3B, Qwen2.5-7B
or Llama-3-8B on vLLM with its defaults. For each pair this derives what the simulated
engine needs: KV capacity in blocks (vLLM's own memory arithmetic), the scheduler
limits (vLLM's defaults for that GPU) and the roofline cost inputs; for seed 002's
GPUs also the throughput-versus-SM-share curves of its Fig. 3 (``sm_share_curves``),
modelled from the same roofline. docs/cost-model.md writes every derivation out with
its sources.

Regenerate the JSON files after changing anything here, and print the derived
figures the docs quote::

    python -m agentmars.server.profiles.gpu_profiles write
    python -m agentmars.server.profiles.gpu_profiles report
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from agentmars.server.profiles.cost_model import (
    PROFILE_DIR,
    SM_PHASES,
    CostModel,
    Profile,
    RooflineCost,
    SmShareCurve,
    StepShape,
    StepTime,
    chunk_attention,
    profile_json,
    roofline_step_time,
)
from agentmars.server.profiles.hardware import GIB, MIB, GpuSpec, ModelSpec

# NOTE: CUDA (hence vLLM) sees ~0.47 GiB less than nvidia-smi's total: measured on an
# H100 80GB, 81559 MiB in nvidia-smi against 79.18 GiB in vLLM's log. Applied to both
# NVL cards and the A100, whose nvidia-smi totals are known (the A100's drops out of
# its KV capacity: seed 001 caps vLLM's memory at a size, not a fraction).
CUDA_RESERVED_BYTES = 81559 * MIB - int(79.18 * GIB)
PCIE_GEN5_X16_BYTES_S = 64e9
PCIE_GEN4_X16_BYTES_S = 32e9

H100_NVL = GpuSpec(
    name="NVIDIA H100 NVL",
    memory_bytes=95830 * MIB - CUDA_RESERVED_BYTES,
    hbm_bandwidth_bytes_s=3.9e12,
    dense_bf16_flops=835e12,
    host_link_bytes_s=PCIE_GEN5_X16_BYTES_S,
)
H200_NVL = GpuSpec(
    name="NVIDIA H200 NVL",
    memory_bytes=143771 * MIB - CUDA_RESERVED_BYTES,
    hbm_bandwidth_bytes_s=4.8e12,
    dense_bf16_flops=835e12,
    host_link_bytes_s=PCIE_GEN5_X16_BYTES_S,
)
H100_SXM = GpuSpec(
    name="NVIDIA H100 SXM 80GB",
    memory_bytes=int(79.18 * GIB),
    hbm_bandwidth_bytes_s=3.35e12,
    dense_bf16_flops=989e12,
    host_link_bytes_s=PCIE_GEN5_X16_BYTES_S,
)
"""Not a testbed: the GPU of the public vLLM measurements the efficiencies are checked
against (tests/server/profiles/test_cost_model.py)."""
A100_SXM = GpuSpec(
    name="NVIDIA A100-SXM4-80GB",
    memory_bytes=81920 * MIB - CUDA_RESERVED_BYTES,
    hbm_bandwidth_bytes_s=2.039e12,
    dense_bf16_flops=312e12,
    host_link_bytes_s=PCIE_GEN4_X16_BYTES_S,
)
"""Seed 001's GPU (named as CUDA reports it: vLLM's A100 check reads this name). NVLink
joins its two A100s; a TP=1 engine's KV traffic to the host goes over PCIe."""
RTX_A5000 = GpuSpec(
    name="NVIDIA RTX A5000",
    memory_bytes=24564 * MIB - CUDA_RESERVED_BYTES,
    hbm_bandwidth_bytes_s=768e9,
    dense_bf16_flops=111.1e12,
    host_link_bytes_s=PCIE_GEN4_X16_BYTES_S,
)
"""Seed 002's mid-range GPU (GA102, 64 SMs, 24 GB GDDR6). Dense BF16 with FP32
accumulate is the datasheet's 222.2 sparse tensor TFLOPS halved: on the professional
GA102 cards FP32 accumulation runs at the full FP16 rate (GA102 whitepaper, RTX A6000
column), unlike the GeForce ones, where it is halved."""
RTX_5090 = GpuSpec(
    name="NVIDIA GeForce RTX 5090",
    memory_bytes=32607 * MIB - CUDA_RESERVED_BYTES,
    hbm_bandwidth_bytes_s=1792e9,
    dense_bf16_flops=209.5e12,
    host_link_bytes_s=PCIE_GEN5_X16_BYTES_S,
)
"""Seed 002's high-end GPU (GB202, 170 SMs, 32 GB GDDR7). Dense BF16 with FP32 accumulate
(what BF16 GEMMs use) is 209.5 TFLOPS: a GeForce card runs FP32 accumulation at half
the 419 TFLOPS of FP16 accumulation (Blackwell RTX whitepaper, RTX 5090 column)."""

QWEN3_CODER_30B = ModelSpec(
    name="Qwen/Qwen3-Coder-30B-A3B-Instruct",
    num_hidden_layers=48,
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    max_position_embeddings=262144,
)
GPT_OSS_120B = ModelSpec(
    name="openai/gpt-oss-120b",
    num_hidden_layers=36,
    hidden_size=2880,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=201088,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=4,
    moe_intermediate_size=2880,
    sliding_window=128,
    sliding_window_layers=18,
    max_position_embeddings=131072,
    expert_weight_bits=4.25,
)
GPT_J_6B = ModelSpec(
    name="EleutherAI/gpt-j-6b",
    num_hidden_layers=28,
    hidden_size=4096,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=256,
    vocab_size=50400,
    tie_word_embeddings=False,
    moe_intermediate_size=16384,
    mlp_projections=2,
    max_position_embeddings=2048,
)
"""config.json names: n_layer, n_embd, n_head (head_dim = 4096 / 16), n_inner null
(= 4 x n_embd, an ungated GELU MLP), n_positions. Rotary on 64 of the 256 dimensions
(rotary_dim) and the parallel attention/MLP block change no FLOP or byte here."""
VICUNA_13B = ModelSpec(
    name="lmsys/vicuna-13b-v1.5",
    num_hidden_layers=40,
    hidden_size=5120,
    num_attention_heads=40,
    num_key_value_heads=40,
    head_dim=128,
    vocab_size=32000,
    tie_word_embeddings=False,
    moe_intermediate_size=13824,
    max_position_embeddings=4096,
)
"""Llama-2-13B's architecture (LlamaForCausalLM, fine-tuned)."""
QWEN25_3B = ModelSpec(
    name="Qwen/Qwen2.5-3B-Instruct",
    num_hidden_layers=36,
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
    moe_intermediate_size=11008,
    max_position_embeddings=32768,
)
"""config.json: head_dim = 2048 / 16; the output projection is the input embedding
(tie_word_embeddings), so it is stored and read once. The q/k/v biases (Qwen2) are left
out (0.02% of the weights)."""
QWEN25_7B = ModelSpec(
    name="Qwen/Qwen2.5-7B-Instruct",
    num_hidden_layers=28,
    hidden_size=3584,
    num_attention_heads=28,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=152064,
    tie_word_embeddings=False,
    moe_intermediate_size=18944,
    max_position_embeddings=32768,
)
"""config.json: head_dim = 3584 / 28; 32,768 positions (131,072 only with YaRN
rope_scaling, which the config leaves off). q/k/v biases left out."""
LLAMA3_8B = ModelSpec(
    name="meta-llama/Meta-Llama-3-8B-Instruct",
    num_hidden_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    tie_word_embeddings=False,
    moe_intermediate_size=14336,
    max_position_embeddings=8192,
)
# NOTE: seed 002 names "Qwen2.5-3B", "Qwen2.5-7B" and "LLaMA-3-8B"; its agents emit
# structured tool calls, so we take the Instruct checkpoints (the same architectures as
# the base ones; Qwen2.5-7B's base config.json says 131,072 positions, its Instruct
# 32,768).


@dataclass(frozen=True)
class VllmDeployment:
    """How vLLM's OpenAI server is run. The defaults are vLLM's on a GPU with 70 to 160
    GiB, not an A100 (vLLM 0.32.0 ``EngineArgs.get_batch_defaults`` in
    vllm/engine/arg_utils.py; ``CacheConfig.DEFAULT_BLOCK_SIZE`` in vllm/config/cache.py,
    which FlashAttention keeps on Hopper and Ampere); ``vllm_deployment`` picks the batch
    limits for a given GPU."""

    setting: str = "vLLM defaults"
    """How the profile's description names this deployment."""
    sources: str = "vllm"
    """The ``SOURCES`` entry for these settings."""
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    non_torch_bytes: int = int(0.13 * GIB)
    """CUDA context and NCCL buffers outside PyTorch's allocator (vLLM logs, H100)."""
    sampler_bytes_per_seq_vocab: float = 38.7
    """vLLM's profiling run peaks at about this many bytes per (sequence slot x
    vocabulary entry): its dummy sampler pass holds several fp32 copies of
    ``max_num_seqs`` rows of logits. Fitted to vLLM's logged peak activation on an
    H100 at ``max_num_seqs`` 1024: 5.56 and 5.64 GiB (Qwen3-0.6B, Qwen3-32B, vocabulary
    151,936), 4.76 GiB (Llama-3.1-8B, 128,256), 7.38 GiB (gpt-oss-20b, 201,088) --
    38.4 to 38.9 bytes, whatever the model's size."""
    cpu_tier_ratio: float = 1.0
    """CPU KV tier capacity over GPU KV capacity. NOTE: ours, MORI's tight setting
    (seed 003 §6.1: CPU-to-GPU capacity ratio 1x, relaxed 2x)."""
    host_link_efficiency: float = 0.8
    """Achieved over theoretical PCIe bandwidth for pinned-memory copies (ours)."""


def vllm_batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` vLLM gives its OpenAI server on ``gpu``
    (vLLM 0.32.0 ``EngineArgs.get_batch_defaults``): 1024 and 16384 from 160 GiB of
    memory; 1024 and 8192 from 70 GiB unless the device name says A100 (vLLM PR #17885:
    the larger budget lowered A100 throughput); 256 and 2048 below. vLLM reads NVML's
    total (nvidia-smi's) where this reads CUDA's; no card here sits between the two."""
    if gpu.memory_bytes >= 160 * GIB:
        return 1024, 16384
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return 1024, 8192
    return 256, 2048


def vllm_deployment(
    gpu: GpuSpec, memory_cap_bytes: int | None = None, sources: str = "vllm"
) -> VllmDeployment:
    """vLLM's OpenAI server on ``gpu`` with its defaults; with ``memory_cap_bytes``, the
    ``gpu_memory_utilization`` that gives vLLM that much of the GPU's memory."""
    seqs, tokens = vllm_batch_defaults(gpu)
    deployment = VllmDeployment(max_num_seqs=seqs, max_num_batched_tokens=tokens, sources=sources)
    if memory_cap_bytes is None:
        return deployment
    return replace(
        deployment,
        setting=f"vLLM defaults, memory capped at {memory_cap_bytes / GIB:g} GiB",
        gpu_memory_utilization=memory_cap_bytes / gpu.memory_bytes,
    )


# NOTE: seed 001 §4 caps GPU memory at "40 GB" for GPT-J 6B and Vicuna 13B (to match
# INFERCEPT) without saying how; we read it as vLLM's whole budget (what
# gpu_memory_utilization sets: weights, activations and KV cache) and as 40 GiB, the
# unit the paper's "80 GB" A100 is counted in (81920 MiB) and INFERCEPT's vLLM fork
# calls GB (vllm/config.py: _GB = 1 << 30). gpu_memory_utilization 0.5 (39.77 GiB) or
# 40e9 bytes (37.25 GiB) would leave Vicuna 1.5% or 18% less KV.
SEED001_MEMORY_CAP_BYTES = 40 * GIB
SEED001_A100 = vllm_deployment(A100_SXM, SEED001_MEMORY_CAP_BYTES, sources="vllm-a100")
# NOTE: seed 002 runs AgentServe on llama.cpp and compares with vLLM, SGLang and
# llama.cpp without stating their settings; the simulated engine mirrors vLLM, so its
# GPUs get vLLM's defaults (under 70 GiB: 256 sequences, 2048 batched tokens).
SEED002_A5000 = vllm_deployment(RTX_A5000, sources="vllm-consumer")
SEED002_5090 = vllm_deployment(RTX_5090, sources="vllm-consumer")


@dataclass(frozen=True)
class Efficiency:
    """How close vLLM's kernels get to the roofline for one model (on Hopper; the A100
    profiles reuse the BF16 figures)."""

    linear: float
    attention: float
    bandwidth: float
    step_overhead_s: float


# NOTE: ours, checked against public vLLM measurements on an H100 SXM (docs/cost-model.md
# "Validation"; tests/server/profiles/test_cost_model.py): BF16 fused-MoE GEMMs and FA3 at
# half of peak, weight streaming at 80% of HBM bandwidth; GPT-OSS's MXFP4 experts run
# as weight-only FP4 (dequantised to BF16, no FP4 tensor cores on Hopper), which the
# published prefill and decode times put at about 30% of peak and 60% of bandwidth.
BF16_EFFICIENCY = Efficiency(linear=0.5, attention=0.5, bandwidth=0.8, step_overhead_s=0.0015)
# NOTE: ours, not checked against any A100 measurement: GPT-J and Vicuna on the A100 are
# 16-bit dense GEMMs and FlashAttention (FA2 on Ampere), so they get Qwen3-Coder's BF16
# figures, as fractions of the A100's own peak and bandwidth.
# NOTE: ours, not checked against any measurement on these GPUs: Qwen2.5 and Llama-3 on
# the RTX A5000 (Ampere, FA2) and RTX 5090 (Blackwell) are 16-bit dense GEMMs and
# FlashAttention too, so they get the same BF16 figures, as fractions of each GPU's own
# peak and bandwidth.
EFFICIENCY = {
    QWEN3_CODER_30B.name: BF16_EFFICIENCY,
    GPT_OSS_120B.name: Efficiency(linear=0.3, attention=0.35, bandwidth=0.6, step_overhead_s=0.003),
    GPT_J_6B.name: BF16_EFFICIENCY,
    VICUNA_13B.name: BF16_EFFICIENCY,
    QWEN25_3B.name: BF16_EFFICIENCY,
    QWEN25_7B.name: BF16_EFFICIENCY,
    LLAMA3_8B.name: BF16_EFFICIENCY,
}

WEIGHT_MEMORY_BYTES = {
    QWEN3_CODER_30B.name: QWEN3_CODER_30B.checkpoint_bytes,
    # vLLM's Hopper MXFP4 path re-lays out the experts: "Model loading took 64.38 GiB"
    # (vLLM issue #33155, v0.14.1, Triton backend) against 60.7 GiB of checkpoint.
    GPT_OSS_120B.name: 64.38 * GIB,
    # GPT-J's checkpoint is float32; vLLM's dtype "auto" serves float32 models in the
    # platform's first dtype, BF16 on an A100 (vllm/config/model.py _resolve_auto_dtype).
    GPT_J_6B.name: GPT_J_6B.checkpoint_bytes,
    VICUNA_13B.name: VICUNA_13B.checkpoint_bytes,
    # BF16 checkpoints, served as stored (dtype "auto").
    QWEN25_3B.name: QWEN25_3B.checkpoint_bytes,
    QWEN25_7B.name: QWEN25_7B.checkpoint_bytes,
    LLAMA3_8B.name: LLAMA3_8B.checkpoint_bytes,
}


def kv_block_group_layers(model: ModelSpec) -> int:
    """Layers whose KV one block id stands for. vLLM's hybrid KV manager groups GPT-OSS's
    18 full and 18 sliding-window layers into two groups of 18 sharing one block pool
    (``_get_kv_cache_groups_uniform_page_size``), so a block holds ``block_size`` tokens
    of 18 layers; a uniform model's block covers all its layers."""
    full, window = model.full_attention_layers, model.sliding_window_layers
    if window == 0:
        return full
    smallest, largest = min(full, window), max(full, window)
    return largest if largest < 1.5 * smallest else smallest


def kv_bytes_per_token(model: ModelSpec) -> int:
    """KV bytes one token of context occupies in one block."""
    return kv_block_group_layers(model) * model.kv_bytes_per_token_per_layer


def kv_cache_memory_bytes(
    gpu: GpuSpec, model: ModelSpec, weight_bytes: float, deployment: VllmDeployment
) -> float:
    """What vLLM leaves for the KV cache: utilisation x memory, less the weights, the
    profiling run's peak activations and non-torch memory (negative: vLLM refuses to
    start)."""
    budget = deployment.gpu_memory_utilization * gpu.memory_bytes
    sampler = deployment.sampler_bytes_per_seq_vocab * deployment.max_num_seqs * model.vocab_size
    return budget - weight_bytes - sampler - deployment.non_torch_bytes


def derive_profile(
    name: str, gpu: GpuSpec, model: ModelSpec, deployment: VllmDeployment | None = None
) -> Profile:
    """The profile of ``model`` served by vLLM on one ``gpu``."""
    deployment = deployment or vllm_deployment(gpu)
    per_token = kv_bytes_per_token(model)
    kv_bytes = kv_cache_memory_bytes(gpu, model, WEIGHT_MEMORY_BYTES[model.name], deployment)
    blocks = int(kv_bytes // (per_token * deployment.block_size))
    if blocks <= 0:
        raise ValueError(f"{model.name} leaves no KV cache memory on {gpu.name}")
    curves = sm_share_curves(gpu, model, deployment) if gpu.name in SM_PARTITION else {}
    return Profile(
        name=name,
        description=(
            f"{model.name} on one {gpu.name}, {deployment.setting} "
            f"(gpu_memory_utilization {deployment.gpu_memory_utilization:.4g}); "
            "derived in docs/cost-model.md"
        ),
        sources=[
            *SOURCES.get(model.name, []),
            *SOURCES.get(gpu.name, []),
            *SOURCES[deployment.sources],
            *(SOURCES["sm-share"] if curves else []),
        ],
        block_size=deployment.block_size,
        num_gpu_blocks=blocks,
        # NOTE: vLLM refuses to start when one max-length request does not fit; the
        # context limit is then lowered to what fits (vLLM's suggested --max-model-len).
        max_model_len=min(model.max_position_embeddings, blocks * deployment.block_size),
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        kv_bytes_per_token=per_token,
        cpu_kv_blocks=int(blocks * deployment.cpu_tier_ratio),
        cpu_kv_bandwidth_bytes_s=gpu.host_link_bytes_s * deployment.host_link_efficiency,
        cost=roofline_cost(gpu, model),
        sm_share_curves=curves,
    )


def roofline_cost(gpu: GpuSpec, model: ModelSpec) -> RooflineCost:
    """The step-time model of ``model`` on ``gpu`` with this module's efficiencies."""
    efficiency = EFFICIENCY[model.name]
    return RooflineCost(
        gpu=gpu,
        model=model,
        linear_efficiency=efficiency.linear,
        attention_efficiency=efficiency.attention,
        bandwidth_efficiency=efficiency.bandwidth,
        step_overhead_s=efficiency.step_overhead_s,
    )


# --- seed 002: throughput versus SM share (Fig. 3), modelled --------------------------------


@dataclass(frozen=True)
class SmPartition:
    """What decides how many of a GPU's SMs it takes to saturate its DRAM bandwidth."""

    sms: int
    """SMs on the card (datasheet)."""
    threads_per_sm: int = 1536
    """Resident threads per SM: the maximum on compute capability 8.6 (GA102) and 12.0
    (GB202) (CUDA programming guide, compute capabilities table)."""
    load_bytes_per_thread: int = 16
    """Bytes each resident thread has in flight. NOTE: ours, one 128-bit load per
    thread, a weight-streaming kernel at full occupancy."""
    dram_latency_s: float = 600e-9
    """Loaded DRAM latency. NOTE: ours, for GDDR6 and GDDR7 alike, unmeasured."""


SM_PARTITION = {
    RTX_A5000.name: SmPartition(sms=64),
    # NOTE: seed 002 §IV-A gives the RTX 5090 "16384 CUDA cores, 128 SMs" (the RTX 4090's
    # figures); the shipping card has 21,760 cores in 170 SMs, and the bandwidth is
    # shared among those. Shares are fractions, so the count enters only here.
    RTX_5090.name: SmPartition(sms=170),
}

SM_SHARES = tuple(tenths / 10 for tenths in range(1, 11))
"""Seed 002 §III-C's ten pre-built Green Contexts: 10% to 100% of the SMs."""
# NOTE: ours, the phases' work on which the curves are computed, from seed 002's Table I
# and §IV: four agents decoding (its ablation's N = 4, within its 3 to 6) at 3,000 tokens
# of context (its cold prefills are 2.5K to 3.5K tokens); a cold prefill of 3,000
# tokens from nothing; a resume prefill of 56 tokens (ReAct's mean) after 3,000 cached.
SM_CURVE_CONTEXT = 3000
SM_CURVE_DECODE_SEQS = 4
SM_CURVE_RESUME_TOKENS = 56


def bandwidth_saturation_share(gpu: GpuSpec, model: ModelSpec) -> float:
    """The SM share past which more SMs add no DRAM bandwidth (Little's law): the bytes
    in flight the achieved bandwidth needs, ``bandwidth x e_bw x latency``, over what
    all the SMs hold in flight."""
    partition = SM_PARTITION[gpu.name]
    needed = gpu.hbm_bandwidth_bytes_s * EFFICIENCY[model.name].bandwidth
    needed *= partition.dram_latency_s
    per_sm = partition.threads_per_sm * partition.load_bytes_per_thread
    return min(1.0, needed / (partition.sms * per_sm))


def partition_cost(cost: RooflineCost, share: float, saturation: float) -> RooflineCost:
    """The roofline on ``share`` of the SMs: ``share`` of the peak FLOP/s and of the DRAM
    bandwidth ``min(1, share / saturation)``; the per-step overhead (host side) kept."""
    gpu = cost.gpu
    scaled = gpu.model_copy(
        update={
            "dense_bf16_flops": gpu.dense_bf16_flops * share,
            "hbm_bandwidth_bytes_s": gpu.hbm_bandwidth_bytes_s * min(1.0, share / saturation),
        }
    )
    return cost.model_copy(update={"gpu": scaled})


def phase_time(step_time: StepTime, phase: str, chunk: int) -> float:
    """Seconds the representative work of ``phase`` takes (``SM_CURVE_*``); a cold
    prefill runs in chunks of ``chunk`` tokens."""
    context = SM_CURVE_CONTEXT
    if phase == "decode":
        seqs = SM_CURVE_DECODE_SEQS
        return step_time(StepShape(decode_seqs=seqs, decode_context=seqs * context))
    if phase == "resume_prefill":
        tokens = SM_CURVE_RESUME_TOKENS
        return step_time(StepShape(tokens, chunk_attention(tokens, context)))
    if phase != "cold_prefill":
        raise ValueError(f"unknown phase {phase!r}")
    total, done = 0.0, 0
    while done < context:
        tokens = min(chunk, context - done)
        total += step_time(StepShape(tokens, chunk_attention(tokens, done)))
        done += tokens
    return total


def sm_share_curves(
    gpu: GpuSpec, model: ModelSpec, deployment: VllmDeployment
) -> dict[str, SmShareCurve]:
    """Seed 002's Fig. 3, modelled: each phase's throughput on ``SM_SHARES`` of the SMs
    over its throughput on all of them (docs/cost-model.md)."""
    cost = roofline_cost(gpu, model)
    saturation = bandwidth_saturation_share(gpu, model)
    chunk = deployment.max_num_batched_tokens
    curves: dict[str, SmShareCurve] = {}
    for phase in SM_PHASES:
        full = phase_time(roofline_step_time(cost), phase, chunk)
        curves[phase] = tuple(
            (
                share,
                round(
                    full
                    / phase_time(
                        roofline_step_time(partition_cost(cost, share, saturation)), phase, chunk
                    ),
                    4,
                ),
            )
            for share in SM_SHARES
        )
    return curves


SOURCES: dict[str, list[str]] = {
    QWEN3_CODER_30B.name: [
        "model: huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct config.json (48 layers, "
        "hidden 2048, 32 q / 4 kv heads, head_dim 128, 128 experts top-8, "
        "moe_intermediate 768, vocab 151936, BF16, 262144 positions)",
        "weights: 61,064,216,576 bytes of BF16 safetensors (56.87 GiB); vLLM logs 56.93 GiB",
    ],
    GPT_OSS_120B.name: [
        "model: huggingface.co/openai/gpt-oss-120b config.json (36 layers alternating "
        "sliding-window 128 / full, hidden 2880, 64 q / 8 kv heads, head_dim 64, "
        "128 experts top-4, intermediate 2880, vocab 201088, MXFP4 experts, 131072 positions)",
        "weights in GPU memory: 64.38 GiB, vLLM log in github.com/vllm-project/vllm/issues/33155",
    ],
    H100_NVL.name: [
        "gpu: NVIDIA H100 NVL datasheet (94 GB HBM3, 3.9 TB/s, BF16 1,671 TFLOPS with "
        "sparsity = 835 dense, PCIe Gen5 x16); nvidia-smi total 95830 MiB",
    ],
    H200_NVL.name: [
        "gpu: NVIDIA H200 NVL datasheet (141 GB HBM3e, 4.8 TB/s, BF16 1,671 TFLOPS with "
        "sparsity = 835 dense, PCIe Gen5 x16); nvidia-smi total 143771 MiB",
    ],
    GPT_J_6B.name: [
        "model: huggingface.co/EleutherAI/gpt-j-6b config.json (n_layer 28, n_embd 4096, "
        "n_head 16 -> head_dim 256, n_inner null -> 16384 ungated MLP, rotary_dim 64, "
        "vocab_size 50400 untied, n_positions 2048; float32 checkpoint, served in BF16)",
        "weights: 6,050,021,376 parameters without norms and biases (model card "
        "6,053,381,344) x 2 B = 11.27 GiB in GPU memory",
    ],
    VICUNA_13B.name: [
        "model: huggingface.co/lmsys/vicuna-13b-v1.5 config.json (Llama-2-13B: 40 layers, "
        "hidden 5120, 40 q / 40 kv heads, head_dim 128, intermediate 13824, vocab 32000, "
        "FP16, 4096 positions)",
        "weights: 13,015,449,600 parameters without norms (Llama-2-13B: 13,015,864,320) "
        "x 2 B = 24.24 GiB",
    ],
    A100_SXM.name: [
        "gpu: NVIDIA A100 datasheet, 80GB SXM (80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS "
        "dense, PCIe Gen4 x16 = 32 GB/s a direction); nvidia-smi total 81920 MiB",
    ],
    QWEN25_3B.name: [
        "model: huggingface.co/Qwen/Qwen2.5-3B-Instruct config.json (36 layers, hidden 2048, "
        "16 q / 2 kv heads, head_dim 128, intermediate 11008, vocab 151936 tied, BF16, "
        "32768 positions)",
        "weights: 3,085,697,024 parameters without norms and q/k/v biases (model card 3.09B) "
        "x 2 B = 5.748 GiB",
    ],
    QWEN25_7B.name: [
        "model: huggingface.co/Qwen/Qwen2.5-7B-Instruct config.json (28 layers, hidden 3584, "
        "28 q / 4 kv heads, head_dim 128, intermediate 18944, vocab 152064 untied, BF16, "
        "32768 positions; 131072 with YaRN, off by default)",
        "weights: 7,615,283,200 parameters without norms and q/k/v biases (model card 7.61B) "
        "x 2 B = 14.185 GiB",
    ],
    LLAMA3_8B.name: [
        "model: huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct config.json (32 layers, "
        "hidden 4096, 32 q / 8 kv heads, head_dim 128, intermediate 14336, vocab 128256 "
        "untied, BF16, 8192 positions)",
        "weights: 8,029,995,008 parameters without norms (8,030,261,248 with them) x 2 B = "
        "14.957 GiB",
    ],
    RTX_A5000.name: [
        "gpu: NVIDIA RTX A5000 datasheet (64 SMs per seed 002, 8192 CUDA cores, 24 GB GDDR6, "
        "768 GB/s, tensor 222.2 TFLOPS with sparsity = 111.1 dense, FP32 accumulate at full "
        "rate on professional GA102 per the GA102 whitepaper, PCIe Gen4 x16); "
        "nvidia-smi total 24564 MiB",
    ],
    RTX_5090.name: [
        "gpu: NVIDIA GeForce RTX 5090 (Blackwell RTX whitepaper: 170 SMs, 21760 CUDA cores, "
        "32 GB GDDR7, 1792 GB/s, FP16/BF16 tensor with FP32 accumulate 209.5 TFLOPS dense, "
        "PCIe Gen5 x16); nvidia-smi total 32607 MiB; seed 002 says 128 SMs",
    ],
    "vllm": [
        "vLLM 0.32.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: OpenAI server "
        "on a 70-160 GiB non-A100 GPU -> max_num_batched_tokens 8192, max_num_seqs 1024; "
        "gpu_memory_utilization 0.9; vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE 16",
        "KV groups: vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size",
        "KV memory: sampler peak 38.7 B x max_num_seqs x vocab and 0.13 GiB non-torch, "
        "fitted to vLLM's logs on an H100 (docs/cost-model.md)",
        "efficiencies: ours, checked against public vLLM step times on an H100 "
        "(docs/cost-model.md, Validation)",
        "CPU tier 1x GPU KV capacity (seed 003 §6.1); PCIe Gen5 x16 64 GB/s at 80%",
    ],
    "vllm-a100": [
        "seed 001 §4: two A100 80GB, GPT-J 6B and Vicuna 13B with GPU memory capped at "
        "40 GB (read as 40 GiB of vLLM budget: gpu_memory_utilization = 40 GiB / memory), "
        "one GPU each",
        "vLLM 0.32.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: OpenAI server "
        "on an A100 -> max_num_batched_tokens 2048, max_num_seqs 256; "
        "vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE 16",
        "KV memory: sampler peak 38.7 B x max_num_seqs x vocab and 0.13 GiB non-torch, "
        "fitted to vLLM's logs on an H100 (docs/cost-model.md)",
        "efficiencies: ours, the BF16 figures checked on an H100, not checked on an A100 "
        "(docs/cost-model.md)",
        "CPU tier 1x GPU KV capacity (seed 003 §6.1); PCIe Gen4 x16 32 GB/s at 80%",
    ],
    "vllm-consumer": [
        "seed 002 §IV-A: one RTX A5000 or RTX 5090 serving Qwen2.5-3B, Qwen2.5-7B or "
        "Llama-3-8B; vLLM's defaults (the paper's own engine is llama.cpp)",
        "vLLM 0.32.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: OpenAI server "
        "on a GPU under 70 GiB -> max_num_batched_tokens 2048, max_num_seqs 256; "
        "gpu_memory_utilization 0.9; vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE 16",
        "KV memory: sampler peak 38.7 B x max_num_seqs x vocab and 0.13 GiB non-torch, "
        "fitted to vLLM's logs on an H100 (docs/cost-model.md)",
        "efficiencies: ours, the BF16 figures checked on an H100, not checked on these GPUs "
        "(docs/cost-model.md)",
        "CPU tier 1x GPU KV capacity (seed 003 §6.1); PCIe at 80% (Gen4 x16 32 GB/s on the "
        "A5000, Gen5 x16 64 GB/s on the 5090)",
    ],
    "sm-share": [
        "sm_share_curves: modelled, not measured (seed 002 Fig. 3 publishes only their "
        "shape): the roofline on a share of the SMs, DRAM bandwidth saturating past "
        "the share Little's law gives (docs/cost-model.md)",
    ],
}

TESTBED_PROFILES: dict[str, tuple[GpuSpec, ModelSpec, VllmDeployment]] = {
    # Seed 000 §6.2, vLLM's defaults.
    "h100-qwen3-coder-30b": (H100_NVL, QWEN3_CODER_30B, vllm_deployment(H100_NVL)),
    "h200-qwen3-coder-30b": (H200_NVL, QWEN3_CODER_30B, vllm_deployment(H200_NVL)),
    "h100-gpt-oss-120b": (H100_NVL, GPT_OSS_120B, vllm_deployment(H100_NVL)),
    "h200-gpt-oss-120b": (H200_NVL, GPT_OSS_120B, vllm_deployment(H200_NVL)),
    # Seed 001 §4, memory capped at 40 GiB.
    "a100-gptj-6b": (A100_SXM, GPT_J_6B, SEED001_A100),
    "a100-vicuna-13b": (A100_SXM, VICUNA_13B, SEED001_A100),
    # Seed 002 §IV-A, vLLM's defaults, with throughput-versus-SM-share curves.
    "rtx-a5000-qwen2.5-3b": (RTX_A5000, QWEN25_3B, SEED002_A5000),
    "rtx-a5000-qwen2.5-7b": (RTX_A5000, QWEN25_7B, SEED002_A5000),
    "rtx-a5000-llama3-8b": (RTX_A5000, LLAMA3_8B, SEED002_A5000),
    "rtx5090-qwen2.5-3b": (RTX_5090, QWEN25_3B, SEED002_5090),
    "rtx5090-qwen2.5-7b": (RTX_5090, QWEN25_7B, SEED002_5090),
    "rtx5090-llama3-8b": (RTX_5090, LLAMA3_8B, SEED002_5090),
}


def testbed_profiles() -> list[Profile]:
    """The testbed profiles (seeds 000, 001 and 002), derived now."""
    return [
        derive_profile(name, gpu, model, deployment)
        for name, (gpu, model, deployment) in TESTBED_PROFILES.items()
    ]


def step_model(gpu: GpuSpec, model: ModelSpec) -> CostModel:
    """The roofline step times of ``model`` on ``gpu`` with this module's efficiencies,
    whatever the KV capacity (for comparisons with published measurements)."""
    deployment = VllmDeployment()
    profile = Profile(
        name=f"{gpu.name} / {model.name}",
        description="step times only",
        sources=[],
        block_size=deployment.block_size,
        num_gpu_blocks=model.max_position_embeddings,
        max_model_len=model.max_position_embeddings,
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        kv_bytes_per_token=kv_bytes_per_token(model),
        cpu_kv_blocks=0,
        cpu_kv_bandwidth_bytes_s=gpu.host_link_bytes_s,
        cost=roofline_cost(gpu, model),
    )
    return CostModel(profile)


@dataclass(frozen=True)
class PublishedStep:
    """A step time read off a public vLLM benchmark, and the step shape it implies."""

    what: str
    source: str
    model: ModelSpec
    shape: StepShape
    measured_s: float


# NOTE: the benchmarks say "H100" without the variant; compared against the H100 SXM
# (the common one). Shapes are read from the benchmark settings (docs/cost-model.md).
PUBLISHED_STEPS = [
    PublishedStep(
        "decode, 10 streams at ~2.5K context (random 2048 in / 1024 out): mean TPOT",
        "github.com/vllm-project/vllm/pull/23151 (untuned, TP=1, H100)",
        QWEN3_CODER_30B,
        StepShape(decode_seqs=10, decode_context=10 * 2560),
        0.01318,
    ),
    PublishedStep(
        "decode, 4 streams of ShareGPT (~215 in / ~217 out): mean TPOT",
        "GPUStack performance lab, gpt-oss-120b/h100 (vLLM 0.10.2, TP=1)",
        GPT_OSS_120B,
        StepShape(decode_seqs=4, decode_context=4 * 320),
        0.00831,
    ),
    PublishedStep(
        "last 8192-token chunk of a 32K prompt, one stream decoding: P99 inter-token gap",
        "GPUStack performance lab, gpt-oss-120b/h100, random 32K in / 100 out",
        GPT_OSS_120B,
        StepShape(8192, chunk_attention(8192, 24576), 1, 32768),
        0.45468,
    ),
]


def write_profiles(directory: Path = PROFILE_DIR) -> list[Path]:
    """Write the testbed profiles' JSON files; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for profile in testbed_profiles():
        path = directory / f"{profile.name}.json"
        path.write_text(profile_json(profile))
        paths.append(path)
    return paths


def report() -> str:
    """The derived figures docs/cost-model.md quotes, as a text table."""
    lines = [
        "profile | KV blocks | KV tokens | max_model_len | prefill tok/s (one "
        "max_num_batched_tokens chunk) | decode tok/s at 1 / 64 / 256 seqs (2K context) | "
        "decode tok/s with the KV cache full of 2K contexts (seqs)"
    ]
    for profile in testbed_profiles():
        model = CostModel(profile)
        chunk = profile.max_num_batched_tokens
        prefill = chunk / model.prefill_time(chunk)
        decode = [seqs / model.decode_time(2048, seqs) for seqs in (1, 64, 256)]
        fit = min(profile.max_num_seqs, profile.num_gpu_blocks // -(-2048 // profile.block_size))
        lines.append(
            f"{profile.name} | {profile.num_gpu_blocks} | "
            f"{profile.num_gpu_blocks * profile.block_size} | {profile.max_model_len} | "
            f"{prefill:,.0f} ({chunk}) | "
            + " / ".join(f"{d:,.0f}" for d in decode)
            + f" | {fit / model.decode_time(2048, fit):,.0f} ({fit})"
        )
    lines.append("")
    lines.append(
        "profile | bandwidth saturates at share | decode / cold prefill / resume prefill "
        "step ms on the whole GPU | normalized throughput at shares "
        + ", ".join(f"{share:g}" for share in SM_SHARES)
    )
    for name, (gpu, spec, deployment) in TESTBED_PROFILES.items():
        if gpu.name not in SM_PARTITION:
            continue
        curves = sm_share_curves(gpu, spec, deployment)
        full = roofline_step_time(roofline_cost(gpu, spec))
        times = " / ".join(
            f"{phase_time(full, phase, deployment.max_num_batched_tokens) * 1e3:.2f}"
            for phase in SM_PHASES
        )
        lines.append(f"{name} | {bandwidth_saturation_share(gpu, spec):.4f} | {times} |")
        for phase in SM_PHASES:
            values = " ".join(f"{value:.3f}" for _, value in curves[phase])
            lines.append(f"  {phase}: {values}")
    lines.append("")
    lines.append("published step | measured ms | H100 SXM ms | H100 NVL ms")
    for step in PUBLISHED_STEPS:
        sxm = step_model(H100_SXM, step.model).step_time(step.shape)
        nvl = step_model(H100_NVL, step.model).step_time(step.shape)
        lines.append(
            f"{step.model.name}: {step.what} | {step.measured_s * 1e3:.1f} | "
            f"{sxm * 1e3:.1f} | {nvl * 1e3:.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """``write [DIR]`` (the default) rewrites the JSON files; ``report`` prints figures."""
    if argv[:1] == ["report"]:
        print(report())
        return
    target = Path(argv[1]) if argv[:1] == ["write"] and len(argv) > 1 else PROFILE_DIR
    for written in write_profiles(target):
        print(written)


if __name__ == "__main__":
    main(sys.argv[1:])
