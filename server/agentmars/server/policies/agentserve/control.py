"""The Resource-Aware Scheduler's feedback loop (seed 002 §III-B, Algorithm 1 lines
3-11): every control interval Delta_t, the step-level TPOT over the interval,
TPOT_step = Delta L_decode / Delta K_decode (the decode steps' summed time over their
count, from the engine's ``decode_time_s`` and ``decode_steps``), moves the resume
prefill budget B_prefill and the decode SM reservation R_min:

- above theta_high (protect): B_prefill <- max(B_min, B_prefill - Delta_B),
  R_min <- min(S, R_min + Delta_R);
- below theta_low (relax): B_prefill <- min(B_max, B_prefill + Delta_B),
  R_min <- max(R_base, R_min - Delta_R);
- between them, both hold.

NOTE: ours — the thresholds are relative by default (``settings``): theta times the
decode step time without interference, the cost model's decode-only step of the
running decodes on the whole GPU when the engine has one (``Capability.COSTS``), else
the lowest step-level TPOT measured so far. An interval without a decode step has no
decode to protect: it counts as below theta_low (Algorithm 1 leaves 0/0 open; holding
instead could keep R_min = S, and prefills with no SMs, for good).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentmars.server.policies.agentserve.settings import AgentServeSettings
from agentmars.server.policies.views import EngineView


@dataclass(frozen=True, slots=True)
class Interval:
    """What one control interval measured and decided."""

    tpot_s: float | None
    """Step-level TPOT (None: no decode step in the interval)."""
    theta_low_s: float
    theta_high_s: float
    action: str
    """``protect``, ``relax`` or ``hold``."""


class TpotControl:
    """B_prefill and R_min, moved by Algorithm 1 once per ``update``."""

    def __init__(self, settings: AgentServeSettings) -> None:
        self.settings = settings
        self.b_prefill = settings.b_max
        self.r_min = settings.r_base
        self._steps = 0
        self._time_s = 0.0
        self._lowest_s: float | None = None
        self.last: Interval | None = None

    def measure(self, view: EngineView) -> float | None:
        """TPOT_step since the previous measurement (None: no decode step)."""
        steps, time_s = view.decode_steps, view.decode_time_s
        delta_k, delta_l = steps - self._steps, time_s - self._time_s
        self._steps, self._time_s = steps, time_s
        if delta_k <= 0:
            return None
        tpot = delta_l / delta_k
        if self._lowest_s is None or tpot < self._lowest_s:
            self._lowest_s = tpot
        return tpot

    def thresholds(self, view: EngineView) -> tuple[float, float] | None:
        """(theta_low, theta_high) in seconds now (None: no baseline yet)."""
        s = self.settings
        if s.theta_high_s:
            return s.theta_low_s, s.theta_high_s
        baseline = self._baseline(view)
        if baseline is None:
            return None
        return s.theta_low_factor * baseline, s.theta_high_factor * baseline

    def _baseline(self, view: EngineView) -> float | None:
        decoding = [call for call in view.running if call.output_tokens > 0]
        if decoding and view.has_costs:
            context = -(-sum(call.num_tokens for call in decoding) // len(decoding))
            return view.costs.decode_time(context, len(decoding))
        return self._lowest_s

    def update(self, view: EngineView) -> Interval:
        """One pass of Algorithm 1's loop body (lines 3-11)."""
        tpot = self.measure(view)
        bounds = self.thresholds(view)
        low, high = bounds if bounds is not None else (0.0, 0.0)
        if tpot is None or (bounds is not None and tpot < low):
            self.relax()
            action = "relax"
        elif bounds is not None and tpot > high:
            self.protect()
            action = "protect"
        else:
            action = "hold"
        self.last = Interval(tpot, low, high, action)
        return self.last

    def protect(self) -> None:
        s = self.settings
        self.b_prefill = max(s.b_min, self.b_prefill - s.delta_b)
        self.r_min = min(s.r_max, _rounded(self.r_min + s.delta_r))

    def relax(self) -> None:
        s = self.settings
        self.b_prefill = min(s.b_max, self.b_prefill + s.delta_b)
        self.r_min = max(s.r_base, _rounded(self.r_min - s.delta_r))


def _rounded(share: float) -> float:
    """A share rounded to 1e-9, so that steps of 0.1 add up to whole tenths (0.2 + 0.1
    is 0.30000000000000004 in binary)."""
    return round(share, 9)
