"""InferCept (Abhyankar et al., 2024; WukLab/InferCept): keep, swap or discard the KV
of a call paused for a tool by the memory it would waste (notes/baselines.md
"InferCept"; equations as restated in seed 001, Appendix A.3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentmars.sdk.events import AnyEvent, SessionEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import (
    EngineHalf,
    KVDecision,
    Pin,
    Policy,
    Release,
    SessionAction,
    SortKey,
)
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView, PinView, tool_mean_s


@dataclass(frozen=True, slots=True)
class Waste:
    """Memory x time each handling wastes, in token-seconds (InferCept Eq. 1-3 without
    the common factor M, the bytes per token)."""

    preserve: float
    discard: float
    swap: float


def waste(context: int, remaining_tool_s: float, other_context: int, view: EngineView) -> Waste:
    """WastePreserve = T_INT * C_i; WasteDiscard = T_fwd(C_i) * (C_i + C_other);
    WasteSwap = 2 * T_swap(C_i) * C_batch, with C_batch = C_i + C_other."""
    forward = view.costs.prefill_time(context)
    swap = view.costs.transfer_time(view.blocks_for(context))
    return Waste(
        preserve=remaining_tool_s * context,
        discard=forward * (context + other_context),
        swap=2 * swap * (context + other_context),
    )


@register
class InferCept(Policy):
    """InferCept: per paused call, preserve, swap or discard, whichever wastes least.

    At every engine step (its "iteration"), the intercepted sessions (their tool still
    runs) whose KV is still on the GPU are sorted by min(WasteDiscard, WastePreserve),
    highest first, and swapped out in that order within the step's swap budget (the
    blocks the CPU link moves in one step's time, so the copy overlaps the step and
    never stalls it, and no more than the CPU tier has room for). A pin larger than
    what is left of the budget is swapped in part, from its back (as the released
    code's ``swap_out_from_back``), and the rest follows at the next steps; a pin whose
    swap has begun goes first (the released code swaps one victim to the end before
    the next) and is not discarded meanwhile (ours: that would throw away the part
    already copied, which the released code may do). Of the rest, those with
    WasteDiscard < WastePreserve are discarded, the others kept. T_INT is the tool's
    remaining time from the oracle duration, as the released code uses. Queues are FCFS
    by the request's (session's) original arrival. A finished call is kept at first and
    judged at the next step."""

    name = "infercept"
    variant = "WukLab/InferCept released code: waste equations with oracle tool durations"

    def engine(self) -> InferCeptEngine:
        return InferCeptEngine()


@register
class InferCeptPredicted(InferCept):
    """InferCept knowing what MARS knows: the tool's duration predicted from the
    stream (the mean of the tools of its kind so far, ``EngineView.tool_ema_s``), not
    read from the client's oracle. Everything else as ``infercept``."""

    name = "infercept-predicted"
    variant = "WukLab/InferCept's waste equations with predicted tool durations (ours)"

    def engine(self) -> InferCeptEngine:
        return PredictedInferCeptEngine()


class InferCeptEngine(EngineHalf):
    """InferCept inside the engine (``InferCept``'s docstring); the tool durations
    are the client's ``expected_tool_s`` (the simulator's oracle)."""

    needs = frozenset({Capability.COSTS, Capability.TICK})
    # NOTE: ours — without a CPU tier the swap budget is 0 (``cpu_free_blocks``), so a
    # paused call is only preserved or discarded, by the same waste equations (the
    # vLLM CPU backend, whose KV already lives in host memory, has no tier to swap to).
    uses = frozenset({Capability.CPU_TIER})
    tick_interval_s = 0.0

    def __init__(self) -> None:
        self._tool_ends: dict[str, float] = {}
        self._swapping: set[str] = set()
        """Sessions whose pin is partly swapped out: the rest follows first."""

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, SessionEnd):
            self._tool_ends.pop(event.session_id, None)
            self._swapping.discard(event.session_id)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return (call.session_arrival_s,)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        self._swapping.discard(call.session_id)
        tool_s = self.tool_s(call, view)
        if tool_s is None:
            return Release()
        self._tool_ends[call.session_id] = view.now + tool_s
        return Pin()

    def tool_s(self, call: CallView, view: EngineView) -> float | None:
        """How long the call's tool runs (None: it calls none)."""
        return call.expected_tool_s

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        # Only calls whose tool still runs are intercepted; a pin whose tool is done
        # waits for its next call, which takes it over when admitted.
        pins = [pin for pin in view.pins if self._remaining_tool_s(pin, view) > 0]
        if not pins:
            return ()
        batch = sum(call.num_tokens for call in view.running)
        wastes = {pin.session_id: self._waste(pin, batch, view) for pin in pins}

        def order(pin: PinView) -> tuple[bool, float]:
            cost = wastes[pin.session_id]
            return (pin.session_id not in self._swapping, -min(cost.discard, cost.preserve))

        budget = min(self._swap_budget_blocks(batch, len(view.running), view), view.cpu_free_blocks)
        actions = []
        for pin in sorted(pins, key=order):
            cost = wastes[pin.session_id]
            if budget > 0:
                swapped = min(budget, pin.blocks)
                budget -= swapped
                actions.append(SessionAction("offload", pin.session_id, blocks=swapped))
                self._mark_swapping(pin, swapped)
            elif pin.session_id not in self._swapping and cost.discard < cost.preserve:
                actions.append(SessionAction("unpin", pin.session_id))
        return actions

    def _mark_swapping(self, pin: PinView, swapped: int) -> None:
        if swapped < pin.blocks:
            self._swapping.add(pin.session_id)
        else:
            self._swapping.discard(pin.session_id)

    def _remaining_tool_s(self, pin: PinView, view: EngineView) -> float:
        return self._tool_ends.get(pin.session_id, view.now) - view.now

    def _waste(self, pin: PinView, batch: int, view: EngineView) -> Waste:
        return waste(pin.tokens, self._remaining_tool_s(pin, view), batch, view)

    @staticmethod
    def _swap_budget_blocks(batch_tokens: int, seqs: int, view: EngineView) -> int:
        """Blocks the CPU link moves in the time of one decode step of the batch."""
        seqs = max(seqs, 1)
        # decode_time takes each sequence's context: the batch's mean, rounded up.
        step_s = view.costs.decode_time(-(-batch_tokens // seqs), seqs)
        per_block_s = view.costs.transfer_time(1)
        return int(step_s / per_block_s) if per_block_s > 0 else 0


class PredictedInferCeptEngine(InferCeptEngine):
    """The tool's duration from the stream: its kind's mean so far, else every kind's;
    a call that expects a tool before any tool ended is taken to run none."""

    needs = frozenset({Capability.COSTS, Capability.TICK, Capability.TOOL_FIGURES})

    def tool_s(self, call: CallView, view: EngineView) -> float | None:
        if not call.expects_tool:
            return None
        mean = tool_mean_s(view, call.next_tool)
        return mean if mean is not None else 0.0
