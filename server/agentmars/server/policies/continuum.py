"""Continuum (Li et al., 2025): keep a program's KV across its tool calls for a
time-to-live, and serve pinned programs first (notes/baselines.md "Continuum")."""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Sequence
from statistics import fmean

import numpy as np

from agentmars.sdk.events import (
    AnyEvent,
    CallEvent,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    ToolEnd,
)
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import (
    EngineHalf,
    KVDecision,
    Pin,
    Policy,
    Release,
    SortKey,
)
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView, PinView


class ContinuumEngine(EngineHalf):
    """Continuum inside the engine (``Continuum``'s docstring); Continuum has no
    admission control of its own."""

    needs = frozenset({Capability.TOOL_FIGURES})
    priority_reads_pins_only = True

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._durations: dict[str, list[float]] = defaultdict(list)

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, ToolEnd):
            self._durations[event.tool].append(event.duration_s)

    def mean_duration(self, tool: str | None) -> float | None:
        seen = self._durations.get(tool) if tool is not None else None
        return fmean(seen) if seen else None

    def ttl(self, call: CallView, view: EngineView) -> float | None:
        """How long to pin the finished call's KV (None: do not pin)."""
        mean = self.mean_duration(call.next_tool)
        return self.ttl_s if mean is None or mean <= self.ttl_s else None

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        ttl = self.ttl(call, view)
        return Pin(ttl) if ttl is not None else Release()

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return (view.pin_of(call.session_id) is None, call.session_arrival_s)

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        candidates = [call for call in running if call.expects_tool] or list(running)
        return max(candidates, key=lambda call: call.session_arrival_s)

    def reclaim(
        self, pins: Sequence[PinView], needed_blocks: int, view: EngineView
    ) -> Sequence[PinView]:
        return sorted(pins, key=lambda pin: pin.session_arrival_s, reverse=True)


@register
class Continuum(Policy):
    """Continuum with a fixed TTL: the released code (vllm-continuum), seed 000's
    "Continuum".

    A call that ends in a tool call pins its session's KV for ``ttl_s`` when that tool's
    mean past duration is at most ``ttl_s`` (unknown tools included), and not at all
    otherwise. Waiting calls of pinned sessions go first, then program-level FCFS (by
    the session's arrival). The preemption victim is the running call whose session
    arrived last and is not on its last step; pins are dropped latest session first.
    Pins also go when the session's next call is admitted, at expiry unless that call
    already waits, and when the session ends (the engine's part)."""

    name = "continuum"
    variant = "vllm-continuum released code: fixed TTL 2.0 s for tools with mean duration <= 2.0 s"

    def __init__(self, ttl_s: float = 2.0) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.ttl_s = ttl_s

    def settings(self) -> dict[str, float]:
        return {"ttl_s": self.ttl_s}

    def engine(self) -> ContinuumEngine:
        return ContinuumEngine(self.ttl_s)


DEFAULT_SAMPLES = 100
"""Samples before the dynamic TTL replaces the fixed one, overall and per tool (paper)."""
DELAY_WINDOW = 100
"""Calls in the sliding mean of queueing delay after an eviction (ours)."""
MISS_FRACTION = 0.5
"""A call that follows a tool "had its KV evicted" when less than this fraction of its
prompt hit the cache (ours: the paper does not say how it tells). Its queueing delay is
taken as its time to first token (ours: the stream has no separate queueing time)."""


