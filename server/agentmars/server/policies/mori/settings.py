"""Every constant of MORI that seed 003 leaves open, in one place, with the value chosen
and why (docs/mori.md "Settings"). Seed 003 gives the tick (5 s, §5); its Eq. 1 window
``k`` is lost in the extraction ("we use [k = ?] in all experiments"), so the window
is ours, as is the gate check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agentmars.server.policies.registry import require_positive_numbers


@dataclass(frozen=True, slots=True)
class MoriSettings:
    tick_s: float = 5.0
    """How often the control loop rebalances the tiers (§5: "default tick: 5 s")."""
    window_cycles: int = 5
    """k of Eq. 1: the inference-tool-call cycles the idleness sums over, the current
    one included. Ours (the paper's value is unreadable): long enough that one slow
    call among the ~8 short ones of a busy phase (§3.3: a median busy phase of 20 s at
    ~2.5 s a cycle) leaves the program below the idle ones (one 20 s call among four
    short cycles: 0.76, against ~0.95 for a program in its second long call), short
    enough that two long calls in a row outweigh the short ones before them."""
    gate_check_s: float = 0.1
    """How often the engine half checks for the demotions that wait for a call to end
    (§4.3.1's lazy demotion) and gates them. Ours, a mechanism figure: a demoted
    program must be gated before its next call, and the shortest tool calls of the
    coding traces take hundreds of milliseconds (§3.2)."""

    def __post_init__(self) -> None:
        require_positive_numbers(self)
        if not isinstance(self.window_cycles, int):
            raise ValueError(f"window_cycles must be an integer >= 1, got {self.window_cycles!r}")
        if self.gate_check_s > self.tick_s:
            raise ValueError("gate_check_s must not exceed tick_s")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
