"""Host-side tool pressure, seed 000 §4.1 (CPU plane): the number of active and
queued tools and an exponential moving average of execution time per tool kind.
The control plane reads these instead of hardware counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolPressure:
    alpha: float
    """Weight of the newest sample in the EMA."""
    active: int = 0
    queued: int = 0
    exec_ema_s: dict[str, float] = field(default_factory=dict)
    completed: int = 0

    def record_exec(self, tool: str, seconds: float) -> None:
        previous = self.exec_ema_s.get(tool)
        self.exec_ema_s[tool] = (
            seconds if previous is None else self.alpha * seconds + (1 - self.alpha) * previous
        )
        self.completed += 1
