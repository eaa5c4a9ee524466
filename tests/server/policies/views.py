"""Plain data that satisfies the policy halves' read-only views
(``agentmars.server.policies.views``), for calling a policy's decisions directly: a
call, a pin, a session at the gateway, the engine (for the engine half), the gateway
(for the admission half), and a linear cost estimator whose times are easy to work out
by hand. Frozen: a test that moves time on builds a new view with
``dataclasses.replace``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentmars.sdk.events import KVStats
from agentmars.server.policies.admission_view import Replica
from agentmars.server.policies.views import growth_blocks


@dataclass(frozen=True)
class CallData:
    """A ``CallView``."""

    call_id: str
    session_id: str
    turn: int = 0
    arrival_s: float = 0.0
    session_arrival_s: float = 0.0
    prompt_tokens: int = 100
    output_tokens: int = 0
    max_tokens: int = 10
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    service_s: float = 0.0
    cached_tokens: int | None = None
    follows_tool: bool = False
    expects_tool: bool = True
    next_tool: str | None = None
    expected_tool_s: float | None = None
    agent: str = "agent"
    task_id: str = ""
    """The agent instance; empty: the session itself (a session that is its own task)."""

    def __post_init__(self) -> None:
        if not self.task_id:
            object.__setattr__(self, "task_id", self.session_id)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


def call(session_id: str, turn: int = 0, **fields: Any) -> CallData:
    """Call ``turn`` of a session, with the simulator's id scheme ``session/turn``."""
    return CallData(call_id=f"{session_id}/{turn}", session_id=session_id, turn=turn, **fields)


@dataclass(frozen=True)
class PinData:
    """A ``PinView``."""

    session_id: str
    blocks: int
    tokens: int
    pinned_s: float = 0.0
    expires_s: float | None = None
    session_arrival_s: float = 0.0


@dataclass(frozen=True)
class SessionData:
    """A ``SessionView``: a session waiting at the gateway."""

    session_id: str
    prompt_tokens: int
    arrival_s: float = 0.0
    agent: str = "agent"
    task_id: str = ""
    """The agent instance; empty: the session itself."""
    prompt_text: str = ""

    def __post_init__(self) -> None:
        if not self.task_id:
            object.__setattr__(self, "task_id", self.session_id)


@dataclass(frozen=True)
class LinearCosts:
    """A ``CostEstimator`` with linear times: prefill ``prefill_s_per_token`` a token;
    a decode step ``decode_step_s`` plus ``decode_s_per_token`` per context token of
    each sequence; ``transfer_s_per_block`` per block moved."""

    prefill_s_per_token: float = 0.0
    decode_step_s: float = 0.0
    decode_s_per_token: float = 0.0
    transfer_s_per_block: float = 0.0

    def prefill_time(self, tokens: int, context_before: int = 0) -> float:
        return self.prefill_s_per_token * tokens

    def decode_time(self, context: int, seqs: int = 1) -> float:
        return self.decode_step_s + self.decode_s_per_token * context * seqs

    def transfer_time(self, blocks: int) -> float:
        return self.transfer_s_per_block * blocks


@dataclass(frozen=True)
class EngineData:
    """An ``EngineView``."""

    now: float = 0.0
    block_size: int = 16
    total_blocks: int = 64
    free_blocks: int = 64
    pinned_blocks: int = 0
    cpu_total_blocks: int = 0
    cpu_free_blocks: int = 0
    max_num_seqs: int = 8
    running: Sequence[CallData] = ()
    waiting: Sequence[CallData] = ()
    pins: Sequence[PinData] = ()
    active_sessions: int = 0
    active_tools: int = 0
    queued_tools: int = 0
    tool_cores: int = 4
    tool_ema_s: Mapping[str, float] = field(default_factory=dict)
    costs: LinearCosts = LinearCosts()
    has_costs: bool = True
    decode_steps: int = 0
    decode_time_s: float = 0.0

    @property
    def running_growth_blocks(self) -> int:
        return sum(growth_blocks(call, self.blocks_for) for call in self.running)

    def running_growth_up_to(self, blocks: int) -> int:
        return min(self.running_growth_blocks, blocks)

    def pin_of(self, session_id: str) -> PinData | None:
        return next((pin for pin in self.pins if pin.session_id == session_id), None)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


def kv_stats(free_blocks: int, total_blocks: int = 64, **fields: Any) -> KVStats:
    """The engine's KV figures as a ``kv_stats`` event brings them to the gateway:
    ``free_blocks`` free of ``total_blocks``, the rest used."""
    return KVStats(
        total_blocks=total_blocks,
        free_blocks=free_blocks,
        used_blocks=total_blocks - free_blocks,
        **fields,
    )


@dataclass(frozen=True)
class AdmissionData:
    """An ``AdmissionView``: what the gateway knows (``kv``: the newest ``kv_stats``
    figures, None until any arrived)."""

    now: float = 0.0
    block_size: int = 16
    kv: KVStats | None = None
    active_sessions: int = 0
    active_tools: int = 0
    queued_tools: int = 0
    tool_cores: int = 4
    tool_ema_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def replicas(self) -> list[Replica]:
        """One engine, whose figures are ``kv``."""
        return [Replica(0, self.kv, self.active_sessions)]

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)
