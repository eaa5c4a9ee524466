"""Tool durations folded into a moving average per tool kind: the one place agentmars
does it. The sandbox pool (its ``tool_stats`` events), the gateway and the scheduler
plugin (from the stream's ``tool_end`` events) and the simulator all keep their
``exec_ema_s`` with this, so a policy sees the same figure on every engine.
"""

from __future__ import annotations

from collections.abc import Mapping

EMA_WEIGHT = 0.2
"""Weight of the newest duration in the per-kind moving average (our choice: about the
last five calls dominate; seed 000 §4.1 names an EMA of execution time without a
weight)."""


class ToolDurations:
    """The exponential moving average of each tool kind's duration."""

    def __init__(self, weight: float = EMA_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"the EMA weight must be in (0, 1], got {weight}")
        self.weight = weight
        self._ema: dict[str, float] = {}
        self.completed = 0
        """Durations folded in so far."""

    def record(self, tool: str, seconds: float) -> None:
        previous = self._ema.get(tool)
        self._ema[tool] = (
            seconds if previous is None else previous + self.weight * (seconds - previous)
        )
        self.completed += 1

    @property
    def ema_s(self) -> Mapping[str, float]:
        return self._ema
