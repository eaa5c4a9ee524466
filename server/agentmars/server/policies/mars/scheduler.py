"""MARS's Internal Agent-Centric Scheduler, the engine half (seed 000 §4.3): the
Priority-Aware Coordinator (``coordinator``) orders the waiting calls and chooses what
to evict; the Opportunistic Co-Scheduler (``co_scheduler``) shrinks chunks that do not
fit and keeps a session's KV across its tool call only while that pays. The
ablations of seed 000 §6.5 take one of them out, falling back to stock vLLM's
decision (``EngineHalf``'s defaults) where it decided."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from agentmars.sdk.events import AnyEvent
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import EngineHalf, KVDecision, SessionAction, SortKey
from agentmars.server.policies.mars.co_scheduler import OpportunisticCoScheduler
from agentmars.server.policies.mars.coordinator import PriorityAwareCoordinator
from agentmars.server.policies.mars.kv_tier import Place, transfer_s
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.views import CallView, EngineView, PinView, tool_mean_s


class MarsScheduler(EngineHalf):
    needs = frozenset({Capability.TOOL_FIGURES, Capability.TICK})
    uses = frozenset({Capability.COSTS, Capability.CPU_TIER, Capability.PREFETCH})
    tier: ClassVar[bool] = True
    """Parked sessions' KV may go to the engine's CPU tier (``kv_tier``), and does
    first under pressure (``evict_to_tier``)."""
    prefetch: ClassVar[bool] = True
    """A session's KV comes back from the tier ahead of its next call (``load_ahead``)."""
    preempt_by_swap = True
    """With a tier, a preempted call's KV goes there, not away (a long context's
    recompute costs seconds at GPU scale, its transfer milliseconds)."""

    priority_refresh_s = 1.0
    """The level moves with the wait only once per ``promotion_wait_s`` (30 s): an
    engine may keep a key a second (a thirtieth of a level late at most; ours)."""

    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self.tick_interval_s = settings.pin_review_interval_s
        self.coordinator = PriorityAwareCoordinator(settings)
        self.co_scheduler = OpportunisticCoScheduler(
            settings, tier=self.tier, prefetch=self.tier and self.prefetch
        )
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
        co_scheduler = self.co_scheduler
        co_scheduler.forget_gone_partial(view)
        active = {call.session_id for call in (*view.running, *view.waiting)}
        for session_id in active & co_scheduler.parked.keys():
            del co_scheduler.parked[session_id]  # its next call came
        actions = co_scheduler.review(view.pins, view)
        if not self.tier or not view.cpu_total_blocks:
            return actions
        moved = {action.session_id for action in actions}
        actions += self.evict_to_tier(view, moved, active)
        if self.prefetch:
            actions += self.load_ahead(view)
        return actions

    def evict_to_tier(
        self, view: EngineView, moved: set[str], active: set[str]
    ) -> list[SessionAction]:
        """Under pressure, the pins the waiting calls need the blocks of go to the CPU
        tier, before the engine would drop them: the coordinator's reclaim order
        (lowest priority first), while the tier has room. NOTE: ours — on the tick,
        not in the engine's own reclaim, so that both engines do it through the same
        ``offload`` action."""
        missing = waiting_demand(view) - view.free_blocks
        room = view.cpu_free_blocks
        actions: list[SessionAction] = []
        if missing <= 0:
            return actions
        pins = [p for p in view.pins if p.session_id not in moved | active]
        for pin in self.coordinator.reclaim(pins, view):
            if missing <= 0:
                break
            if pin.blocks > room:
                continue
            actions.append(self.co_scheduler.offload(pin))
            room -= pin.blocks
            missing -= pin.blocks
        return actions

    def load_ahead(self, view: EngineView) -> list[SessionAction]:
        """Bring back from the tier the KV of sessions whose tool has ended or is due
        to end within a load's time (and a tick's), on blocks no waiting call needs:
        the sandbox's tool events drive it (``Parked.tool_done``), the tool's kind's
        mean predicts it (NOTE: ours — the mean, not the heavy-tail rule the reviews
        use: a load that comes early only holds the blocks a little longer)."""
        spare = view.free_blocks - waiting_demand(view)
        actions: list[SessionAction] = []
        co_scheduler = self.co_scheduler
        for session_id, parked in co_scheduler.parked.items():
            if parked.place is not Place.CPU or parked.blocks > spare:
                continue
            if not parked.tool_done:
                copy_s = transfer_s(parked.blocks, view) or 0.0
                lead = copy_s + self.settings.pin_review_interval_s
                mean = tool_mean_s(view, parked.tool)
                if mean is None or view.now - parked.since_s + lead < mean:
                    continue
            actions.append(SessionAction("prefetch", session_id))
            parked.place = Place.GPU
            spare -= parked.blocks
        return actions


DELEGATED = (
    ("priority", "coordinator"),
    ("victim", "coordinator"),
    ("chunk", "co_scheduler"),
    ("may_start_partial", "co_scheduler"),
    ("on_call_finished", "co_scheduler"),
)
"""The engine half's decisions made by one part alone, with its signature."""


def waiting_demand(view: EngineView) -> int:
    """Blocks the waiting calls need beyond their sessions' pins."""
    demand = 0
    for call in view.waiting:
        pin = view.pin_of(call.session_id)
        demand += max(view.blocks_for(call.num_tokens) - (pin.blocks if pin else 0), 0)
    return demand


class PaperScheduler(MarsScheduler):
    """Seed 000's engine half as published: KV kept on the GPU or dropped, no tier."""

    uses = frozenset({Capability.COSTS})
    tier = False
    prefetch = False
    preempt_by_swap = False


class NoPrefetchScheduler(MarsScheduler):
    """The tier without loads ahead of need: a session's next call loads its KV."""

    uses = frozenset({Capability.COSTS, Capability.CPU_TIER})
    prefetch = False


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