class ContinuumDynamicEngine(ContinuumEngine):
    """Continuum-Dy inside the engine (``ContinuumDynamic``'s docstring)."""

    needs = frozenset({Capability.TOOL_FIGURES, Capability.COSTS})

    def __init__(self, ttl_s: float, min_samples: int) -> None:
        super().__init__(ttl_s)
        self.min_samples = min_samples
        self._all: list[float] = []
        self._by_tool_sorted: dict[str, list[float]] = defaultdict(list)
        self._delays: deque[float] = deque(maxlen=DELAY_WINDOW)
        self._after_tool: set[tuple[str, str]] = set()
        """Calls that follow a tool, by (session id, call id): call ids are unique only
        within their session (``agentmars.sdk.events.CallEvent``)."""
        self._ttft: dict[tuple[str, str], float] = {}
        self._turn_pairs: list[tuple[int, int]] = []

    def on_event(self, event: AnyEvent) -> None:
        super().on_event(event)
        if isinstance(event, ToolEnd):
            bisect.insort(self._all, event.duration_s)
            bisect.insort(self._by_tool_sorted[event.tool], event.duration_s)
        elif isinstance(event, LLMSubmit) and event.follows_tool:
            self._after_tool.add(_call_key(event))
        elif isinstance(event, LLMFirstToken) and _call_key(event) in self._after_tool:
            self._ttft[_call_key(event)] = event.ttft_s
        elif isinstance(event, LLMEnd) and _call_key(event) in self._after_tool:
            self._note_delay(event)
        elif isinstance(event, SessionEnd):
            self._turn_pairs.extend((k, event.turns - k) for k in range(event.turns))

    def _note_delay(self, end: LLMEnd) -> None:
        self._after_tool.discard(_call_key(end))
        ttft = self._ttft.pop(_call_key(end), None)
        evicted = (end.cached_tokens or 0) < MISS_FRACTION * (end.prompt_tokens or 0)
        if ttft is not None and evicted:
            self._delays.append(ttft)

    def ttl(self, call: CallView, view: EngineView) -> float | None:
        if len(self._all) < self.min_samples:
            return super().ttl(call, view)
        own = self._by_tool_sorted.get(call.next_tool or "", [])
        durations = own if len(own) >= self.min_samples else self._all
        gain = self.queueing_delay() * self.eta() + view.costs.prefill_time(call.num_tokens)
        best_tau, best_value = 0.0, 0.0
        for index, tau in enumerate(durations):
            value = (index + 1) / len(durations) * gain - tau
            if value > best_value:
                best_tau, best_value = tau, value
        return best_tau or None

    def queueing_delay(self) -> float:
        return fmean(self._delays) if self._delays else 0.0

    def eta(self) -> float:
        if len(self._turn_pairs) < 2:
            return 1.0
        k, rest = np.array(self._turn_pairs, dtype=float).T
        if k.std() == 0 or rest.std() == 0:
            return 1.0
        return float(-np.corrcoef(k, rest)[0, 1])


@register
class ContinuumDynamic(Continuum):
    """Continuum with the paper's dynamic TTL: seed 000's "Continuum-Dy".

    tau* = argmax over candidate tau of P(d <= tau) * (T * eta + PrefillReload(context))
    - tau, where P is the empirical CDF of the tool's past durations (the CDF over all
    tools until that tool has ``min_samples`` samples; the fixed TTL until
    ``min_samples`` samples overall), T the sliding mean queueing delay of calls whose
    KV was evicted, eta = -Corr(k, N - k) over the turns of finished sessions (k: turn
    index, N: the session's turns; 1 until two sessions have finished), and
    PrefillReload the engine's own prefill-time estimate for the context (where the
    paper fits a quadratic to observed prefill times: the estimate is that fit's
    target). Candidates: 0 and every past duration. tau* = 0 means no pin."""

    name = "continuum-dy"
    variant = "Continuum paper: dynamic TTL from the tool-duration CDF (Continuum-Dy)"

    def __init__(self, ttl_s: float = 2.0, min_samples: int = DEFAULT_SAMPLES) -> None:
        super().__init__(ttl_s)
        if min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        self.min_samples = min_samples

    def settings(self) -> dict[str, float]:
        return {"ttl_s": self.ttl_s, "min_samples": self.min_samples}

    def engine(self) -> ContinuumDynamicEngine:
        return ContinuumDynamicEngine(self.ttl_s, self.min_samples)


def _call_key(event: CallEvent) -> tuple[str, str]:
    return (event.session_id, event.call_id)
