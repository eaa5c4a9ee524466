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

MAX_TOOL_KINDS = 256
"""Distinct tool names a process keeps figures for (our limit: agents name a few
dozen tools; a client naming every call differently must not grow per-kind state or
metric series without bound)."""

OTHER_TOOLS = "(other)"
"""The kind every name past ``MAX_TOOL_KINDS`` is counted under."""


class ToolKinds:
    """The first ``limit`` distinct tool names seen keep their own figures; later ones
    share ``OTHER_TOOLS``."""

    def __init__(self, limit: int = MAX_TOOL_KINDS) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def kind(self, tool: str) -> str:
        if tool in self._known:
            return tool
        if len(self._known) < self.limit:
            self._known.add(tool)
            return tool
        return OTHER_TOOLS


class ToolDurations:
    """The exponential moving average of each tool kind's duration."""

    def __init__(self, weight: float = EMA_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"the EMA weight must be in (0, 1], got {weight}")
        self.weight = weight
        self._ema: dict[str, float] = {}
        self._kinds = ToolKinds()
        self.completed = 0
        """Durations folded in so far."""

    def record(self, tool: str, seconds: float) -> None:
        tool = self._kinds.kind(tool)
        previous = self._ema.get(tool)
        self._ema[tool] = (
            seconds if previous is None else previous + self.weight * (seconds - previous)
        )
        self.completed += 1

    @property
    def ema_s(self) -> Mapping[str, float]:
        return self._ema
