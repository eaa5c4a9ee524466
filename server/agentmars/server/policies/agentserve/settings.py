"""Every constant of AgentServe that seed 002 leaves open, in one place, with the value
chosen and why (docs/agentserve.md "Settings"). Algorithm 1 names its parameters
(theta_low, theta_high, Delta_B, Delta_R, Delta_t, B_min, B_max, R_base, S) and §III-C
the ten Green Contexts of 10% steps; it publishes no value for the others: every value
here but ``contexts`` and ``r_max`` is ours.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

INTEGER_SETTINGS = ("b_min", "b_max", "delta_b", "contexts")
SHARE_SETTINGS = ("r_base", "r_max", "delta_r")


@dataclass(frozen=True, slots=True)
class AgentServeSettings:
    control_interval_s: float = 0.1
    """Delta_t, how often Algorithm 1 measures the step-level TPOT and moves B_prefill
    and R_min. Ours: a decode step of a 3-8B model takes 5-25 ms on the paper's RTX
    A5000 and 5090, so an interval holds several steps (a measured mean, not one
    sample), and it is shorter than one cold prefill of Table I's 2.5k-3.5k tokens
    (0.1-0.6 s there), so protection starts while the prefill still runs."""
    theta_high_factor: float = 1.5
    """theta_high, relative: protect the decodes when the step-level TPOT exceeds
    this times the decode step time without interference (``baseline``). Ours: §IV-A
    sets its SLOs as the isolated TPOT scaled by a constant, without the constant;
    1.5 keeps the decodes at two thirds of their rate alone or better (Def. 1's
    mu_D(R) >= r_min with r_min at 1/1.5 of the whole GPU's)."""
    theta_low_factor: float = 1.1
    """theta_low, relative: relax below this times the baseline. Ours: within 10% of
    no interference; the band between the two is the hysteresis that keeps the
    controller from toggling at every interval."""
    theta_high_s: float = 0.0
    """An absolute theta_high in seconds instead of the relative one (0: relative)."""
    theta_low_s: float = 0.0
    """An absolute theta_low in seconds (0: relative)."""
    b_min: int = 32
    """B_min, tokens: the smallest budget. Ours: Table I's shortest ReAct resume prefill
    (30 tokens) still merges with the decodes at full protection."""
    b_max: int = 512
    """B_max, tokens, also the starting budget (Algorithm 1 starts relaxed). Ours:
    above Table I's longest resume prefill (Plan-and-Execute, 421 tokens), so with
    the decodes unhurt every resume prefill of both workloads merges with them;
    cold prefills (2.5k-3.5k) never do."""
    delta_b: int = 64
    """Delta_B, tokens per interval. Ours: about one mean ReAct resume prefill (56
    tokens, Table I) a step; B_max to B_min in 8 intervals (0.8 s)."""
    r_base: float = 0.2
    """R_base, share of the SMs: the decode reservation when relaxed, also the
    starting one. Ours: two of the ten contexts; Fig. 3's decode throughput rises
    steeply at low shares and saturates early, and a decode batch of 3-6 agents is
    small."""
    delta_r: float = 0.1
    """Delta_R, share per interval: one Green Context (§III-C's 10% steps)."""
    r_max: float = 1.0
    """S, the whole GPU (Algorithm 1 line 7: R_min <- min(S, R_min + Delta_R))."""
    contexts: int = 10
    """Pre-created Green Contexts, of 1/contexts of the SMs each step (§III-C: ten,
    10% to 100%); the reservation is rounded up to the next one (37% -> 40%)."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{field.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{field.name} must be a finite number >= 0, got {value!r}")
        for name in INTEGER_SETTINGS:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in SHARE_SETTINGS:
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a share of the SMs in (0, 1]")
        if self.control_interval_s <= 0:
            raise ValueError("control_interval_s must be > 0")
        if self.b_min > self.b_max:
            raise ValueError(f"b_min ({self.b_min}) must not exceed b_max ({self.b_max})")
        if self.r_base > self.r_max:
            raise ValueError(f"r_base ({self.r_base}) must not exceed r_max ({self.r_max})")
        high = self.theta_high_s or self.theta_high_factor
        low = self.theta_low_s or self.theta_low_factor
        if bool(self.theta_high_s) != bool(self.theta_low_s):
            raise ValueError("theta_high_s and theta_low_s are given together (or neither)")
        if not 0 < low < high:
            raise ValueError("theta_low must be > 0 and below theta_high")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
