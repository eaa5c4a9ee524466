"""Host-side tool pressure, seed 000 §4.1 (CPU plane): the number of active and
queued tools and an exponential moving average of execution time per tool kind.
The control plane reads these instead of hardware counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentmars.sdk.tool_stats import ToolDurations


@dataclass
class ToolPressure:
    durations: ToolDurations
    """Execution times, folded per tool kind as everywhere in agentmars (its weight:
    ``SandboxConfig.exec_ema_alpha``)."""
    active: int = 0
    """Tools running in a slot."""
    queued: int = 0
    """Tools waiting for a slot."""

    def record_exec(self, tool: str, seconds: float) -> None:
        self.durations.record(tool, seconds)

    @property
    def exec_ema_s(self) -> Mapping[str, float]:
        return self.durations.ema_s

    @property
    def completed(self) -> int:
        """Executions recorded so far."""
        return self.durations.completed
