"""The Opportunistic Co-Scheduler of MARS's engine half (seed 000 §4.3): the
coordinator's order made real on the step's token budget and the free KV blocks.

- **Chunk shrinking.** A selected call whose prompt chunk does not fit the free blocks
  computes what fits, in whole blocks, down to one block, before anything is evicted;
  only when not even one block is free does it ask for one, which makes the engine
  reclaim pins and only then preempt (the engines' order: pins before victims).
- **Pins across tool calls.** When a call ends in a tool call, its session's KV stays
  pinned while the warm resume's benefit, the prefill it saves, outweighs the cost of
  holding its blocks: pressure x (blocks / pool) x the tool's expected remaining time,
  in GPU-seconds (the share of the KV kept from other work, for as long as it is
  kept). Pressure is 0 while no call waits or the used share is below
  ``pressure_low``, 1 from ``pressure_high``. The decision is re-made every
  ``pin_review_interval_s`` while the tool runs, from the tool-duration EMA of the
  stream: a tool past half its mean is expected to run as long again as it has
  (NOTE: ours — tool durations are heavy-tailed, seed 003's p99 is 18x its p50).
  Pins carry no TTL: the review drops them.

The prefill time comes from the engine's cost model when it has one
(``Capability.COSTS``), else from the stream (``kv_value.PrefillEstimate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentmars.sdk.events import AnyEvent, SessionEnd, ToolEnd
from agentmars.server.policies.interface import (
    KVDecision,
    Offload,
    Pin,
    Release,
    SessionAction,
)
from agentmars.server.policies.mars.kv_tier import Place, prices
from agentmars.server.policies.mars.kv_value import PrefillEstimate
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.views import (
    CallView,
    EngineView,
    PinView,
    growth_blocks,
    tool_mean_s,
)


def shrink_chunk(tokens: int, fit_tokens: int, block_size: int, *, running: bool) -> int:
    """The chunk to compute: all of it if it fits, else the whole blocks that fit;
    else, for a running call, one block (which makes the engine reclaim pins, then
    preempt), and for a waiting one nothing yet (it evicts nothing to start)."""
    if tokens <= fit_tokens:
        return tokens
    whole = fit_tokens - fit_tokens % block_size
    if whole >= block_size:
        return whole
    return min(tokens, block_size) if running else 0


def expected_remaining_s(mean_s: float | None, elapsed_s: float) -> float:
    """How much longer a tool runs: its mean less what has passed, or, past half its
    mean, as long again as it has run (heavy tails)."""
    if mean_s is None:
        return elapsed_s
    return max(mean_s - elapsed_s, elapsed_s)


def kv_pressure(view: EngineView, settings: MarsSettings) -> float:
    """The price of holding a block now, 0..1."""
    if not view.waiting or not view.total_blocks:
        return 0.0
    used = 1 - view.free_blocks / view.total_blocks
    span = settings.pressure_high - settings.pressure_low
    return min(max((used - settings.pressure_low) / span, 0.0), 1.0)


@dataclass(slots=True)
class Parked:
    """A session between a call that ended in a tool call and its next call."""

    tool: str | None
    """The tool its call said it would run."""
    since_s: float
    """When the call ended (the tool's start, as the engine sees it)."""
    blocks: int
    place: Place
    """Where its KV is (``Place.DROP``: nowhere; such sessions are not kept)."""
    tool_done: bool = False
    """The stream saw its tool end: its next call is due."""


class OpportunisticCoScheduler:
    def __init__(
        self, settings: MarsSettings, *, tier: bool = False, prefetch: bool = False
    ) -> None:
        self.settings = settings
        self.tier = tier
        """Offload to the engine's CPU tier where that wastes least (``kv_tier``)."""
        self.prefetch = prefetch
        """Loads back ahead of need hide the load (``MarsScheduler.load_ahead``)."""
        self.prefill = PrefillEstimate(settings)
        self.parked: dict[str, Parked] = {}
        """The sessions whose KV is kept (pinned or in the CPU tier) for their next call."""
        self._partial: CallView | None = None
        """The call started on less than its whole prompt, until it is seen out of it."""
        self._partial_preemptions = 0
        """Its preemptions when it started."""

    def on_event(self, event: AnyEvent) -> None:
        self.prefill.observe(event)
        if isinstance(event, SessionEnd):
            self.parked.pop(event.session_id, None)
        elif isinstance(event, ToolEnd):
            parked = self.parked.get(event.session_id)
            if parked is not None:
                parked.tool_done = True

    def chunk(self, call: CallView, tokens: int, fit_tokens: int, view: EngineView) -> int:
        partial = self._partial
        opportunistic = partial is not None and partial.call_id == call.call_id
        if tokens <= fit_tokens and not opportunistic:
            return tokens  # the common case, at every prefill step: nothing to read
        # A call has computed tokens only once it runs (both engines reset them when
        # they preempt): cheaper than looking for it among the running calls.
        running = call.num_computed_tokens > 0
        if opportunistic:
            own = growth_blocks(call, view.blocks_for) if running else 0
            # Growth past the blocks that fit leaves none either way: counted that far.
            fit_blocks = max(fit_tokens, 0) // view.block_size
            others = view.running_growth_up_to(own + fit_blocks + 1) - own
            fit_tokens -= others * view.block_size
        if tokens <= fit_tokens:
            return tokens
        # A call started on less than its prompt goes on only on free blocks: it
        # evicts nothing while another call runs (NOTE: ours, as the start rule).
        evicts = running and (not opportunistic or len(view.running) == 1)
        chunk = shrink_chunk(tokens, max(fit_tokens, 0), view.block_size, running=evicts)
        if opportunistic and not running and chunk == 0:
            self._partial = None  # it did not start
        return chunk

    def may_start_partial(self, call: CallView, view: EngineView) -> bool:
        """Only the selected call, the first that does not fit whole, only on blocks
        the running calls will not need to finish (their prompts and ``max_tokens``),
        and only while no other call started that way is still in its prompt. NOTE:
        ours — measured on ILR-2 at 0.3/s without admission control: letting every
        waiting call start on what fits (vLLM with --no-scheduler-reserve-full-isl)
        preempted a hundred times as often as FCFS and tripled its mean latency, and
        one start at a time on any free block still preempted in a loop."""
        free = view.free_blocks
        if free < 1:
            return False
        partial = self._partial
        if partial is not None and partial.call_id != call.call_id and self.in_prompt(partial):
            return False
        if view.running_growth_up_to(free) >= free:
            return False
        self._partial = call
        self._partial_preemptions = call.num_preemptions
        return True

    def in_prompt(self, partial: CallView) -> bool:
        """Whether the partial start is running and still in its prompt, read from the
        call alone (looking for it among the running calls at every step cost more
        than the rest of MARS's step): it has computed tokens only once it runs, and
        both engines count a preemption. One scheduled in this very step has none
        yet: it keeps its mark, and its growth keeps another call from starting on
        the same blocks. One that left the engine otherwise (aborted) looks in its
        prompt until ``forget_gone_partial``."""
        return (
            partial.num_preemptions == self._partial_preemptions
            and 0 < partial.num_computed_tokens < partial.prompt_tokens
        )

    def forget_gone_partial(self, view: EngineView) -> None:
        """Forget the partial start if it is not running (``in_prompt``)."""
        partial = self._partial
        if partial is not None and all(c.call_id != partial.call_id for c in view.running):
            self._partial = None

    def recompute_s(self, tokens: int, view: EngineView) -> float | None:
        """What a cold resume of ``tokens`` of context costs the GPU (None: unknown)."""
        if view.has_costs:
            return view.costs.prefill_time(tokens)
        rate = self.prefill.seconds_per_token()
        return None if rate is None else rate * tokens

    def place(
        self,
        tokens: int,
        blocks: int,
        tool: str | None,
        elapsed_s: float,
        view: EngineView,
        pressure: float,
    ) -> Place:
        """Where the KV of a session ``elapsed_s`` into its ``tool`` waits best now."""
        remaining = self.remaining_s(tool, elapsed_s, view)
        cost = prices(
            blocks * view.block_size,
            remaining,
            pressure,
            view,
            lambda: self.recompute_s(tokens, view),
            tier=self.tier,
            prefetch=self.prefetch,
        )
        return cost.cheapest()

    def remaining_s(self, tool: str | None, elapsed_s: float, view: EngineView) -> float:
        return expected_remaining_s(tool_mean_s(view, tool), elapsed_s)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        if not call.expects_tool:
            return Release()
        blocks = view.blocks_for(call.num_tokens)
        pressure = kv_pressure(view, self.settings)
        place = self.place(call.num_tokens, blocks, call.next_tool, 0.0, view, pressure)
        if place is Place.DROP:
            return Release()
        self.parked[call.session_id] = Parked(call.next_tool, view.now, blocks, place)
        return Pin() if place is Place.GPU else Offload()

    def review(self, pins: Sequence[PinView], view: EngineView) -> list[SessionAction]:
        """Offload or unpin the sessions whose pin no longer pays, as pressure and time
        stand."""
        actions: list[SessionAction] = []
        if not pins:
            return actions
        pressure = kv_pressure(view, self.settings)  # once: it reads the waiting queue
        for pin in pins:
            parked = self.parked.get(pin.session_id)
            if parked is not None and parked.tool_done:
                continue  # its next call is due: nothing to wait out
            since = parked.since_s if parked is not None else pin.pinned_s
            tool = parked.tool if parked is not None else None
            place = self.place(pin.tokens, pin.blocks, tool, view.now - since, view, pressure)
            if place is Place.CPU:
                actions.append(self.offload(pin))
            elif place is Place.DROP:
                actions.append(SessionAction("unpin", pin.session_id))
                self.parked.pop(pin.session_id, None)
        return actions

    def offload(self, pin: PinView) -> SessionAction:
        """Send the session's pin to the CPU tier, noting it for a load ahead."""
        parked = self.parked.get(pin.session_id)
        if parked is None:
            parked = Parked(None, pin.pinned_s, pin.blocks, Place.CPU)
            self.parked[pin.session_id] = parked
        parked.place, parked.blocks = Place.CPU, pin.blocks
        return SessionAction("offload", pin.session_id)
