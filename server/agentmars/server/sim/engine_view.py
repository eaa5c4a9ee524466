"""What the two simulated engines share: the engine side of the policy's ``EngineView``
over the simulator's ``KVCache`` and ``Scheduler``, and the KV half of a finished
call's and a policy action's outcome. ``SimEngine`` (virtual time) and ``LiveEngine``
(wall clock) differ only in how time passes and where calls come from."""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.server.policies.interface import KVDecision, Offload, Pin
from agentmars.server.policies.views import CostEstimator
from agentmars.server.profiles.cost_model import CostModel
from agentmars.server.sim.entities import Call, Session
from agentmars.server.sim.entities import Pin as PinEntity
from agentmars.server.sim.kv_cache import KVCache
from agentmars.server.sim.scheduler import Scheduler


class KVEngineView:
    """The ``EngineView`` fields an engine answers from its KV cache, scheduler and
    cost model (the tool and session fields are each engine's own)."""

    kv: KVCache
    scheduler: Scheduler
    cost: CostModel

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
        return self.kv.cpu.capacity - self.kv.cpu.used if self.kv.cpu is not None else 0

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    @property
    def running(self) -> Sequence[Call]:
        return self.scheduler.running

    @property
    def waiting(self) -> Sequence[Call]:
        return self.scheduler.waiting

    @property
    def pins(self) -> Sequence[PinEntity]:
        return list(self.kv.pins.values())

    def pin_of(self, session_id: str) -> PinEntity | None:
        return self.kv.pins.get(session_id)

    @property
    def costs(self) -> CostEstimator:
        return self.cost

    def blocks_for(self, tokens: int) -> int:
        return self.kv.blocks_for(tokens)

    # --- the KV half of outcomes ---------------------------------------------------------

    def keep_or_free(self, call: Call, decision: KVDecision | None, now: float) -> PinEntity | None:
        """Free a finished call's blocks after doing what the policy decided with them
        (a paused session keeps no pin); returns the new pin, if any."""
        pin = None
        if isinstance(decision, Pin) and not call.session.paused:
            pin = self.kv.pin(call, now, decision.ttl_s)
        elif isinstance(decision, Offload):
            self.kv.store_to_cpu(call.session, call.num_hashed_blocks)
        self.kv.free(call)
        return pin

    def drop_pin(self, session: Session, *, offload: bool) -> None:
        """A policy's ``unpin`` or ``offload`` action on the session's pin."""
        pin = self.kv.unpin(session.session_id)
        if offload and pin is not None:
            self.kv.store_to_cpu(session, pin.blocks)
