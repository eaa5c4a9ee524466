"""ThunderAgent (Kang et al., 2026), the "TA" and "TA+O" baselines of seed 003
(notes/baselines.md "ThunderAgent")."""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.sdk.events import (
    AnyEvent,
    SessionEnd,
    SessionMove,
    SessionPause,
    SessionResume,
    ToolEnd,
    ToolStart,
)
from agentmars.server.policies.admission_view import UnstartedPrompts
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import (
    AdmissionHalf,
    EngineHalf,
    KVDecision,
    Pin,
    Policy,
    SessionAction,
)
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import AdmissionView, CallView, EngineView, SessionView

CHECK_INTERVAL_S = 5.0
"""How often thrashing is checked (the paper's 5 s)."""


@register
class ThunderAgent(Policy):
    """ThunderAgent: program-aware KV retention with pause and restore on thrashing.

    A program's KV stays on the GPU while it runs a tool (Acting) as while it runs on
    the engine (Reasoning). Every ``check_interval_s`` it checks for thrashing: the KV
    capacity is less than the contexts of the Reasoning programs plus those of the
    Acting ones. Then it pauses programs until the rest fits, Acting before Reasoning,
    shortest context first (a paused program loses its KV and its calls wait). When
    there is room again it restores paused programs, Reasoning first (those whose tool
    has finished), shortest first. New programs wait while any program is paused or
    their prompt does not fit in what is left; behind several replicas, each goes to
    the one with the most room left (best-fit-decreasing across replicas), and stays
    there.

    The two halves: the engine half pauses and restores (it sees the contexts) and the
    engine publishes each pause and resume; the admission half holds new programs while
    the stream says a program is paused, and fits their prompts into the free KV of
    the newest ``kv_stats`` figures, less the prompts it admitted that have not started
    yet (``UnstartedPrompts``). A prompt larger than the whole KV cache can never fit: it
    is let through at once (the engine refuses it with its own 4xx), not held at the
    head of the queue, where every later program would wait behind it for good."""

    name = "thunderagent"
    variant = "ThunderAgent paper as described by seed 003 (TA)"

    def __init__(self, check_interval_s: float = CHECK_INTERVAL_S) -> None:
        if check_interval_s <= 0:
            raise ValueError("check_interval_s must be positive")
        self.check_interval_s = check_interval_s

    def settings(self) -> dict[str, float]:
        return {"check_interval_s": self.check_interval_s}

    def admission(self) -> ThunderAgentAdmission:
        return ThunderAgentAdmission()

    def engine(self) -> ThunderAgentEngine:
        return ThunderAgentEngine(self.check_interval_s)


class ThunderAgentAdmission(AdmissionHalf):
    """Holds new programs while any is paused or their prompt does not fit."""

    needs = frozenset({Capability.KV_FIGURES})

    def __init__(self) -> None:
        self._paused: set[str] = set()
        self._unstarted = UnstartedPrompts()
        self._placed: dict[str, int] = {}
        """Where ``admit`` fitted each session it let in (``place`` hands it over)."""

    def on_event(self, event: AnyEvent) -> None:
        self._unstarted.observe(event)
        if isinstance(event, SessionPause):
            self._paused.add(event.session_id)
        elif isinstance(event, SessionResume | SessionEnd | SessionMove):
            self._paused.discard(event.session_id)
        if isinstance(event, SessionEnd):  # its unstarted prompt went with the feed above
            self._placed.pop(event.session_id, None)

    def release(self, session_id: str) -> None:
        self._unstarted.started(session_id)
        # A session seated again keeps its replica, so ``place`` may not take this.
        self._placed.pop(session_id, None)

    def room(self, view: AdmissionView) -> dict[int, int]:
        """Each replica's room in tokens: its free KV less the prompts placed there that
        have not started (replicas that have sent no KV figures left out)."""
        return {
            replica.index: replica.kv.free_blocks * view.block_size
            - self._unstarted.on(replica.index)
            for replica in view.replicas
            if replica.kv is not None
        }

    def holds_new(self) -> bool:
        """New programs wait (ThunderAgent: while any program is paused)."""
        return bool(self._paused)

    def order(self, queue: Sequence[SessionView]) -> Sequence[SessionView]:
        """The order new programs are fitted in (ThunderAgent: arrival)."""
        return queue

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        """Fit each prompt into the replica with the most room (free KV less the prompts
        placed there that have not started): the best-fit-decreasing placement across
        replicas as seed 003 describes it ("the replica with the most available
        capacity first")."""
        replicas = view.replicas
        if self.holds_new() or any(replica.kv is None for replica in replicas):
            return ()
        room = self.room(view)
        largest = max(
            replica.kv.total_blocks * view.block_size
            for replica in replicas
            if replica.kv is not None
        )
        admitted = []
        for session in self.order(queue):
            index = max(room, key=lambda i: (room[i], -i))
            if session.prompt_tokens > largest:
                self._placed[session.session_id] = index
                admitted.append(session)
                continue
            if session.prompt_tokens > room[index]:
                break
            room[index] -= session.prompt_tokens
            self._placed[session.session_id] = index
            self._unstarted.add(session.session_id, session.prompt_tokens, index)
            admitted.append(session)
        return admitted

    def place(self, session: SessionView, view: AdmissionView) -> int:
        return self._placed.pop(session.session_id, 0)


