"""The Execution Layer's SM partition (seed 002 §III-C): ten Green Contexts are
created at start, reserving 10%, 20%, ... 100% of the SMs; the decode thread is bound
to the smallest one that guarantees at least R_min (a target of 37% takes the 40%
context), the prefill thread to the complement.

Here the partition is the simulator's step model (``EngineHalf.decode_sm_share``,
``Capability.SM_PARTITION``; docs/simulator.md "The SM partition"): the decodes, and
the resume prefills Q_D merges with them, run on the decode share at the profile's
SM-share curve, the Q_P prefills on the rest at the same time. An engine without
SMs (vLLM's CPU backend) or a profile without curves runs AgentServe without it.
"""

from __future__ import annotations

import math


def green_context_share(r_min: float, contexts: int = 10) -> float:
    """The share of the smallest of ``contexts`` evenly sized contexts that holds at
    least ``r_min`` (at most the whole GPU)."""
    steps = math.ceil(round(r_min * contexts, 9))
    return min(max(steps, 1), contexts) / contexts
