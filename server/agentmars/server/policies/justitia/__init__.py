"""``justitia``: seed 004's fair and efficient scheduling of task-parallel agents
(Justitia): agent instances served in the order they would finish under fair sharing of
the KV cache, by a predicted memory-centric cost.

- ``cost``: the memory-centric cost, KV token-time (§4.1, Eq. 1).
- ``predictor``: the per-agent-type TF-IDF + MLP cost predictor (§4.2).
- ``virtual_time``: the GPS virtual clock and fair queue (§4.3, Eq. 2-3, Appendix B).
- ``admission``: the gateway half: predicts an instance's cost at its arrival and
  announces it on the stream (``task_cost``).
- ``scheduler``: the engine half: waiting calls by their instance's virtual finish tag.

docs/justitia.md: each mechanism, its settings, what runs where.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentmars.server.policies.interface import EngineHalf, Policy
from agentmars.server.policies.justitia.scheduler import JustitiaEngine
from agentmars.server.policies.registry import register

if TYPE_CHECKING:
    from agentmars.server.policies.justitia.admission import CostAdmission

PRETRAIN_PER_TYPE = 100
"""Generated agents per class the predictor starts trained on (seed 004 §4.2: 100
samples per agent type)."""


def cost_admission(pretrain_per_type: int, seed: int) -> CostAdmission:
    """The admission half that predicts and announces instance costs."""
    # Imported here: the predictor needs scikit-learn, which only the gateway's
    # environment has; the engine half (this package, in vLLM's) must import without.
    from agentmars.server.policies.justitia.admission import (
        CostAdmission,
        pretrained_predictor,
    )

    return CostAdmission(pretrained_predictor(pretrain_per_type, seed))


def check_pretraining(pretrain_per_type: int, seed: int) -> None:
    if isinstance(pretrain_per_type, bool) or not isinstance(pretrain_per_type, int):
        raise ValueError(f"pretrain_per_type must be an integer, got {pretrain_per_type!r}")
    if not 0 <= pretrain_per_type <= 10_000:
        raise ValueError(f"pretrain_per_type must be 0-10000, got {pretrain_per_type}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


@register
class Justitia(Policy):
    """Justitia: agent instances by their virtual finish time under fair KV sharing.

    The gateway half predicts each agent instance's KV token-time from its input with
    its type's model and announces it; the engine half gives each instance the tag
    ``F = V(a) + C`` of the GPS virtual clock over the engine's KV (``M`` tokens,
    ``dV/dt = M / N`` per decode iteration) and serves waiting calls by tag, never
    preempting a running call for a waiting one; KV preempted when the cache is full is
    swapped to the CPU tier where there is one. Settings: ``pretrain_per_type``
    generated agents per class the predictor starts from (0: none; costs are then
    learnt online, instances in arrival order until then), ``seed`` of its models."""

    name = "justitia"
    variant = (
        "seed 004 §4 and Appendix C: KV token-time cost, per-type TF-IDF + MLP predictor "
        "(100 samples per type, online refits), GPS virtual-time fair queuing over the "
        "engine's KV in decode iterations, non-preemptive, swap on preemption"
    )

    def __init__(self, pretrain_per_type: int = PRETRAIN_PER_TYPE, seed: int = 0) -> None:
        check_pretraining(pretrain_per_type, seed)
        self.pretrain_per_type = pretrain_per_type
        self.seed = seed

    def settings(self) -> dict[str, int]:
        return {"pretrain_per_type": self.pretrain_per_type, "seed": self.seed}

    def admission(self) -> CostAdmission:
        return cost_admission(self.pretrain_per_type, self.seed)

    def engine(self) -> EngineHalf:
        return JustitiaEngine()
