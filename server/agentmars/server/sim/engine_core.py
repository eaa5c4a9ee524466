"""What the two engines built on the simulator's mechanism share: the engine side of
the engine half's ``EngineView`` over the simulator's ``KVCache`` and ``Scheduler``,
the settlement of a finished step, the KV half of a finished call's outcome, and the
policy's session actions. ``SimEngine`` (virtual time, ``sim.engine``) and the
wall-clock twin's ``LiveEngine`` (``engines.twin``) differ only in how time passes,
where calls come from and where their events go."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentmars.sdk.events import (
    AnyEvent,
    KVPin,
    KVStats,
    KVUnpin,
    ReleaseReason,
    SessionPause,
    SessionResume,
)
from agentmars.server.policies.interface import KVDecision, Offload, Pin, SessionAction
from agentmars.server.policies.views import CostEstimator
from agentmars.server.profiles.cost_model import CostModel, Profile
from agentmars.server.sim.entities import Call, Session
from agentmars.server.sim.entities import Pin as PinEntity
from agentmars.server.sim.kv_cache import KVCache
from agentmars.server.sim.scheduler import Scheduler, Step, batch_shape


@dataclass(frozen=True, slots=True)
class Settled:
    """What a finished step did: the calls whose tokens are all computed now (each
    gets one more token, in batch order), and the prompt tokens computed."""

    produced: list[Call]
    prefill_tokens: int


def sm_phase(call: Call) -> str:
    """The phase of a scheduled call whose SM-share curve applies (seed 002 Fig. 3):
    ``decode``; ``resume_prefill`` for a call after a tool whose admission found part
    of its context cached; else ``cold_prefill``."""
    if call.decoding:
        return "decode"
    if call.follows_tool and (call.cached_tokens or 0) > 0:
        return "resume_prefill"
    return "cold_prefill"


def partition_time(
    cost: CostModel, profile: Profile, batch: list[tuple[Call, int]], share: float
) -> float:
    """How long ``batch`` takes on ``share`` (> 0) of the GPU's SMs: its time on the
    whole GPU (the cost model's, the batch as one step) over its throughput at that
    share, ``profile.sm_throughput``. A batch of several phases runs at their
    throughputs weighted by each phase's part of the work, measured as that part's
    time alone on the whole GPU (seed 002 Eq. 1, mu_P = eta mu_C + (1 - eta) mu_R,
    with eta the cold prefills' share of the prefill work; the decodes likewise)."""
    parts: dict[str, list[tuple[Call, int]]] = {}
    for entry in batch:
        parts.setdefault(sm_phase(entry[0]), []).append(entry)
    if len(parts) == 1:
        (phase,) = parts
        throughput = profile.sm_throughput(phase, share)
    else:
        weights = {phase: cost.step_time(batch_shape(part)) for phase, part in parts.items()}
        throughput = sum(
            weight * profile.sm_throughput(phase, share) for phase, weight in weights.items()
        ) / sum(weights.values())
    return cost.step_time(batch_shape(batch)) / throughput


class KVEngineView:
    """The ``EngineView`` fields an engine answers from its KV cache, scheduler and
    cost model (the tool and session fields are each engine's own)."""

    kv: KVCache
    scheduler: Scheduler
    cost: CostModel
    decode_steps: int = 0
    """Steps that decoded at least one sequence (``EngineView.decode_steps``)."""
    decode_time_s: float = 0.0
    """Their summed durations (``EngineView.decode_time_s``)."""

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    @property
    def total_blocks(self) -> int:
        return self.kv.pool.num_blocks

    @property
    def free_blocks(self) -> int:
        return self.kv.pool.num_free

    @property
    def pinned_blocks(self) -> int:
        return self.kv.pinned_blocks

    @property
    def cpu_total_blocks(self) -> int:
        return self.kv.cpu.capacity if self.kv.cpu is not None else 0

    @property
    def cpu_free_blocks(self) -> int:
        return self.kv.cpu.free if self.kv.cpu is not None else 0

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    @property
    def running(self) -> Sequence[Call]:
        return self.scheduler.running

    def running_growth_up_to(self, blocks: int) -> int:
        return min(self.running_growth_blocks, blocks)

    @property
    def running_growth_blocks(self) -> int:
        blocks_for = self.kv.blocks_for
        return sum(
            max(blocks_for(call.prompt_tokens + call.max_tokens) - len(call.blocks), 0)
            for call in self.scheduler.running
        )

    @property
    def waiting(self) -> Sequence[Call]:
        return self.scheduler.waiting

    @property
    def pins(self) -> Sequence[PinEntity]:
        return list(self.kv.pins.values())

    def pin_of(self, session_id: str) -> PinEntity | None:
        return self.kv.pins.get(session_id)

    @property
    def has_costs(self) -> bool:
        return True

    @property
    def costs(self) -> CostEstimator:
        return self.cost

    def blocks_for(self, tokens: int) -> int:
        return self.kv.blocks_for(tokens)

    def pool_stats(self, steps: int, **stamp: Any) -> KVStats:
        """The block pool, pins and CPU tier now, as the engine reports them."""
        return KVStats.of_pool(
            total=self.kv.pool.num_blocks,
            free=self.kv.pool.num_free,
            pinned=self.kv.pinned_blocks,
            pins=len(self.kv.pins),
            released=dict(self.kv.released),
            cpu_total_blocks=self.cpu_total_blocks,
            cpu_free_blocks=self.cpu_free_blocks,
            steps=steps,
            **stamp,
        )

    # --- steps -------------------------------------------------------------------------

    def settle(self, step: Step, duration: float) -> Settled:
        """The end of a step: each scheduled call's computed tokens catch up, it was
        served ``duration`` longer, and its full blocks are named for the prefix cache.
        A call that lost its blocks during the step (aborted, or its session paused)
        is skipped."""
        produced = []
        prefill = 0
        decoded = False
        for call, tokens in step.batch:
            if not call.blocks:
                continue
            if call.decoding:
                decoded = True
            else:
                prefill += tokens  # as ``Step.shape`` tells prefill from decode
            call.num_computed_tokens += tokens
            call.service_s += duration
            self.kv.cache_full_blocks(call)
            if call.num_computed_tokens == call.num_tokens:
                produced.append(call)
        if decoded:
            self.decode_steps += 1
            self.decode_time_s += duration
        return Settled(produced, prefill)

    # --- the KV half of outcomes ---------------------------------------------------------

    def keep_or_free(self, call: Call, decision: KVDecision | None, now: float) -> PinEntity | None:
        """Free a finished call's blocks after doing what the policy decided with them
        (a paused session keeps no pin); returns the new pin, if any."""
        pin = None
        if isinstance(decision, Pin) and not call.session.paused:
            pin = self.kv.pin(call, now, decision.ttl_s)
        elif isinstance(decision, Offload):
            self.kv.swap_out(call.session, 0, call.num_hashed_blocks, now)
        self.kv.free(call)
        return pin

    def drop_pin(self, session: Session, *, offload: bool, blocks: int | None = None) -> None:
        """A policy's ``unpin`` or ``offload`` action on the session's pin (``blocks``:
        swap out only that many of its last blocks)."""
        if offload:
            self.kv.swap_out_pin(session, blocks, self.scheduler.view.now)
            return
        if self.kv.unpin(session.session_id, "policy") is not None:
            # A discarded pin loses what was already swapped of it too, as InferCept's
            # released code frees a discarded sequence's CPU blocks with its GPU ones.
            self.kv.release_swapped(session.session_id)

    def pin_taken(self, pin: PinEntity) -> None:
        """``PinWatch``: a pin is announced on the stream."""
        ttl_s = None if pin.expires_s is None else pin.expires_s - pin.pinned_s
        self.announce(
            KVPin(session_id=pin.session_id, blocks=pin.blocks, ttl_s=ttl_s, **self.stamp())
        )

    def pin_released(self, pin: PinEntity, reason: ReleaseReason) -> None:
        """``PinWatch``: a release is announced on the stream."""
        held_s = max(self.scheduler.view.now - pin.pinned_s, 0.0)
        self.announce(
            KVUnpin(
                session_id=pin.session_id,
                blocks=pin.blocks,
                reason=reason,
                held_s=held_s,
                **self.stamp(),
            )
        )

    def step_duration(self, step: Step, now: float) -> float:
        """How long a step started at ``now`` takes: its compute, after the copies of
        the calls it preempted by swap are out (vLLM V0 swaps out synchronously, before
        the forward pass, since the step reuses their blocks)."""
        return self.cost.step_time(step.shape()) + max(step.swapped_out_s - now, 0.0)

    # --- the policy's session actions -------------------------------------------------

    def apply(
        self, actions: Sequence[SessionAction], find: Callable[[str], Session | None]
    ) -> None:
        """Do what a ``tick`` returned to the sessions ``find`` knows (others are gone);
        a pause or resume is announced on the stream (``announce``)."""
        for action in actions:
            session = find(action.session_id)
            if session is None:
                continue
            if action.kind in ("unpin", "offload"):
                self.drop_pin(session, offload=action.kind == "offload", blocks=action.blocks)
            elif action.kind == "prefetch":
                self.scheduler.load_ahead(session, self.scheduler.view.now)
            elif action.kind == "pause":
                self._pause(session)
                pause = SessionPause(
                    session_id=session.session_id, reason=action.reason, **self.stamp()
                )
                self.announce(pause)
            elif action.kind == "resume":
                session.paused = False
                held, session.held = session.held, []
                self.resubmit(held)
                self.announce(SessionResume(session_id=session.session_id, **self.stamp()))

    def _pause(self, session: Session) -> None:
        """The session's pin goes, its running calls are preempted, and its waiting
        calls leave the engine, held (with any it sends meanwhile) until it resumes."""
        session.paused = True
        session_id = session.session_id
        self.kv.unpin(session_id, "paused")
        for call in list(self.scheduler.running):
            if call.session_id == session_id:
                self.scheduler.preempt(call, self.scheduler.view.now)
        held = [call for call in self.scheduler.waiting if call.session_id == session_id]
        for call in held:
            self.scheduler.waiting.remove(call)
        session.held.extend(held)

    def announce(self, event: AnyEvent) -> None:
        """Put an event of the engine's on the stream (each engine's own way)."""
        raise NotImplementedError

    def stamp(self) -> dict[str, Any]:
        """The engine's fields of an event it makes (source, times)."""
        raise NotImplementedError

    def resubmit(self, calls: list[Call]) -> None:
        """Calls a resumed session's pause held: back into the engine."""
        raise NotImplementedError
