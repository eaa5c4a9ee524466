"""How long one engine step takes, from the shape of the step.

A step of continuous batching computes some prompt tokens (prefill chunks) and one
token for each decoding sequence. Its time is modelled in one of two ways, chosen by
the profile:

- ``RooflineCost`` (the GPU profiles), from first principles. A step runs its
  matrix multiplies and its attention kernels one after the other, and each class of
  kernel is bound either by compute or by memory on its own, so::

      t = overhead + max(linear FLOPs / (peak * e_lin),  weight bytes / (bw * e_bw))
                   + max(attention FLOPs / (peak * e_att), KV bytes / (bw * e_bw))

  NOTE: a sum of per-kernel rooflines rather than one max over the whole step
  (ours): one max would let attention's KV traffic hide under the GEMMs' compute,
  which sequential kernels do not do. Linear FLOPs use the active parameters (the
  experts a token is routed to); weight bytes are the dense weights plus the experts
  the step's tokens touch, with tokens routed uniformly and independently, so a step
  of T tokens touches a fraction ``1 - (1 - k/E)**T`` of each layer's E experts.
  Attention reads the decode contexts' KV once per step, and a prefill chunk's
  preceding KV once per query tile (FlashAttention's outer loop).
- ``FittedCost`` (``cpu-tiny``), a linear model fitted to timings of a real engine
  (``agentmars calibrate``): ``c0 + c1*prefill_tokens + c2*prefill_attention +
  c3*decode_seqs + c4*decode_context``.

A profile may also carry throughput-versus-SM-share curves (``Profile.sm_share_curves``,
seed 002's Fig. 3): how fast each phase runs on a fraction of the GPU's SMs, relative
to the whole GPU (``Profile.sm_throughput``). The consumer-GPU profiles have them,
modelled from the same roofline (gpu_profiles.py); the others do not.

docs/cost-model.md derives each profile and states the limits.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from agentmars.server.profiles.hardware import GpuSpec, ModelSpec

PROFILE_DIR = Path(__file__).with_name("data")


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one step computes."""

    prefill_tokens: int = 0
    """Prompt tokens computed this step (the sum of the prefill chunks)."""
    prefill_attention: int = 0
    """Attention work of those chunks in (query, key) pairs: the sum over chunks of
    ``chunk_len * (tokens before the chunk + (chunk_len + 1) / 2)``, rounded."""
    decode_seqs: int = 0
    """Sequences decoding one token this step."""
    decode_context: int = 0
    """Sum of those sequences' context lengths (KV tokens read)."""


def chunk_attention(tokens: int, before: int) -> int:
    """Attention pairs of a prefill chunk of ``tokens`` after ``before`` cached tokens."""
    return tokens * (2 * before + tokens + 1) // 2


class RooflineCost(BaseModel):
    """First-principles step time on one GPU (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["roofline"] = "roofline"
    gpu: GpuSpec
    model: ModelSpec
    linear_efficiency: float = Field(gt=0, le=1)
    """Fraction of peak FLOP/s the matrix multiplies reach when compute-bound (MFU)."""
    attention_efficiency: float = Field(gt=0, le=1)
    """Fraction of peak FLOP/s the attention kernels reach when compute-bound."""
    bandwidth_efficiency: float = Field(gt=0, le=1)
    """Fraction of peak HBM bandwidth reached when memory-bound."""
    step_overhead_s: float = Field(gt=0)
    """Time a step costs whatever it computes: scheduling, input preparation, kernel
    launches, sampling."""
    attention_query_tile: int = Field(default=128, gt=0)
    """Query rows per attention tile: a prefill chunk reads its preceding KV once per
    tile."""


class FittedCost(BaseModel):
    """Linear step time fitted to measurements of a real engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["fitted"] = "fitted"
    c0: float = Field(gt=0, description="seconds per step")
    c1: float = Field(ge=0, description="seconds per prefill token")
    c2: float = Field(ge=0, description="seconds per prefill attention pair")
    c3: float = Field(ge=0, description="seconds per decoding sequence")
    c4: float = Field(ge=0, description="seconds per decode context token")
    r_squared: float | None = None
    """Fit quality over all calibration probes (None when not fitted)."""


