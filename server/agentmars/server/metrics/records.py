"""What a run leaves behind, the same from every engine (the simulator, a replay on the
real stack, the gateway): one record per session with its LLM calls and tool calls,
plus engine-wide KV and CPU counters. The metrics (``metrics.summary``) are computed
from these records only, so a simulated and a measured run are compared by the same
code.

Times are seconds since the start of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CallRecord:
    """One LLM call (a turn's generation)."""

    turn: int
    submit_s: float
    """When the call reached the engine (after admission)."""
    first_token_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache when the call was first scheduled."""
    recomputed_tokens: int = 0
    """Tokens computed again after a preemption (by recompute) of this call."""
    preemptions: int = 0
    load_s: float = 0.0
    """Time its KV spent loading from the CPU tier to the GPU (on a simulated engine)."""
    load_hidden_s: float = 0.0
    """Of that, the part done before the call arrived (a load ahead of need)."""

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.submit_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None for one-token answers)."""
        if self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class ToolRecord:
    """One tool call on the host."""

    turn: int
    kind: str
    enqueue_s: float
    start_s: float
    end_s: float

    @property
    def queue_s(self) -> float:
        return self.start_s - self.enqueue_s


@dataclass(slots=True)
class SessionRecord:
    """One session from arrival to the last token of its last turn."""

    session_id: str
    agent: str
    arrival_s: float
    admitted_s: float
    end_s: float
    calls: list[CallRecord] = field(default_factory=list)
    tools: list[ToolRecord] = field(default_factory=list)
    task_id: str | None = None
    """The agent instance the session belongs to (seed 004: the branch sessions of one
    task-parallel agent share it; None: the session is its own instance)."""
    moves: int = 0
    """Times it moved to another engine replica (``session_move``: seed 003's churn)."""

    @property
    def latency_s(self) -> float:
        """End-to-end latency: arrival to the last token of the last turn."""
        return self.end_s - self.arrival_s

    @property
    def instance(self) -> str:
        """The agent instance's id: ``task_id``, else the session's own."""
        return self.task_id or self.session_id


@dataclass(slots=True)
class KVSample:
    """The KV cache at one instant (in blocks)."""

    time_s: float
    free: int
    used: int
    pinned: int
    cpu_used: int = 0


@dataclass(slots=True)
class RunRecord:
    """Everything one run of one policy on one workload produced."""

    workload: str
    policy: str
    engine: str
    """``sim:<profile>`` or the real engine's name."""
    seed: int | None
    sessions: list[SessionRecord]
    """The sessions that finished."""
    duration_s: float
    """From the start of the run to the end of its last session."""
    total_blocks: int
    block_size: int
    tool_cores: int
    evictions: list[tuple[float, int]] | None = field(default_factory=list)
    """(time, blocks): cached KV blocks removed from the GPU (reallocated to other
    content, or dropped); seed 000 Fig. 3's "KV block removals". None: not measured
    (a real engine's run, whose engine does not report them per block)."""
    kv_samples: list[KVSample] = field(default_factory=list)
    preemptions: int = 0
    prefix_queries: int = 0
    """Prompt tokens looked up in the prefix cache."""
    prefix_hits: int = 0
    """Of those, tokens found."""
    pinned_block_s: float = 0.0
    """Sum over time of blocks held by pins (block-seconds)."""
    tool_busy_core_s: float | None = 0.0
    """CPU time the tools used (core-seconds); None: not measured (no tool reported
    its CPU time)."""
    steps: int = 0
    """Engine steps (iterations of continuous batching)."""
    computed_tokens: int = 0
    """Tokens whose KV the engine computed, recomputation included (not the ones
    found in a cache or loaded from the CPU tier)."""
    decode_steps: int = 0
    """Steps that decoded at least one sequence (the simulator's; 0: not measured)."""
    decode_time_s: float = 0.0
    """Their summed durations (with an SM partition, the decode side's):
    ``decode_time_s / decode_steps`` is the run's step-level TPOT (seed 002 §III-B)."""
    unfinished: list[str] = field(default_factory=list)
    """Ids of the sessions that arrived but had not finished when the run stopped (a
    time limit); the summary counts them, and they fail session-level SLO attainment."""
