"""Every constant of MARS that seed 000 leaves open, in one place, with the value
chosen and why (docs/mars.md "Settings"). Seed 000 names the mechanisms (AIMD with
alpha and beta on a control interval, a soft KV cap, hysteresis, an MLFQ with token
quotas and bounded promotion, a pin benefit/cost rule) but publishes none of their
numbers: every value here is ours.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agentmars.server.policies.registry import require_positive_numbers

INTEGER_SETTINGS = (
    "aimd_alpha", "min_window", "max_window", "overload_intervals", "levels", "quantum_tokens",
    "service_window_calls", "max_promotion", "prefill_samples", "regime_tool_samples",
)  # fmt: skip
FRACTION_SETTINGS = (
    "aimd_beta", "kv_overload_usage", "kv_slack_usage", "kv_soft_cap_start",
    "cpu_target_utilization", "long_session_fraction", "footprint_base_fraction",
    "pressure_low", "pressure_high", "prefill_quantile",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MarsSettings:
    # --- external control plane (Algorithm 1) --------------------------------------------
    control_interval_s: float = 1.0
    """How often UpdateWindow may change the raw window. Ours: ten of the engine's
    KV samples (10 Hz), so one decision sees settled figures, and short against a
    session's life (tens of seconds to minutes)."""
    aimd_alpha: int = 1
    """Additive increase, sessions per control interval (TCP's one segment per RTT)."""
    aimd_beta: float = 0.5
    """Multiplicative decrease factor (TCP Reno's halving): halves the sessions in
    flight on overload, the classic AIMD pair that converges to a fair, stable share."""
    min_window: int = 1
    """W_min: the window never closes, so the system always makes progress."""
    max_window: int = 16_384
    """The raw window's start and ceiling (ours: the gateway's own bound on admitted
    sessions, ``gateway.admission.MAX_ADMITTED_SESSIONS``); the CPU and KV limits
    bind long before it."""
    overload_intervals: int = 2
    """Hysteresis: an overload must be seen at this many consecutive control updates
    before the window is cut (seed 000: "only when persistent contention is
    detected"), so one noisy sample does not halve it."""
    kv_overload_usage: float = 1.0
    """KV is overloaded at this share of the pool: the admitted sessions' projected KV
    fills it (admitting more evicts the contexts of sessions in a tool), or the
    running calls hold all of it (pins not counted: they yield before anything is
    preempted), where the engine preempts."""
    kv_slack_usage: float = 0.90
    """KV has slack below this share; between it and ``kv_overload_usage`` the window
    holds (the hysteresis band that keeps it from toggling)."""
    kv_soft_cap_start: float = 0.85
    """The soft cap: below this usage a pass may admit sessions whose projected blocks
    fill the available KV; above it the admissible share shrinks linearly to zero at
    ``kv_overload_usage``, so admission slows before the hard limit and never toggles
    at it. Chosen from 0.5 / 0.7 / 0.85 / 0.9 on three ILR points (docs/mars.md,
    sensitivity): lower starts hold sessions at the gateway that the pool has room
    for."""
    cpu_overload_ratio: float = 1.0
    """The CPU is overloaded when tools queue, or when the running tools ask for more
    than this times the tool cores (each asks for its CPU time over its duration, from
    the stream's ``tool_end``; a whole core when the CPU time is not reported)."""
    cpu_target_utilization: float = 0.9
    """The CPU limit: sessions whose tools' CPU time, against a session's cycle (the
    tool and LLM-call duration EMAs), keeps this fraction of the tool cores busy
    (Little's law; 10% headroom for bursts)."""
    long_session_fraction: float = 0.125
    """A queued session is "long" when its projected blocks are at least this share of
    the KV pool (ours: eight such sessions fill it); a queue of only long sessions is
    packed first-fit against the available KV."""

    tail_guard_factor: float = 10.0
    """The tail guard (not in seed 000; ``mars-paper`` has none): a queued session
    whose wait passes this many times its predicted service (its first call) goes
    ahead of PackQueue's order. Ours: an order of magnitude, so PackQueue's order
    stands for every session but those whose wait is out of proportion."""

    # --- Priority-Aware Coordinator (windowed MLFQ) ---------------------------------------
    levels: int = 6
    """MLFQ levels (FastServe and Autellix use 5-7)."""
    footprint_base_fraction: float = 1 / 64
    """A call's base level is the number of doublings of its KV footprint past this
    share of the pool (level 0 up to 1/64, 1 up to 1/32, ... ): relative to the pool,
    so the same levels hold on any model and hardware."""
    quantum_tokens: int = 8192
    """The first level's token quota of attained service; each level's doubles (FastServe's
    doubling quanta). Ours: one step of vLLM's default token budget on a GPU."""
    service_window_calls: int = 4
    """The window of attained service: tokens computed for the session's last this
    many calls (ours: about a third of a coding session's 11 turns), so a session that
    was served long ago is not held down for good."""
    promotion_wait_s: float = 30.0
    """Bounded promotion: a waiting call rises one level per this many seconds waited
    (ours: a few prefill-heavy steps at saturation on an H100), at most
    ``max_promotion`` levels."""
    max_promotion: int = 5
    """How far a long wait can lift a call (levels - 1: up to the top)."""

    # --- Opportunistic Co-Scheduler --------------------------------------------------------
    pin_review_interval_s: float = 0.5
    """How often pins are re-evaluated while their tools run (the engine's tick)."""
    pressure_low: float = 0.50
    """KV pressure, the price of holding a block, is 0 below this used fraction (pins
    counted) and rises linearly to 1 at ``pressure_high``; 0 whenever no call waits."""
    pressure_high: float = 0.90
    prefill_samples: int = 128
    """Without a cost profile, the prefill time per token is learned from this many
    recent calls (their TTFT over their uncached prompt tokens)."""
    prefill_quantile: float = 0.1
    """... taking this quantile of them, so calls that queued do not count (ours)."""
    regime_tool_samples: int = 128
    """Whether the admission half counts the sessions parked in a tool is judged on the
    mean duration of this many recent tools (``kv_value.KeepingRegime``; ours: as many
    as the prefill rate's samples, a horizon that judges the engine's regime, not the
    next call)."""

    def __post_init__(self) -> None:
        require_positive_numbers(self)
        for name in INTEGER_SETTINGS:
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        for name in FRACTION_SETTINGS:
            if getattr(self, name) > 1:
                raise ValueError(f"{name} must be at most 1, got {getattr(self, name)!r}")
        if self.aimd_beta >= 1:
            raise ValueError("aimd_beta must be below 1 (a decrease)")
        if self.min_window > self.max_window:
            raise ValueError("min_window must be at most max_window")
        if not self.kv_soft_cap_start < self.kv_overload_usage:
            raise ValueError("kv_soft_cap_start must be below kv_overload_usage")
        if not self.kv_slack_usage < self.kv_overload_usage:
            raise ValueError("kv_slack_usage must be below kv_overload_usage")
        if not self.pressure_low < self.pressure_high:
            raise ValueError("pressure_low must be below pressure_high")
        if self.max_promotion >= self.levels:
            raise ValueError("max_promotion must be below levels")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