class EngineLimits(BaseModel):
    """The engine's configuration the simulator mirrors (vLLM's names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_size: int = Field(gt=0)
    num_gpu_blocks: int = Field(gt=0)
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    kv_bytes_per_token: int = Field(gt=0)
    """KV bytes of one token of context (what the CPU tier moves per token)."""

    @model_validator(mode="after")
    def _check(self) -> EngineLimits:
        # The same two checks vLLM makes before it starts.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.max_model_len > self.num_gpu_blocks * self.block_size:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) does not fit in the KV cache "
                f"({self.num_gpu_blocks} blocks of {self.block_size} tokens)"
            )
        return self


SM_PHASES = ("decode", "cold_prefill", "resume_prefill")
"""The phases an SM-share curve is given for (seed 002's three kinds of work)."""

SmShareCurve = tuple[tuple[float, float], ...]
"""Points ``(SM share, normalized throughput)``, shares increasing, the last (1, 1)."""


def check_sm_share_curves(curves: dict[str, SmShareCurve]) -> None:
    """Raise ValueError unless ``curves`` is empty or one valid curve per phase."""
    if not curves:
        return
    if set(curves) != set(SM_PHASES):
        raise ValueError(
            f"sm_share_curves must give exactly the phases {', '.join(SM_PHASES)} "
            f"(got {', '.join(sorted(curves))})"
        )
    for phase, points in curves.items():
        if not points:
            raise ValueError(f"sm_share_curves.{phase}: no points")
        previous_share, previous_value = 0.0, 0.0
        for share, value in points:
            if not (previous_share < share <= 1.0):
                raise ValueError(
                    f"sm_share_curves.{phase}: shares must increase within (0, 1] "
                    f"(got {share} after {previous_share})"
                )
            if not (previous_value <= value <= 1.0) or value <= 0.0:
                raise ValueError(
                    f"sm_share_curves.{phase}: throughputs must be in (0, 1] and "
                    f"non-decreasing (got {value} after {previous_value})"
                )
            previous_share, previous_value = share, value
        if points[-1] != (1.0, 1.0):
            raise ValueError(f"sm_share_curves.{phase}: the last point must be (1.0, 1.0)")


class Profile(EngineLimits):
    """An engine configuration and its step-time model: one JSON file per profile."""

    name: str = Field(min_length=1)
    description: str
    sources: list[str]
    """Where each figure comes from."""
    cpu_kv_blocks: int = Field(ge=0)
    """Capacity of the optional CPU KV tier, in blocks."""
    cpu_kv_bandwidth_bytes_s: float = Field(gt=0)
    """Host<->GPU bandwidth for that tier, one direction, as achieved."""
    cost: Annotated[RooflineCost | FittedCost, Field(discriminator="kind")]
    request_overhead_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """What a request costs before the engine schedules it (the API server's
    handling): fitted by ``agentmars calibrate``, 0 for the derived GPU profiles,
    whose sources do not give it."""
    sm_share_curves: dict[str, SmShareCurve] = Field(default_factory=dict)
    """Throughput versus SM share per phase (``SM_PHASES``): points ``(share,
    throughput at that share / throughput on the whole GPU)``, through (0, 0) implied,
    the last (1, 1), non-decreasing (seed 002 Assumption 1). Empty when the profile
    has none, and then left out of its JSON (the files without curves read as they
    did before the field existed); modelled, not measured (docs/cost-model.md)."""

    @model_validator(mode="after")
    def _check_curves(self) -> Profile:
        check_sm_share_curves(self.sm_share_curves)
        return self

    @model_serializer(mode="wrap")
    def _omit_no_curves(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.sm_share_curves:
            data.pop("sm_share_curves", None)
        return data

    def sm_throughput(self, phase: str, share: float) -> float:
        """Throughput of ``phase`` on ``share`` of the GPU's SMs, over its throughput
        on all of them: linear between the curve's points and from (0, 0) to the first.
        ValueError for an unknown phase, a share outside [0, 1], or a profile without
        curves (check ``sm_share_curves`` first)."""
        if not self.sm_share_curves:
            raise ValueError(
                f"profile {self.name!r} has no SM-share curves (sm_share_curves is empty)"
            )
        points = self.sm_share_curves.get(phase)
        if points is None:
            raise ValueError(f"unknown phase {phase!r}: one of {', '.join(SM_PHASES)}")
        if not 0.0 <= share <= 1.0:  # NaN included
            raise ValueError(f"SM share {share} is outside [0, 1]")
        shares = [point[0] for point in points]
        index = bisect_left(shares, share)
        high_share, high_value = points[index]
        if high_share == share:
            return high_value
        low_share, low_value = points[index - 1] if index else (0.0, 0.0)
        return low_value + (high_value - low_value) * (share - low_share) / (high_share - low_share)


class ProfileError(ValueError):
    """A profile that cannot be loaded; the message says which and why."""


def profile_names() -> list[str]:
    """The registered profiles (the JSON files shipped with the package)."""
    return sorted(path.stem for path in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """A registered profile by name, or a profile JSON file by path."""
    registered = PROFILE_DIR / f"{name_or_path}.json"
    path = registered if registered.is_file() else Path(name_or_path)
    if not path.is_file():
        known = ", ".join(profile_names()) or "none"
        raise ProfileError(
            f"unknown profile {name_or_path!r}: not a registered name ({known}) and no such file"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"profile file {path}: not readable JSON ({exc})") from None
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'profile'}: {e['msg']}" for e in exc.errors()
        )
        raise ProfileError(f"profile file {path}: {problems}") from None


PROFILE_KEY_ORDER = ("name", "description", "sources")


def profile_json(profile: Profile) -> str:
    """A profile as its JSON file holds it (name, description and sources first)."""
    data = profile.model_dump(mode="json")
    ordered = {key: data.pop(key) for key in PROFILE_KEY_ORDER} | data
    return json.dumps(ordered, indent=2, ensure_ascii=False) + "\n"


StepTime = Callable[[StepShape], float]


def roofline_step_time(cost: RooflineCost) -> StepTime:
    """The step-time function of a roofline profile (constants folded in once)."""
    gpu, model = cost.gpu, cost.model
    lin_flops_s = gpu.dense_bf16_flops * cost.linear_efficiency
    att_flops_s = gpu.dense_bf16_flops * cost.attention_efficiency
    bytes_s = gpu.hbm_bandwidth_bytes_s * cost.bandwidth_efficiency
    overhead = cost.step_overhead_s
    flops_per_token = model.linear_flops_per_token
    lm_head_flops = model.lm_head_flops_per_token
    dense_bytes = model.dense_weight_bytes_read
    expert_bytes = model.expert_weight_bytes
    untouched = 1.0 - model.num_experts_per_tok / model.num_experts
    pair_flops = model.attention_flops_per_pair_per_layer
    full_layers = model.full_attention_layers
    window_layers = model.sliding_window_layers
    window = model.sliding_window or 0
    kv_full = model.kv_bytes_per_token_per_layer * full_layers
    kv_window = model.kv_bytes_per_token_per_layer * window_layers
    tile = cost.attention_query_tile

    def step_time(shape: StepShape) -> float:
        prefill, pairs = shape.prefill_tokens, shape.prefill_attention
        seqs, context = shape.decode_seqs, shape.decode_context
        tokens = prefill + seqs
        weight_bytes = dense_bytes + expert_bytes * (1.0 - untouched**tokens)
        linear_flops = tokens * flops_per_token + seqs * lm_head_flops
        linear = max(linear_flops / lin_flops_s, weight_bytes / bytes_s)
        window_prefill = min(pairs, prefill * window)
        window_decode = min(context, seqs * window)
        attention_flops = pair_flops * (
            full_layers * (pairs + context) + window_layers * (window_prefill + window_decode)
        )
        kv_bytes = (
            (kv_full * pairs + kv_window * window_prefill) / tile
            + kv_full * context
            + kv_window * window_decode
            + (kv_full + kv_window) * prefill
        )
        attention = max(attention_flops / att_flops_s, kv_bytes / bytes_s)
        return overhead + linear + attention

    return step_time


def fitted_step_time(cost: FittedCost) -> StepTime:
    """The step-time function of a fitted profile."""
    c0, c1, c2, c3, c4 = cost.c0, cost.c1, cost.c2, cost.c3, cost.c4

    def step_time(shape: StepShape) -> float:
        return (
            c0
            + c1 * shape.prefill_tokens
            + c2 * shape.prefill_attention
            + c3 * shape.decode_seqs
            + c4 * shape.decode_context
        )

    return step_time


class CostModel:
    """Step times of one profile; ``step_time`` is plain float arithmetic."""

    __slots__ = ("_step_time", "profile")

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        cost = profile.cost
        self._step_time = (
            roofline_step_time(cost) if isinstance(cost, RooflineCost) else fitted_step_time(cost)
        )

    def step_time(self, shape: StepShape) -> float:
        """Seconds one step of this shape takes (> 0)."""
        return self._step_time(shape)

    def prefill_time(self, tokens: int, context_before: int = 0) -> float:
        """One call's prompt of ``tokens`` after ``context_before`` cached tokens, alone,
        in chunks of ``max_num_batched_tokens``."""
        budget = self.profile.max_num_batched_tokens
        total = 0.0
        done = 0
        while done < tokens:
            chunk = min(budget, tokens - done)
            before = context_before + done
            total += self._step_time(StepShape(chunk, chunk_attention(chunk, before)))
            done += chunk
        return total

    def decode_time(self, context: int, seqs: int = 1) -> float:
        """One decode step of ``seqs`` sequences with ``context`` tokens each."""
        return self._step_time(StepShape(decode_seqs=seqs, decode_context=context * seqs))

    def transfer_time(self, blocks: int) -> float:
        """Moving ``blocks`` KV blocks between the GPU and the CPU tier, one way."""
        profile = self.profile
        moved = blocks * profile.block_size * profile.kv_bytes_per_token
        return moved / profile.cpu_kv_bandwidth_bytes_s
