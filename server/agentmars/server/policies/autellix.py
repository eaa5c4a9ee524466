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

BOUNDARIES_CALLS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""Where the queues meet, in units of the mean engine time of a finished call: queue i
(0-based) holds the attained service in [b_{i-1}, b_i) x that mean, with b_{-1} = 0 and
the last queue unbounded, so a call that has used up its queue's quantum is in the
next one. NOTE: ours. The paper publishes neither K nor the boundaries; a third-party
reimplementation used 7 queues doubling from 0.02 s (0.02 ... 0.64 s), which on this
engine is less than one prefill step (an 8,192-token chunk takes 0.17-2.2 s on
h100-qwen3-coder-30b, a 2,048-token one 0.04-1.6 s on cpu-tiny), so every program
past its first call sat in the last queue and PLAS was FCFS. We keep the 7 doubling
queues and measure the first quantum in calls instead of seconds: a program's queue is
then about log2 of the calls it has had served, whatever the model, the hardware and
the load (a call's service is the time of the steps it ran in, which grows with the
batch)."""
BETA = 8.0
"""Anti-starvation ratio (ours: the third-party reimplementation's)."""


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
    call for a waiting one.

    The boundaries are ``boundaries_calls`` times the mean service of the calls
    finished so far (``BOUNDARIES_CALLS``, ours), or fixed ``boundaries_s`` seconds
    when given. NOTE: ours — until a call has finished there is no mean to scale by,
    and every call is in the first queue (FCFS, anti-starvation aside)."""

    name = "autellix"
    variant = (
        "Autellix paper, PLAS with K queues and anti-starvation; boundaries in mean call "
        "service (ours), beta from a third-party reimplementation"
    )

    def __init__(
        self,
        boundaries_calls: Sequence[float] | None = None,
        boundaries_s: Sequence[float] | None = None,
        beta: float = BETA,
    ) -> None:
        if boundaries_calls is not None and boundaries_s is not None:
            raise ValueError("give boundaries_calls or boundaries_s, not both")
        if boundaries_s is not None:
            _check_boundaries(boundaries_s, "boundaries_s")
        if boundaries_calls is not None:
            _check_boundaries(boundaries_calls, "boundaries_calls")
        if beta <= 0:
            raise ValueError("beta must be positive")
        self.boundaries_s = tuple(boundaries_s) if boundaries_s is not None else None
        self.boundaries_calls = (
            tuple(boundaries_calls) if boundaries_calls is not None else BOUNDARIES_CALLS
        )
        self.beta = beta

    def settings(self) -> dict[str, object]:
        if self.boundaries_s is not None:
            return {"boundaries_s": list(self.boundaries_s), "beta": self.beta}
        return {"boundaries_calls": list(self.boundaries_calls), "beta": self.beta}

    def engine(self) -> AutellixEngine:
        if self.boundaries_s is not None:
            return AutellixEngine(self.boundaries_s, self.beta, unit_s=1.0)
        return AutellixEngine(self.boundaries_calls, self.beta)


def _check_boundaries(boundaries: Sequence[float], name: str) -> None:
    if list(boundaries) != sorted(boundaries) or any(b <= 0 for b in boundaries):
        raise ValueError(f"{name} must be positive and increasing")


class AutellixEngine(EngineHalf):
    """PLAS inside the engine (``Autellix``'s docstring). ``boundaries`` are in units
    of ``unit_s`` seconds of service; None: of the mean service of the calls finished
    so far (those the host passes to ``on_call_finished``: the simulator leaves out a
    session's last call, the twin and the plugin do not)."""

    # NOTE: ours — without a CPU tier a preempted call is recomputed, as vLLM does; the
    # queues, the anti-starvation rule and the victim are PLAS's either way.
    uses = frozenset({Capability.CPU_TIER})
    preempt_by_swap = True

    def __init__(
        self, boundaries: tuple[float, ...], beta: float, unit_s: float | None = None
    ) -> None:
        self.boundaries = boundaries
        self.beta = beta
        self.unit_s = unit_s
        self._service: dict[str, float] = defaultdict(float)
        self._wait: dict[str, float] = defaultdict(float)
        self._finished_calls = 0
        self._finished_service_s = 0.0

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, SessionEnd):
            self._service.pop(event.session_id, None)
            self._wait.pop(event.session_id, None)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        self._service[call.session_id] += call.service_s
        self._wait[call.session_id] += max(view.now - call.arrival_s - call.service_s, 0.0)
        self._finished_calls += 1
        self._finished_service_s += call.service_s
        return super().on_call_finished(call, view)

    def unit(self) -> float | None:
        """Seconds of service one unit of the boundaries is (None: not known yet)."""
        if self.unit_s is not None:
            return self.unit_s
        if self._finished_service_s <= 0:
            return None
        return self._finished_service_s / self._finished_calls

    def queue(self, call: CallView, view: EngineView) -> int:
        """0-based queue index of a call now."""
        service = self._service[call.session_id] + call.service_s
        wait = self._wait[call.session_id] + max(view.now - call.arrival_s - call.service_s, 0.0)
        if service > 0 and wait / service >= self.beta:
            return 0
        unit = self.unit()
        if unit is None:
            return 0
        return bisect.bisect_right(self.boundaries, service / unit)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return (self.queue(call, view), call.arrival_s)

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        # max() keeps the first of equals: look from the newest running call back.
        return max(reversed(running), key=lambda call: self.priority(call, view))
