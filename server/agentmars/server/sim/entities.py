"""The simulated engine's entities: a session in flight, one LLM call, one pin. They
are what the policies see through ``policies.interface``'s views (same attribute
names), and what the records are filled from."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentmars.server.metrics.records import CallRecord, SessionRecord
from agentmars.server.sim.block_pool import block_key
from agentmars.server.workloads.model import SessionSpec


@dataclass(eq=False, slots=True)
class Session:
    spec: SessionSpec
    arrival_s: float
    record: SessionRecord
    turn: int = 0
    paused: bool = False
    held: list[Call] = field(default_factory=list)
    """Its calls kept out of the engine while a policy has the session paused."""
    kv_owner: int = 0
    kv_group: int = 0
    shared_blocks: int = 0
    """Its first blocks are the shared prefix of ``kv_group``'s sessions; the rest are
    its own (``kv_owner``). The KV cache sets these three."""

    @property
    def session_id(self) -> str:
        return self.spec.session_id

    @property
    def agent(self) -> str:
        return self.spec.agent

    @property
    def prompt_tokens(self) -> int:
        """The prompt of the call it sends next."""
        return self.spec.prompt_tokens(self.turn)

    @property
    def task_id(self) -> str:
        return self.spec.task_id or self.spec.session_id

    @property
    def prompt_text(self) -> str:
        """The workload's input text of the agent on its first call (the simulator has
        no other prompt text)."""
        return (self.spec.input_text or "") if self.turn == 0 else ""

    def key(self, index: int) -> int:
        """The block key of its context's block ``index``."""
        if index < self.shared_blocks:
            return block_key(self.kv_group, index)
        return block_key(self.kv_owner, index - self.shared_blocks)


@dataclass(eq=False, slots=True)
class Call:
    """One LLM call; the attribute names are ``policies.interface.CallView``'s."""

    call_id: str
    session: Session
    turn: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    follows_tool: bool
    expects_tool: bool
    next_tool: str | None
    expected_tool_s: float | None
    record: CallRecord
    output_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    service_s: float = 0.0
    blocks: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    ready_s: float = 0.0
    """Not schedulable before this time (its prefix is loading from the CPU tier)."""
    looked_up: bool = False
    """Its prefix was looked up in the cache at least once (counted in the hit rate)."""
    recomputing_until: int = 0
    """After a preemption by recompute: tokens up to here are computed again."""

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def session_arrival_s(self) -> float:
        return self.session.arrival_s

    @property
    def agent(self) -> str:
        return self.session.agent

    @property
    def task_id(self) -> str:
        return self.session.spec.task_id or self.session.session_id

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.prompt_tokens

    @property
    def decoding(self) -> bool:
        """Its next step computes one token past its prompt (as ``Step.shape`` tells a
        decode from a prefill chunk)."""
        return self.output_tokens > 0 and self.num_computed_tokens == self.num_tokens - 1

    @property
    def cached_tokens(self) -> int | None:
        """Tokens its first admission found in the prefix cache (None: not admitted)."""
        return self.record.cached_tokens if self.looked_up else None

    @property
    def finished(self) -> bool:
        return self.output_tokens >= self.max_tokens


@dataclass(eq=False, slots=True)
class Pin:
    """Blocks held for a session between its calls (``policies.interface.PinView``)."""

    session_id: str
    block_ids: list[int]
    tokens: int
    pinned_s: float
    expires_s: float | None
    session_arrival_s: float

    @property
    def blocks(self) -> int:
        return len(self.block_ids)
