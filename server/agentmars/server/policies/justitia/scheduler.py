"""Justitia's engine half (seed 004 §4.3, Appendix C): the engine's waiting calls in
the order of their agent instance's virtual finish tag, non-preemptive per call.

The costs come from the admission half, which reads the agent's input in the gateway
and predicts it there (``task_cost`` events, ``admission``): the engine's environment
need not run the predictor. The engine half keeps the GPS virtual clock
(``virtual_time``), for two reasons: the fair share is of the engine's KV (``M``, the
paper's KV capacity, is the engine's KV tokens), and time is the engine's decode
iterations, the unit of the cost (KV tokens held x iterations held): ``now`` is
``EngineView.decode_steps``, so ``dV/dt = M / N`` per iteration exactly as Eq. 2 has it,
and the clock stands still while the engine has nothing to decode.

An instance arrives in GPS when its first call is ranked, with the cost its
``task_cost`` announced. NOTE: ours — an instance whose cost has not reached the
engine (no admission half announcing costs, or the event still on its way) arrives
with the geometric mean of the costs announced so far, or 0 before any, which makes
its tag ``V(a)``: agent-level FCFS among such instances, Parrot's order. Its tag is
then fixed (§4.3: a later arrival never changes an earlier tag), whatever announcement
follows; a session that starts after the instance's others ended (an aggregation step
waiting for its branches) rejoins it, with that tag, while the instance is remembered
(``policies.instances``).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from agentmars.sdk.events import AnyEvent, TaskCost
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.instances import Instances
from agentmars.server.policies.interface import EngineHalf, SortKey
from agentmars.server.policies.justitia.virtual_time import VirtualClock
from agentmars.server.policies.views import CallView, EngineView

ANNOUNCED = 16_384
"""Announced costs kept, newest first (ours: a cost is read when its instance's first
call is ranked, and is then in the clock; one never read is another replica's instance
when the gateway serves several, and would otherwise be kept until the instance is
forgotten, which this engine never learns)."""


class AnnouncedCosts:
    """The instances' costs as ``task_cost`` events announce them (the newest
    ``limit``); an unannounced instance is given the geometric mean of the announced
    ones (0 before any)."""

    def __init__(self, limit: int = ANNOUNCED) -> None:
        self.limit = limit
        self._costs: OrderedDict[str, float] = OrderedDict()
        self._log_sum = 0.0
        self._positive = 0

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, TaskCost):
            self._costs[event.task_id] = event.cost
            self._costs.move_to_end(event.task_id)
            if len(self._costs) > self.limit:
                self._costs.popitem(last=False)
            if event.cost > 0:
                self._log_sum += math.log(event.cost)
                self._positive += 1

    def cost(self, task_id: str) -> float:
        announced = self._costs.get(task_id)
        if announced is not None:
            return announced
        return math.exp(self._log_sum / self._positive) if self._positive else 0.0

    def forget(self, task_id: str) -> None:
        self._costs.pop(task_id, None)


class JustitiaEngine(EngineHalf):
    """Waiting calls by their instance's tag ``F = V(a) + C`` (ties: the instance's
    arrival order, then the engine's FCFS); a running call is never displaced (§4.3).
    KV preempted when the cache is full goes to the CPU tier where the engine has one
    (Appendix C: vLLM's swapped queue), else it is recomputed."""

    uses = frozenset({Capability.CPU_TIER})
    preempt_by_swap = True
    priority_reads_pins_only = True  # a call's key is its instance's tag, fixed at arrival

    def __init__(self) -> None:
        self.costs = AnnouncedCosts()
        self.instances = Instances()
        self.clock: VirtualClock | None = None

    def on_event(self, event: AnyEvent) -> None:
        self.costs.on_event(event)
        for task in self.instances.follow(event).forgotten:
            self.costs.forget(task)
            if self.clock is not None and self.clock.knows(task):
                self.clock.forget(task)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        clock = self._clock(view)
        self.instances.join(call.session_id, call.task_id)
        if not clock.knows(call.task_id):
            clock.arrive(call.task_id, self.costs.cost(call.task_id), view.decode_steps)
        return clock.serve_key(call.task_id)

    def _clock(self, view: EngineView) -> VirtualClock:
        if self.clock is None:
            self.clock = VirtualClock(capacity=max(view.total_blocks * view.block_size, 1))
        return self.clock
