"""Autellix's Program-Level Attained Service (Luo et al., 2025; no official code):
notes/baselines.md "Autellix"."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence

from agentmars.sdk.events import AnyEvent, SessionEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import EngineHalf, KVDecision, Policy, SortKey
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView

BOUNDARIES_S = (0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
"""Where the queues meet: queue i (0-based) holds the attained service in
[b_{i-1}, b_i), with b_{-1} = 0 and the last queue unbounded, so a call that has used
up its queue's quantum is in the next one. Ours: the paper does not publish them;
these are a third-party reimplementation's."""
BETA = 8.0
"""Anti-starvation ratio (ours, same source)."""


@register
class Autellix(Policy):
    """Autellix PLAS: program-level least attained service, multi-level queues.

    A call's queue follows the engine time its program has already received: the
    service of the program's completed calls plus the call's own, against the queue
    boundaries, so a call that uses up its queue's quantum moves down. FCFS inside a
    queue. A call whose program has waited ``beta`` times longer than it was served
    ((program wait + call wait) / (program service + call service) >= beta) moves to
    the first queue. The preemption victim is the running call of the lowest queue
    (the latest among equals), and preempted calls' KV is swapped to the CPU tier.
    Variant: PLAS (not ATLAS), within vLLM V1's loop, which never preempts a running
    call for a waiting one."""

    name = "autellix"
    variant = "Autellix paper, PLAS with K queues and anti-starvation (third-party parameters)"

    def __init__(self, boundaries_s: Sequence[float] = BOUNDARIES_S, beta: float = BETA) -> None:
        if list(boundaries_s) != sorted(boundaries_s) or any(b <= 0 for b in boundaries_s):
            raise ValueError("boundaries_s must be positive and increasing")
        if beta <= 0:
            raise ValueError("beta must be positive")
        self.boundaries_s = tuple(boundaries_s)
        self.beta = beta

    def settings(self) -> dict[str, object]:
        return {"boundaries_s": list(self.boundaries_s), "beta": self.beta}

    def engine(self) -> AutellixEngine:
        return AutellixEngine(self.boundaries_s, self.beta)


class AutellixEngine(EngineHalf):
    """PLAS inside the engine (``Autellix``'s docstring)."""

    # NOTE: ours — without a CPU tier a preempted call is recomputed, as vLLM does; the
    # queues, the anti-starvation rule and the victim are PLAS's either way.
    uses = frozenset({Capability.CPU_TIER})
    preempt_by_swap = True

    def __init__(self, boundaries_s: tuple[float, ...], beta: float) -> None:
        self.boundaries_s = boundaries_s
        self.beta = beta
        self._service: dict[str, float] = defaultdict(float)
        self._wait: dict[str, float] = defaultdict(float)

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, SessionEnd):
            self._service.pop(event.session_id, None)
            self._wait.pop(event.session_id, None)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        self._service[call.session_id] += call.service_s
        self._wait[call.session_id] += max(view.now - call.arrival_s - call.service_s, 0.0)
        return super().on_call_finished(call, view)

    def queue(self, call: CallView, view: EngineView) -> int:
        """0-based queue index of a call now."""
        service = self._service[call.session_id] + call.service_s
        wait = self._wait[call.session_id] + max(view.now - call.arrival_s - call.service_s, 0.0)
        if service > 0 and wait / service >= self.beta:
            return 0
        return bisect.bisect_right(self.boundaries_s, service)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return (self.queue(call, view), call.arrival_s)

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        # max() keeps the first of equals: look from the newest running call back.
        return max(reversed(running), key=lambda call: self.priority(call, view))
