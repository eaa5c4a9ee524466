"""What each half of a policy may look at: read-only views, split by what a process can
really know (docs/policies.md "What each half sees").

- The **engine half** runs inside the engine (the vLLM plugin, the simulator, the
  wall-clock twin): it sees the engine's queues and KV (``EngineView``), the tool
  figures the stream brings in (``ToolFigures``), and a cost estimator when the engine
  has one (``Capability.COSTS``).
- The **admission half** runs in the gateway: it sees the sessions waiting there
  (``SessionView``), the tool figures of the stream, and the engine's KV figures as
  the side channel delivers them (``AdmissionView.kv``: the newest ``kv_stats`` event,
  sampled, with its delay), never the engine's queues.

Which engine provides what is in ``capabilities``; an engine refuses at start a policy
that needs something it does not provide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from agentmars.sdk.events import KVStats


class CallView(Protocol):
    """One LLM call as the engine sees it. Token counts include the tokens generated so
    far (``num_tokens = prompt_tokens + output_tokens``)."""

    @property
    def call_id(self) -> str:
        """The id the SDK, the gateway and the engine share (``vllm_xargs.call_id``)."""

    @property
    def session_id(self) -> str: ...
    @property
    def turn(self) -> int: ...
    @property
    def arrival_s(self) -> float:
        """When the call reached the engine."""

    @property
    def session_arrival_s(self) -> float:
        """When its session arrived (the program's arrival)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int:
        """Tokens generated so far."""

    @property
    def max_tokens(self) -> int:
        """The most tokens the call may generate."""

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache for this call (prompt and output)."""

    @property
    def num_tokens(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def service_s(self) -> float:
        """Engine time this call has been part of (the steps it was scheduled in)."""

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the prefix cache held for the call when the engine first
        admitted it (None: not admitted yet)."""

    @property
    def follows_tool(self) -> bool: ...
    @property
    def expects_tool(self) -> bool:
        """The client's hint that the answer will be a tool call (not the last step)."""

    @property
    def next_tool(self) -> str | None:
        """The kind of tool the answer will call, when the client says so."""

    @property
    def expected_tool_s(self) -> float | None:
        """How long that tool will take, when known: the client's hint to the gateway;
        in the simulator, the workload's true duration (an oracle, as InferCept's
        released code uses)."""

    @property
    def agent(self) -> str: ...
    @property
    def task_id(self) -> str:
        """The agent instance the call serves (seed 004): the task a fan-out agent's
        branch sessions share, else the session itself."""


class SessionView(Protocol):
    """A session waiting for admission (its next call is held at the gateway)."""

    @property
    def session_id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int:
        """The prompt of the call it would send now (projected prefill)."""

    @property
    def task_id(self) -> str:
        """The agent instance it belongs to (``CallView.task_id``)."""

    @property
    def prompt_text(self) -> str:
        """The text of that call's prompt as the gateway read it, at most
        ``gateway.llm_apis.MAX_PROMPT_TEXT`` characters ("" when unknown): a session's
        first call carries the agent's input (seed 004 §4.2)."""


class PinView(Protocol):
    """KV blocks held for a session between its calls."""

    @property
    def session_id(self) -> str: ...
    @property
    def blocks(self) -> int: ...
    @property
    def tokens(self) -> int:
        """Context tokens the pinned blocks cover."""

    @property
    def pinned_s(self) -> float:
        """When the pin was made."""

    @property
    def expires_s(self) -> float | None: ...
    @property
    def session_arrival_s(self) -> float: ...


class CostEstimator(Protocol):
    """Time estimates of the engine's work: the simulator's cost model, or a named or
    calibrated profile given to the vLLM plugin (``Capability.COSTS``)."""

    def prefill_time(self, tokens: int, context_before: int = 0) -> float: ...
    def decode_time(self, context: int, seqs: int = 1) -> float: ...
    def transfer_time(self, blocks: int) -> float: ...


class ToolFigures(Protocol):
    """The CPU side as the event stream shows it, on either side of the engine
    (``Capability.TOOL_FIGURES``)."""

    @property
    def active_tools(self) -> int: ...
    @property
    def queued_tools(self) -> int: ...
    @property
    def tool_cores(self) -> int:
        """Cores the tools run on (0: unknown)."""

    @property
    def tool_ema_s(self) -> Mapping[str, float]:
        """Exponential moving average of each tool kind's duration
        (``agentmars.sdk.tool_stats``)."""


class EngineView(ToolFigures, Protocol):
    """The engine's state at a decision of the engine half, read-only."""

    @property
    def now(self) -> float: ...
    @property
    def block_size(self) -> int: ...
    @property
    def total_blocks(self) -> int: ...
    @property
    def free_blocks(self) -> int:
        """Blocks that can be allocated now (free, or cached and unreferenced)."""

    @property
    def pinned_blocks(self) -> int: ...
    @property
    def cpu_total_blocks(self) -> int:
        """Capacity of the CPU KV tier (0: none; ``Capability.CPU_TIER``)."""

    @property
    def cpu_free_blocks(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def running(self) -> Sequence[CallView]: ...
    @property
    def running_growth_blocks(self) -> int:
        """KV blocks the running calls will still take from the free ones to reach
        their prompt and ``max_tokens`` (none preempted, none stopping early), beyond
        the blocks they hold now: ``growth_blocks`` between steps; within a step
        also less what the calls scheduled so far were given."""

    def running_growth_up_to(self, blocks: int) -> int:
        """``min(running_growth_blocks, blocks)`` for ``blocks >= 0``, counted only
        that far (a policy comparing the growth with the free blocks needs no more)."""

    @property
    def waiting(self) -> Sequence[CallView]: ...
    @property
    def decode_steps(self) -> int:
        """Engine steps that decoded at least one sequence, since the engine started."""

    @property
    def decode_time_s(self) -> float:
        """The summed durations of those steps (with an SM partition, the decode
        partition's): over an interval, its growth over ``decode_steps``' is seed 002's
        step-level TPOT."""

    @property
    def pins(self) -> Sequence[PinView]: ...
    def pin_of(self, session_id: str) -> PinView | None:
        """The session's pin, if it has one."""
        ...

    @property
    def has_costs(self) -> bool:
        """Whether ``costs`` may be asked (a half that only ``uses`` COSTS checks)."""

    @property
    def costs(self) -> CostEstimator:
        """Only for a policy that needs ``Capability.COSTS`` (an engine without a cost
        model refuses such a policy at start) or uses it and sees ``has_costs``."""

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that ``tokens`` tokens of context occupy."""
        ...


def tool_mean_s(figures: ToolFigures, tool: str | None) -> float | None:
    """A tool's mean duration by the stream's per-kind EMA, or every kind's mean when
    its own is not known (None: no tool has ended)."""
    means = figures.tool_ema_s
    mean = means.get(tool) if tool is not None else None
    if mean is None and means:
        mean = sum(means.values()) / len(means)
    return mean


def growth_blocks(call: CallView, blocks_for: Callable[[int], int]) -> int:
    """KV blocks a running call will still allocate to reach its prompt and
    ``max_tokens``, beyond the ones its computed tokens hold: what it holds between
    steps (both engines allocate a prompt chunk by chunk, and a token's slot in the
    step that schedules it)."""
    whole = blocks_for(call.prompt_tokens + call.max_tokens)
    return max(whole - blocks_for(call.num_computed_tokens), 0)


class ReplicaView(Protocol):
    """One engine replica as the gateway knows it (seed 003 §4.1: the gateway places
    sessions on replicas)."""

    @property
    def index(self) -> int: ...

    @property
    def kv(self) -> KVStats | None:
        """Its newest KV figures (None until any arrived)."""

    @property
    def sessions(self) -> int:
        """Admitted sessions placed on it that have not ended."""


class AdmissionView(ToolFigures, Protocol):
    """What the gateway knows at a decision of the admission half, read-only."""

    @property
    def now(self) -> float: ...
    @property
    def block_size(self) -> int: ...
    @property
    def kv(self) -> KVStats | None:
        """The engine's newest KV figures as the side channel delivered them (None
        until any arrived; ``Capability.KV_FIGURES``)."""

    @property
    def active_sessions(self) -> int:
        """Admitted sessions that have not ended (in the engine, at a tool, or between)."""

    @property
    def replicas(self) -> Sequence[ReplicaView]:
        """The engine replicas behind the gateway, by index (one for a single engine,
        whose ``kv`` is then the view's)."""

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that ``tokens`` tokens of context occupy."""
        ...
