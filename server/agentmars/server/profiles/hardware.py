"""What a roofline profile is made of: a GPU's datasheet figures and a model's config.

Every derived quantity the cost model and the KV-capacity derivation need (weights
read per step, FLOPs per token, KV bytes per token) is computed here from the
``config.json`` fields of the model, so a profile's JSON shows the inputs and this
module shows the arithmetic (docs/cost-model.md writes it out for each profile).

A dense model is a mixture of experts with one expert, always chosen
(``num_experts = num_experts_per_tok = 1``): every formula below then reduces to the
dense one.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

GIB = 1024**3
MIB = 1024**2


class GpuSpec(BaseModel):
    """One GPU, from its datasheet (dense figures, no 2:4 sparsity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_bytes: int = Field(gt=0)
    """Device memory as CUDA reports it (``torch.cuda.mem_get_info`` total): what
    vLLM multiplies by ``gpu_memory_utilization``."""
    hbm_bandwidth_bytes_s: float = Field(gt=0)
    dense_bf16_flops: float = Field(gt=0)
    """Peak dense BF16 tensor-core FLOP/s."""
    host_link_bytes_s: float = Field(gt=0)
    """Host<->GPU link, one direction, theoretical (PCIe Gen5 x16: 64 GB/s)."""


class ModelSpec(BaseModel):
    """A decoder-only (MoE) transformer, by its Hugging Face ``config.json`` names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    num_hidden_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    num_experts: int = Field(default=1, gt=0)
    """Routed experts per layer (1 for a dense model)."""
    num_experts_per_tok: int = Field(default=1, gt=0)
    moe_intermediate_size: int = Field(gt=0)
    """Intermediate size of one expert's MLP (the MLP's, for a dense model)."""
    mlp_projections: int = Field(default=3, ge=2, le=3)
    """Weight matrices of that MLP: 3 for a gated one (gate, up, down: Qwen3, GPT-OSS,
    Llama), 2 for a plain one (up, down: GPT-J). Left out of a profile's JSON when 3, so
    the gated models' files read as they did before the field existed."""
    sliding_window: int | None = Field(default=None, gt=0)
    sliding_window_layers: int = Field(default=0, ge=0)
    """How many layers attend only to the last ``sliding_window`` tokens."""
    max_position_embeddings: int = Field(gt=0)
    expert_weight_bits: float = Field(default=16.0, gt=0)
    """Stored bits per expert weight: 16 for BF16; 4.25 for MXFP4 (4-bit values plus
    one 8-bit scale per 32)."""
    other_weight_bits: float = Field(default=16.0, gt=0)
    kv_cache_bytes_per_element: int = Field(default=2, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError("num_experts_per_tok cannot exceed num_experts")
        if self.sliding_window_layers >= self.num_hidden_layers:
            raise ValueError("sliding_window_layers must leave at least one full layer")
        if self.sliding_window_layers and self.sliding_window is None:
            raise ValueError("sliding_window_layers needs a sliding_window")
        return self

    @model_serializer(mode="wrap")
    def _omit_gated_default(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.mlp_projections == 3:
            data.pop("mlp_projections", None)
        return data

    # --- parameters ---------------------------------------------------------------------

    @property
    def attention_params_per_layer(self) -> int:
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        return 2 * self.hidden_size * q_out + 2 * self.hidden_size * kv_out

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts if self.num_experts > 1 else 0

    @property
    def expert_params(self) -> int:
        """One expert: its gate (if gated), up and down projections."""
        return self.mlp_projections * self.hidden_size * self.moe_intermediate_size

    @property
    def vocab_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """All weights (norms and biases left out: under 0.1% here)."""
        per_layer = (
            self.attention_params_per_layer
            + self.router_params_per_layer
            + self.num_experts * self.expert_params
        )
        embeddings = self.vocab_params * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embeddings

    @property
    def active_params(self) -> int:
        """Weights one token multiplies through, the output projection included."""
        return self.linear_params_per_token + self.vocab_params

    @property
    def linear_params_per_token(self) -> int:
        per_layer = (
            self.attention_params_per_layer
            + self.router_params_per_layer
            + self.num_experts_per_tok * self.expert_params
        )
        return self.num_hidden_layers * per_layer

    # --- bytes --------------------------------------------------------------------------

    @property
    def expert_weight_bytes(self) -> float:
        """All routed experts of all layers, as stored."""
        experts = self.num_hidden_layers * self.num_experts * self.expert_params
        return experts * self.expert_weight_bits / 8

    @property
    def dense_weight_bytes_read(self) -> float:
        """Weights every step streams whatever the batch: attention projections,
        routers and the output projection. (The input embedding is a row gather.)"""
        per_layer = self.attention_params_per_layer + self.router_params_per_layer
        return (self.num_hidden_layers * per_layer + self.vocab_params) * (
            self.other_weight_bits / 8
        )

    @property
    def checkpoint_bytes(self) -> float:
        other = self.total_params - self.num_hidden_layers * self.num_experts * self.expert_params
        return self.expert_weight_bytes + other * self.other_weight_bits / 8

    @property
    def full_attention_layers(self) -> int:
        return self.num_hidden_layers - self.sliding_window_layers

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.num_key_value_heads * self.head_dim * self.kv_cache_bytes_per_element

    # --- FLOPs --------------------------------------------------------------------------

    @property
    def linear_flops_per_token(self) -> float:
        """Matrix multiplies of one token through every layer (2 FLOPs per weight)."""
        return 2.0 * self.linear_params_per_token

    @property
    def lm_head_flops_per_token(self) -> float:
        """The output projection, paid only by tokens that are sampled."""
        return 2.0 * self.vocab_params

    @property
    def attention_flops_per_pair_per_layer(self) -> float:
        """QK^T and PV for one (query, key) pair in one layer, all query heads."""
        return 4.0 * self.num_attention_heads * self.head_dim
