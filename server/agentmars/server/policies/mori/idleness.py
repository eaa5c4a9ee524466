"""A program's windowed idleness (seed 003 Eq. 1): the share of its recent time spent
Acting (between its calls: tools) against Acting plus Reasoning (a call on the
engine), summed over the last ``k`` inference-tool-call cycles, the current one
included.

Time the scheduler imposes is left out (§4.1): a call that arrives while its program
is gated in the CPU or Waiting tier ends the Acting gap when it arrives, and starts
Reasoning only when the program is let through. Times are the engine's clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class Cycle:
    reasoning_s: float = 0.0
    acting_s: float = 0.0


class Idleness:
    """One program's Reasoning / Acting record and its Eq. 1 value."""

    def __init__(self, window_cycles: int) -> None:
        self._done: deque[Cycle] = deque(maxlen=window_cycles - 1)
        self._current = Cycle()
        self._reasoning_since: float | None = None
        """When the call now on the engine started Reasoning (None: not Reasoning)."""
        self._acting_since: float | None = None
        """When the program's last call ended (None: no call ended, or the gap is over)."""

    @property
    def reasoning(self) -> bool:
        return self._reasoning_since is not None

    def call_arrived(self, at_s: float) -> None:
        """A call of the program arrived at ``at_s``: the Acting gap before it closes
        (a held call: it waits now, neither Acting nor Reasoning)."""
        if self._acting_since is not None:
            self._current.acting_s = max(at_s - self._acting_since, 0.0)
            self._done.append(self._current)
            self._current = Cycle()
        self._acting_since = None

    def call_started(self, at_s: float) -> None:
        """The call reached the engine (for a held call: its program was let through)."""
        self._reasoning_since = at_s

    def call_ended(self, at_s: float) -> None:
        if self._reasoning_since is not None:
            self._current.reasoning_s += max(at_s - self._reasoning_since, 0.0)
        self._reasoning_since = None
        self._acting_since = at_s

    def value(self, now: float) -> float:
        """Eq. 1 at ``now``: the current interval counts as far as it has gone, so a
        tool call that runs long makes the program more idle while it runs (§4.2's
        responsiveness). A program with no time yet is busy (0)."""
        reasoning = sum(cycle.reasoning_s for cycle in self._done) + self._current.reasoning_s
        acting = sum(cycle.acting_s for cycle in self._done)
        if self._reasoning_since is not None:
            reasoning += max(now - self._reasoning_since, 0.0)
        elif self._acting_since is not None:
            acting += max(now - self._acting_since, 0.0)
        total = reasoning + acting
        return acting / total if total > 0 else 0.0
