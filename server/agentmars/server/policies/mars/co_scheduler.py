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

from agentmars.sdk.events import AnyEvent, SessionEnd
from agentmars.server.policies.interface import KVDecision, Pin, Release, SessionAction
from agentmars.server.policies.mars.kv_value import PrefillEstimate, keeping_pays
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.views import CallView, EngineView, PinView, growth_blocks


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


class OpportunisticCoScheduler:
    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self.prefill = PrefillEstimate(settings)
        self._tool_of: dict[str, str | None] = {}
        """The tool each pinned session's call said it would run."""
        self._partial: CallView | None = None
        """The call started on less than its whole prompt, until it is seen out of it."""
        self._partial_preemptions = 0
        """Its preemptions when it started."""

    def on_event(self, event: AnyEvent) -> None:
        self.prefill.observe(event)
        if isinstance(event, SessionEnd):
            self._tool_of.pop(event.session_id, None)

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

    def worth_pinning(
        self,
        tokens: int,
        blocks: int,
        tool: str | None,
        elapsed_s: float,
        view: EngineView,
        pressure: float,
    ) -> bool:
        share = blocks / view.total_blocks if view.total_blocks else 1.0
        holding_s = self.remaining_s(tool, elapsed_s, view)
        return keeping_pays(lambda: self.recompute_s(tokens, view), share, holding_s, pressure)

    def remaining_s(self, tool: str | None, elapsed_s: float, view: EngineView) -> float:
        emas = view.tool_ema_s
        mean = emas.get(tool) if tool is not None else None
        if mean is None and emas:
            mean = sum(emas.values()) / len(emas)
        return expected_remaining_s(mean, elapsed_s)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        if not call.expects_tool:
            return Release()
        blocks = view.blocks_for(call.num_tokens)
        pressure = kv_pressure(view, self.settings)
        if not self.worth_pinning(call.num_tokens, blocks, call.next_tool, 0.0, view, pressure):
            return Release()
        self._tool_of[call.session_id] = call.next_tool
        return Pin()

    def review(self, pins: Sequence[PinView], view: EngineView) -> list[SessionAction]:
        """Unpin the sessions whose pin no longer pays, as pressure and time stand."""
        actions: list[SessionAction] = []
        if not pins:
            return actions
        pressure = kv_pressure(view, self.settings)  # once: it reads the waiting queue
        for pin in pins:
            tool = self._tool_of.get(pin.session_id)
            elapsed = view.now - pin.pinned_s
            if not self.worth_pinning(pin.tokens, pin.blocks, tool, elapsed, view, pressure):
                actions.append(SessionAction("unpin", pin.session_id))
                self._tool_of.pop(pin.session_id, None)
        return actions
