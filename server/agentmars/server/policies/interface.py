"""The engine-neutral policy interface: the points where a vLLM-like engine decides,
and what it lets the policy see when it does.

Two engines drive the same policies (DESIGN.md "One policy, two engines"): the
simulated engine (``agentmars.server.sim``) and the vLLM scheduler plugin. Each hands
its own objects to the policy through the read-only views below, so a policy never
imports either engine.

The decision points, in the order a call meets them:

- ``admit``: which waiting *sessions* enter the engine now (the external control plane,
  seed 000 Algorithm 1). A session that is not admitted keeps its calls at the gateway.
- ``priority``: the order of the engine's waiting calls (lower first), recomputed at
  every step, so it may depend on time (aging) and on the policy's state.
- ``chunk``: how many prompt tokens of a call to compute in this step, given what the
  token budget allows and what the free KV blocks fit (vLLM's
  ``_reserve_prefill_lookahead``).
- ``victim``: which running call to preempt when a running call cannot grow.
- ``on_call_finished``: what happens to a finished call's KV while its session runs a
  tool: release it to the prefix cache, pin it (optionally for a time), or offload it
  to the CPU tier.
- ``reclaim``: which pins to drop, in order, when KV is short, before any preemption.
- ``tick``: a periodic hook (``tick_interval_s``) for policies that act on their own
  clock (pause / resume sessions, move pins between tiers).
- ``on_event``: every event of the unified information stream (``agentmars.sdk.events``)
  the engine and the tools produce, so the policy can keep its own statistics.

The defaults of ``Policy`` are stock vLLM V1 (FCFS): admit everything, serve calls in
arrival order, admit a new call only when its whole prompt fits, preempt the newest
running call, release KV when a call finishes, never pin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from agentmars.sdk.events import Event

SortKey = tuple[Any, ...]


class CallView(Protocol):
    """One LLM call as the engine sees it. Token counts include the tokens generated so
    far (``num_tokens = prompt_tokens + output_tokens``)."""

    @property
    def call_id(self) -> str: ...
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
    """The engine's own time estimates (the simulator's cost model; a profile for vLLM)."""

    def prefill_time(self, tokens: int, context_before: int = 0) -> float: ...
    def decode_time(self, context: int, seqs: int = 1) -> float: ...
    def transfer_time(self, blocks: int) -> float: ...


class EngineView(Protocol):
    """The engine's state at a decision, read-only."""

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
        """Capacity of the CPU KV tier (0: none)."""

    @property
    def cpu_free_blocks(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def running(self) -> Sequence[CallView]: ...
    @property
    def waiting(self) -> Sequence[CallView]: ...
    @property
    def pins(self) -> Sequence[PinView]: ...
    def pin_of(self, session_id: str) -> PinView | None:
        """The session's pin, if it has one."""
        ...

    @property
    def active_sessions(self) -> int:
        """Admitted sessions that have not ended (in the engine, at a tool, or between)."""

    @property
    def active_tools(self) -> int: ...
    @property
    def queued_tools(self) -> int: ...
    @property
    def tool_cores(self) -> int: ...
    @property
    def tool_ema_s(self) -> Mapping[str, float]:
        """Exponential moving average of each tool kind's duration."""

    @property
    def costs(self) -> CostEstimator: ...

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that ``tokens`` tokens of context occupy."""
        ...


@dataclass(frozen=True, slots=True)
class Release:
    """Return the call's KV to the prefix cache (reusable until reallocated)."""


@dataclass(frozen=True, slots=True)
class Pin:
    """Keep the call's full blocks resident for its session's next call; ``ttl_s``:
    release after that long (None: until the next call, the session's end, or a
    ``reclaim``)."""

    ttl_s: float | None = None


@dataclass(frozen=True, slots=True)
class Offload:
    """Copy the call's full blocks to the CPU tier and release them on the GPU."""


KVDecision = Release | Pin | Offload


@dataclass(frozen=True, slots=True)
class SessionAction:
    """What ``tick`` may do to a session: ``unpin`` its KV, ``offload`` its pin to the
    CPU tier, ``pause`` it (its calls wait at the gateway, its pin is dropped) or
    ``resume`` a paused one."""

    kind: Literal["unpin", "offload", "pause", "resume"]
    session_id: str


class Policy:
    """A scheduling policy. Subclasses override the decisions they change; the defaults
    are stock vLLM V1's (see the module docstring). A policy object serves one run."""

    name: ClassVar[str] = ""
    """The registry name (``--policy NAME``)."""
    variant: ClassVar[str] = ""
    """Which published rule or code this implements (notes/baselines.md)."""
    tick_interval_s: float | None = None
    """Call ``tick`` this often (None: never; 0: at every engine step)."""
    preempt_by_swap: bool = False
    """Preempted calls' KV goes to the CPU tier (else it is recomputed)."""
    needs_cpu_tier: bool = False
    """The policy relies on a CPU KV tier; engines refuse to run it without one."""
    offload_evicted: bool = False
    """Blocks the GPU prefix cache evicts are kept in the CPU tier (LRU), as vLLM's
    offloading connector does; else the tier only holds what the policy sends there."""
    reserve_full_prompt: bool = True
    """Admit a waiting call only if blocks for its whole remaining prompt are free now
    (vLLM 0.32's ``scheduler_reserve_full_isl``); else ``chunk`` decides alone."""
    priority_reads_pins_only: ClassVar[bool] = False
    """``priority`` reads only the call and which sessions hold pins (nothing else that
    changes while a call waits), so an engine may keep the waiting order until the
    queue or the pins change (the vLLM plugin does: sorting at every step is a tenth
    of ``schedule()``); else it asks again at every step."""

    def on_event(self, event: Event) -> None:
        """Every event of the information stream, in time order."""

    def admit(self, queue: Sequence[SessionView], view: EngineView) -> Sequence[SessionView]:
        """Sessions to admit now, in order (a prefix of a reordering of ``queue``)."""
        return queue

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        """Sort key of a waiting call: lower runs first; ties go to the earlier call."""
        return (call.arrival_s,)

    def chunk(self, call: CallView, tokens: int, fit_tokens: int, view: EngineView) -> int:
        """Prompt tokens of ``call`` to compute in this step. ``tokens``: what the token
        budget allows; ``fit_tokens``: what the free KV blocks can hold now. Returning
        more than ``fit_tokens`` lets the engine reclaim pins or preempt to make room;
        returning 0 skips the call in this step."""
        return tokens

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        """The running call to preempt (``running`` in the engine's order)."""
        return running[-1]

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        """What to do with a finished call's KV (a call that ends its session is always
        released)."""
        return Release()

    def reclaim(
        self, pins: Sequence[PinView], needed_blocks: int, view: EngineView
    ) -> Sequence[PinView]:
        """Pins to drop, in order, until ``needed_blocks`` are free; dropping every pin
        comes before any preemption."""
        return sorted(pins, key=lambda pin: pin.pinned_s)

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        """Periodic actions (see ``tick_interval_s``)."""
        return ()

    def settings(self) -> dict[str, Any]:
        """The policy's parameters, for the results file."""
        return {}
