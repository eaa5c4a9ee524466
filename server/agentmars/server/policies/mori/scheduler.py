"""MORI's scheduler inside the engine (seed 003 §4.3): the tiers' control loop, lazy
demotion, gating, and the typed order of the engine's waiting calls.

The engine half owns the placement because it sees the contexts (its calls and pins)
and does the moves: an offload is the ``offload`` action (the pin's blocks to the CPU
tier), gating is ``pause`` (calls held, what is left of the KV on the GPU dropped),
promotion is ``resume`` (the held call runs; what the CPU tier holds of it loads
back, the rest is recomputed). Each pause and resume is published, so the admission
half learns from the stream which programs are gated.

Typed offloading (§4.3.2) on this engine's mechanism. GPU: the busy programs' blocks
are pinned, so the engine evicts only the free cached blocks of idle and inactive
programs, least recently used first; NOTE: ours — the type does not order those two
(the paper evicts inactive before idle). CPU: an idle program's offloaded blocks are
held there and never evicted (the CPU tier's capacity is the scheduler's to keep,
``demotions`` does), and the engine's LRU copies of what the GPU evicts
(``offload_evicted``, HiCache's write-back in the paper's SGLang) give way first: the
order inactive/busy before idle. The same types order the waiting calls: GPU-tier
(busy) programs' calls first.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.sdk.events import AnyEvent, LLMSubmit, SessionEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import (
    EngineHalf,
    KVDecision,
    Offload,
    Pin,
    Release,
    SessionAction,
    SortKey,
)
from agentmars.server.policies.mori.idleness import Idleness
from agentmars.server.policies.mori.placement import Candidate, Demotion, demotions, promotions
from agentmars.server.policies.mori.settings import MoriSettings
from agentmars.server.policies.mori.tiers import Program, Tier
from agentmars.server.policies.views import CallView, EngineView


class MoriEngine(EngineHalf):
    needs = frozenset({Capability.TICK, Capability.PAUSE, Capability.CPU_TIER})
    offload_evicted = True

    def __init__(self, settings: MoriSettings) -> None:
        self.settings = settings
        self.tick_interval_s = settings.gate_check_s
        self._programs: dict[str, Program] = {}
        self._next_rebalance_s: float | None = None

    # --- the stream ------------------------------------------------------------------

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, LLMSubmit):
            program = self._programs.get(event.session_id)
            if program is not None:
                program.submitted = event.call_id
                if program.gated and event.projected_prompt_tokens is not None:
                    program.tokens = event.projected_prompt_tokens
        elif isinstance(event, SessionEnd):
            self._programs.pop(event.session_id, None)

    def _program(self, session_id: str) -> Program:
        program = self._programs.get(session_id)
        if program is None:
            program = Program(Idleness(self.settings.window_cycles))
            self._programs[session_id] = program
        return program

    def idleness(self, session_id: str, now: float) -> float:
        program = self._programs.get(session_id)
        if program is None:
            return 0.0
        return program.idleness.value(now)

    def tier(self, session_id: str) -> Tier | None:
        program = self._programs.get(session_id)
        return None if program is None else program.tier

    # --- decisions --------------------------------------------------------------------

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        program = self._programs.get(call.session_id)
        busy = program is None or program.tier is Tier.GPU
        return (not busy, call.arrival_s)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        program = self._program(call.session_id)
        self._see(call, program)
        program.idleness.call_ended(view.now)
        program.tokens = call.num_tokens
        if program.demote_to is None:
            return Pin()
        program.tier, program.demote_to = program.demote_to, None
        return Offload() if program.tier is Tier.CPU else Release()

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        now = view.now
        for call in (*view.running, *view.waiting):
            self._see(call, self._program(call.session_id))
        for program in self._programs.values():
            if program.gated and program.held_since_s is None and program.holds_call:
                program.held_since_s = now
                program.idleness.call_arrived(now)
        actions = self._gate_lazy_demotions()
        if self._next_rebalance_s is None:
            self._next_rebalance_s = now + self.settings.tick_s
        elif now >= self._next_rebalance_s:
            self._next_rebalance_s = now + self.settings.tick_s
            actions += self._rebalance(view)
        return actions

    def _see(self, call: CallView, program: Program) -> None:
        """A call met for the first time: its program's Acting gap ends at its arrival
        and Reasoning starts, or, for a call held in a gated tier (whose gap ended when
        it came, ``tick``), Reasoning starts when the program was let through."""
        if program.call_id == call.call_id:
            return
        program.call_id = call.call_id
        if program.resumed_s is None:
            program.idleness.call_arrived(call.arrival_s)
            program.idleness.call_started(call.arrival_s)
        else:
            program.idleness.call_started(max(call.arrival_s, program.resumed_s))
        program.resumed_s = program.held_since_s = None
        program.tokens = call.num_tokens
        if program.tier is not Tier.GPU and not program.gated:
            # A lazy victim's next call came before its gate: it is on the GPU again.
            program.tier, program.cpu_blocks = Tier.GPU, 0

    def _gate_lazy_demotions(self) -> list[SessionAction]:
        actions = []
        for session_id, program in self._programs.items():
            demoted = program.tier is not Tier.GPU and not program.gated
            if demoted and not program.idleness.reasoning:
                program.gated = True
                actions.append(SessionAction("pause", session_id, program.tier.pause_reason))
        return actions

    def _rebalance(self, view: EngineView) -> list[SessionAction]:
        contexts = self._gpu_contexts(view)
        capacity = view.total_blocks * view.block_size
        usage = sum(contexts.values())
        if usage > capacity:
            return self._demote(view, contexts, usage - capacity)
        return self._promote(view, contexts, capacity - usage)

    def _gpu_contexts(self, view: EngineView) -> dict[str, int]:
        """What each GPU-tier program holds or asks for on the GPU: its pin, or its call's
        context (a waiting call's whole prompt: the demand, as ThunderAgent counts it)."""
        contexts = {pin.session_id: pin.tokens for pin in view.pins}
        for call in (*view.running, *view.waiting):
            contexts[call.session_id] = call.num_tokens
        return {
            session_id: tokens
            for session_id, tokens in contexts.items()
            if self._program(session_id).tier is Tier.GPU
            and self._program(session_id).demote_to is None
        }

    def _candidates(self, view: EngineView, contexts: dict[str, int]) -> list[Candidate]:
        now = view.now
        return [
            Candidate(
                session_id,
                tokens,
                self._programs[session_id].idleness.value(now),
                reasoning=self._programs[session_id].idleness.reasoning,
                blocks=view.blocks_for(tokens),
            )
            for session_id, tokens in contexts.items()
        ]

    def _demote(
        self, view: EngineView, contexts: dict[str, int], excess: int
    ) -> list[SessionAction]:
        moves = demotions(self._candidates(view, contexts), excess, self._cpu_free_blocks(view))
        return self._move_down(view, contexts, moves)

    def _move_down(
        self, view: EngineView, contexts: dict[str, int], moves: list[Demotion]
    ) -> list[SessionAction]:
        actions = []
        for move in moves:
            program = self._programs[move.session_id]
            if move.to is Tier.CPU:
                program.cpu_blocks = view.blocks_for(contexts[move.session_id])
            if move.lazy:
                program.demote_to = move.to
                continue
            program.tier, program.gated = move.to, True
            if move.to is Tier.CPU:
                actions.append(SessionAction("offload", move.session_id))
            actions.append(SessionAction("pause", move.session_id, move.to.pause_reason))
        return actions

    def _cpu_free_blocks(self, view: EngineView) -> int:
        """The CPU tier less what its programs hold or are promised (lazy demotions)."""
        held = sum(
            program.cpu_blocks
            for program in self._programs.values()
            if program.tier is Tier.CPU or program.demote_to is Tier.CPU
        )
        return max(view.cpu_total_blocks - held, 0)

    def _promote(
        self, view: EngineView, contexts: dict[str, int], room: int
    ) -> list[SessionAction]:
        now = view.now
        waiting = [
            Candidate(
                session_id,
                program.tokens,
                program.idleness.value(now),
                tier=program.tier,
                blocks=program.cpu_blocks,
            )
            for session_id, program in self._programs.items()
            if program.gated and program.held_since_s is not None
        ]
        if not waiting:
            return []
        residents = [c for c in self._candidates(view, contexts) if not c.reasoning]
        promoted, moves = promotions(waiting, room, residents, self._cpu_free_blocks(view))
        actions = self._move_down(view, contexts, moves)
        for session_id in promoted:
            program = self._programs[session_id]
            program.tier, program.gated, program.cpu_blocks = Tier.GPU, False, 0
            program.resumed_s = now
            actions.append(SessionAction("resume", session_id))
        return actions
