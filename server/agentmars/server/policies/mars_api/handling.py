"""Seed 001 §3 Step 1 and Appendix A.3: the handling of a call's KV during its API
call, chosen before the call is scheduled, as the one the waste equations (INFERCEPT's
Eq. 1-3, ``infercept.waste``) say wastes the least memory, from the predicted context
at the API call and the predicted API duration."""

from __future__ import annotations

from enum import StrEnum

from agentmars.server.policies.infercept import Waste, waste
from agentmars.server.policies.views import EngineView


class Handling(StrEnum):
    PRESERVE = "preserve"
    """The KV stays on the GPU through the API call (``Pin``)."""
    DISCARD = "discard"
    """The KV is dropped and the context recomputed after the call (``Release``)."""
    SWAP = "swap"
    """The KV goes to the CPU tier and comes back after the call (``Offload``)."""


def choose_handling(
    context: int, api_s: float, other_context: int, view: EngineView, *, can_swap: bool
) -> Handling:
    """The handling whose waste is least; ties go to Preserve, then Discard (the
    cheaper ones to carry out). Swap only where the engine has a CPU tier."""
    cost = waste(context, api_s, other_context, view)
    return least_waste(cost, can_swap=can_swap)


def least_waste(cost: Waste, *, can_swap: bool) -> Handling:
    options = [(cost.preserve, Handling.PRESERVE), (cost.discard, Handling.DISCARD)]
    if can_swap:
        options.append((cost.swap, Handling.SWAP))
    return min(options, key=lambda option: option[0])[1]
