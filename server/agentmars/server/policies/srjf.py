"""Shortest remaining job first at the agent level (seed 004 §5.1, baseline (e)):
Justitia's own predicted costs, served smallest remaining first, with no fairness."""

from __future__ import annotations

import itertools
from collections import defaultdict

from agentmars.sdk.events import AnyEvent, LLMEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.instances import Instances
from agentmars.server.policies.interface import EngineHalf, SortKey
from agentmars.server.policies.justitia import Justitia
from agentmars.server.policies.justitia.scheduler import AnnouncedCosts
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView
from agentmars.server.workloads.kv_cost import kv_token_time


@register
class SRJF(Justitia):
    """SRJF: agent instances by predicted cost left, smallest first (seed 004's baseline).

    The gateway half is Justitia's (each instance's KV token-time predicted from its
    input and announced); the engine half serves waiting calls by their instance's
    predicted cost less the KV token-time its finished calls used (Eq. 1), the least
    first, never preempting a running call for a waiting one (as Justitia, on the same
    engine); swapped on preemption where there is a CPU tier. Unbounded starvation of
    large agents is what seed 004 §5.3 shows of it. NOTE: ours — the paper gives SRJF
    in one line; the remaining cost counts finished calls only (a running call's
    progress is not announced on the stream), floored at 0. Settings: Justitia's."""

    name = "srjf"
    variant = "seed 004 §5.1 (e): Justitia's predicted agent cost, shortest remaining first"

    def engine(self) -> EngineHalf:
        return SRJFEngine()


class SRJFEngine(EngineHalf):
    uses = frozenset({Capability.CPU_TIER})
    preempt_by_swap = True

    def __init__(self) -> None:
        self.costs = AnnouncedCosts()
        self.instances = Instances()
        self.used: defaultdict[str, float] = defaultdict(float)
        """Instance -> KV token-time of its finished calls."""
        self._order: dict[str, int] = {}
        """Instance -> its arrival rank, for ties."""
        self._arrivals = itertools.count()

    def on_event(self, event: AnyEvent) -> None:
        self.costs.on_event(event)
        if isinstance(event, LLMEnd):
            task = self.instances.task_of(event.session_id)
            self.used[task] += kv_token_time(event.prompt_tokens or 0, event.output_tokens or 0)
        for task in self.instances.follow(event).forgotten:
            self.costs.forget(task)
            self.used.pop(task, None)
            self._order.pop(task, None)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        task = call.task_id
        self.instances.join(call.session_id, task)
        order = self._order.get(task)
        if order is None:
            order = self._order[task] = next(self._arrivals)
        return (max(self.costs.cost(task) - self.used[task], 0.0), order)