class ThunderAgentEngine(EngineHalf):
    """Pins every program's KV, pauses on thrashing and restores when there is room."""

    needs = frozenset({Capability.TICK, Capability.PAUSE, Capability.TOOL_FIGURES})

    def __init__(self, check_interval_s: float) -> None:
        self.tick_interval_s = check_interval_s
        self._paused: dict[str, int] = {}
        """Paused programs and their context when paused."""
        self._acting: set[str] = set()
        """Programs running a tool."""

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, ToolStart):
            self._acting.add(event.session_id)
        elif isinstance(event, ToolEnd):
            self._acting.discard(event.session_id)
        elif isinstance(event, SessionEnd):
            self._paused.pop(event.session_id, None)
            self._acting.discard(event.session_id)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        return Pin()

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        contexts = self._contexts(view)
        usage = sum(contexts.values())
        capacity = view.total_blocks * view.block_size
        if usage > capacity:
            return self._pause(contexts, usage - capacity)
        return self._restore(capacity - usage)

    def _contexts(self, view: EngineView) -> dict[str, int]:
        """Context of every running (Reasoning) and pinned (Acting) program."""
        contexts = {pin.session_id: pin.tokens for pin in view.pins}
        for call in (*view.running, *view.waiting):
            contexts[call.session_id] = call.num_tokens
        return contexts

    def _pause(self, contexts: dict[str, int], excess: int) -> list[SessionAction]:
        order = sorted(contexts, key=lambda sid: (sid not in self._acting, contexts[sid]))
        actions = []
        for session_id in order:
            if excess <= 0:
                break
            excess -= contexts[session_id]
            self._paused[session_id] = contexts[session_id]
            actions.append(SessionAction("pause", session_id))
        return actions

    def _restore(self, room: int) -> list[SessionAction]:
        order = sorted(self._paused, key=lambda sid: (sid in self._acting, self._paused[sid]))
        actions = []
        for session_id in order:
            if self._paused[session_id] > room:
                break
            room -= self._paused.pop(session_id)
            actions.append(SessionAction("resume", session_id))
        return actions


@register
class ThunderAgentOffload(ThunderAgent):
    """ThunderAgent with a CPU KV tier managed by plain LRU (seed 003's "TA+O").

    Blocks the GPU drops (a paused program's, or any evicted prefix) are kept in host
    memory, least recently used out first, unaware of program phases; a program's next
    call loads what it finds there instead of recomputing it."""

    name = "thunderagent-cpu"
    variant = "seed 003's TA+O: ThunderAgent plus an LRU CPU tier"

    def engine(self) -> ThunderAgentEngine:
        return ThunderAgentOffloadEngine(self.check_interval_s)


class ThunderAgentOffloadEngine(ThunderAgentEngine):
    needs = ThunderAgentEngine.needs | {Capability.CPU_TIER}
    offload_evicted = True
