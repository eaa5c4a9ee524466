"""The Priority-Aware Coordinator of MARS's engine half (seed 000 §4.3): a windowed
multi-level feedback queue whose level summarises three things about a call:

- its initial KV footprint: the blocks it needs beyond what its session keeps pinned,
  as doublings past ``footprint_base_fraction`` of the pool (smaller starts higher, and
  a warm resume needs little);
- its session's attained GPU service over a window of its last calls, in tokens
  computed (its uncached prompt and its output), as doublings past the first level's
  quota (each level's doubles), so sessions that return often sink;
- how long it has waited: one level up per ``promotion_wait_s``, at most
  ``max_promotion`` levels (bounded promotion: long waits end, short work still
  goes first).

FCFS within a level. Eviction follows the same order: the preemption victim is the
running call of the lowest priority, the largest footprint among equals (it frees the
most), and pins are reclaimed lowest priority first, larger first among equals.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence

from agentmars.sdk.events import AnyEvent, LLMEnd, SessionEnd
from agentmars.server.policies.interface import SortKey
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.views import CallView, EngineView, PinView


def doublings(value: float, base: float) -> int:
    """0 up to ``base``, then one more per doubling past it."""
    if value <= base:
        return 0
    return math.ceil(math.log2(value / base))


class PriorityAwareCoordinator:
    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self._service: dict[str, deque[int]] = defaultdict(
            lambda: deque(maxlen=settings.service_window_calls)
        )
        """Tokens computed for each session's last calls (the service window)."""
        self._service_levels: dict[str, int] = {}
        """Each session's levels of attained service, worked out when its window moves
        (a priority reads it for every call placed in the waiting order)."""

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, LLMEnd) and event.status == "ok":
            computed = (event.prompt_tokens or 0) - (event.cached_tokens or 0)
            self._service[event.session_id].append(computed + (event.output_tokens or 0))
            self._service_levels[event.session_id] = doublings(
                self.attained_tokens(event.session_id), self.settings.quantum_tokens
            )
        elif isinstance(event, SessionEnd):
            self._service.pop(event.session_id, None)
            self._service_levels.pop(event.session_id, None)

    def attained_tokens(self, session_id: str) -> int:
        window = self._service.get(session_id)
        return sum(window) if window else 0

    def base_level(self, blocks: int, view: EngineView) -> int:
        """The footprint's levels (``blocks``)."""
        base = max(view.total_blocks * self.settings.footprint_base_fraction, 1.0)
        return doublings(blocks, base)

    def level(self, call: CallView, view: EngineView) -> int:
        settings = self.settings
        # The footprint: the blocks the call needs beyond its session's pin.
        pin = view.pin_of(call.session_id)
        footprint = max(view.blocks_for(call.num_tokens) - (pin.blocks if pin else 0), 1)
        level = self.base_level(footprint, view) + self._service_levels.get(call.session_id, 0)
        level = min(level, settings.levels - 1)
        waited = max(view.now - call.arrival_s, 0.0)
        level -= min(int(waited // settings.promotion_wait_s), settings.max_promotion)
        return max(level, 0)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return (self.level(call, view),)

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        """Lowest priority first, then the largest KV held, then the latest arrival."""
        return max(
            running,
            key=lambda call: (
                self.level(call, view),
                view.blocks_for(call.num_computed_tokens),
                call.arrival_s,
            ),
        )

    def pin_level(self, pin: PinView, view: EngineView) -> int:
        level = self.base_level(pin.blocks, view) + self._service_levels.get(pin.session_id, 0)
        return min(level, self.settings.levels - 1)

    def reclaim(self, pins: Sequence[PinView], view: EngineView) -> list[PinView]:
        """Lowest priority first, larger first among equals."""
        return sorted(pins, key=lambda pin: (-self.pin_level(pin, view), -pin.blocks))
