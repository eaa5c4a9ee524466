"""MARS's Internal Agent-Centric Scheduler, the engine half (seed 000 §4.3): the
Priority-Aware Coordinator (``coordinator``) orders the waiting calls and chooses what
to evict; the Opportunistic Co-Scheduler (``co_scheduler``) shrinks chunks that do not
fit and keeps a session's KV across its tool call only while that pays. The
ablations of seed 000 §6.5 take one of them out, falling back to stock vLLM's
decision (``EngineHalf``'s defaults) where it decided."""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.sdk.events import AnyEvent
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import EngineHalf, KVDecision, SessionAction, SortKey
from agentmars.server.policies.mars.co_scheduler import OpportunisticCoScheduler
from agentmars.server.policies.mars.coordinator import PriorityAwareCoordinator
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.views import CallView, EngineView, PinView


class MarsScheduler(EngineHalf):
    needs = frozenset({Capability.TOOL_FIGURES, Capability.TICK})
    uses = frozenset({Capability.COSTS})

    priority_refresh_s = 1.0
    """The level moves with the wait only once per ``promotion_wait_s`` (30 s): an
    engine may keep a key a second (a thirtieth of a level late at most; ours)."""

    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self.tick_interval_s = settings.pin_review_interval_s
        self.coordinator = PriorityAwareCoordinator(settings)
        self.co_scheduler = OpportunisticCoScheduler(settings)
        # The decisions an engine asks for at almost every step go straight to the part
        # that makes them. The methods below say which part, and mark on the class what
        # MARS decides (engines read that off it); they are not called through. An
        # ablation's fallback, its class's, stays.
        for name, part in DELEGATED:
            if getattr(type(self), name) is getattr(MarsScheduler, name):
                setattr(self, name, getattr(getattr(self, part), name))

    def on_event(self, event: AnyEvent) -> None:
        self.coordinator.on_event(event)
        self.co_scheduler.on_event(event)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return self.coordinator.priority(call, view)

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        return self.coordinator.victim(running, view)

    def reclaim(
        self, pins: Sequence[PinView], needed_blocks: int, view: EngineView
    ) -> Sequence[PinView]:
        return self.coordinator.reclaim(pins, view)

    def chunk(self, call: CallView, tokens: int, fit_tokens: int, view: EngineView) -> int:
        return self.co_scheduler.chunk(call, tokens, fit_tokens, view)

    def may_start_partial(self, call: CallView, view: EngineView) -> bool:
        return self.co_scheduler.may_start_partial(call, view)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        return self.co_scheduler.on_call_finished(call, view)

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        self.co_scheduler.forget_gone_partial(view)
        return self.co_scheduler.review(view.pins, view)


DELEGATED = (
    ("priority", "coordinator"),
    ("victim", "coordinator"),
    ("chunk", "co_scheduler"),
    ("may_start_partial", "co_scheduler"),
    ("on_call_finished", "co_scheduler"),
)
"""The engine half's decisions made by one part alone, with its signature."""


class NoCoordinatorScheduler(MarsScheduler):
    """Without the coordinator: vLLM's FCFS order, newest-call victim, oldest pin
    reclaimed first."""

    priority = EngineHalf.priority
    victim = EngineHalf.victim
    reclaim = EngineHalf.reclaim


class NoCoSchedulerScheduler(MarsScheduler):
    """Without the co-scheduler: whole prompts only, no pins (and so no reviews)."""

    needs = frozenset({Capability.TOOL_FIGURES})
    uses = frozenset()
    chunk = EngineHalf.chunk
    may_start_partial = EngineHalf.may_start_partial
    on_call_finished = EngineHalf.on_call_finished
    tick = EngineHalf.tick

    def __init__(self, settings: MarsSettings) -> None:
        super().__init__(settings)
        self.tick_interval_s = None
