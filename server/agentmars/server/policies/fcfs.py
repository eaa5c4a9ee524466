"""Stock vLLM V1 scheduling (notes/baselines.md "FCFS")."""

from __future__ import annotations

from agentmars.server.policies.interface import Policy
from agentmars.server.policies.registry import register


@register
class FCFS(Policy):
    """First come, first served: stock vLLM V1 (the baseline of every seed).

    Every session is admitted at once; waiting calls in arrival order; a running call
    is never preempted by a waiting one; when KV runs out the newest running call is
    preempted and recomputed later; finished calls' KV goes back to the prefix cache
    (LRU reuse). All of it is the default of both halves."""

    name = "fcfs"
    variant = "vLLM 0.32 V1 scheduler, policy=fcfs, scheduler_reserve_full_isl=True"
