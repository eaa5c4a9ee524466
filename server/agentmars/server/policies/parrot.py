"""Parrot's agent-level FCFS (Lin et al., OSDI'24), as seed 004 §5.1 runs it (baseline
(c)): the calls of the agent instance that arrived first are served first."""

from __future__ import annotations

import itertools

from agentmars.sdk.events import AnyEvent
from agentmars.server.policies.instances import Instances
from agentmars.server.policies.interface import EngineHalf, Policy, SortKey
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView


@register
class Parrot(Policy):
    """Parrot: agent-level FCFS; the calls of the earliest agent instance first.

    An instance (``CallView.task_id``) arrives with its first session; waiting calls
    are served by their instance's arrival, then their own, so all the calls of an
    earlier agent go before any of a later one; a running call is never preempted for
    a waiting one. Variant: only the scheduling order seed 004 names ("the FCFS policy
    at the agent level"); Parrot's semantic variables, prefix sharing across
    requests and DAG-aware batching are not modelled (the engines' own prefix caching
    stands in for the sharing)."""

    name = "parrot"
    variant = "seed 004 §5.1 (c): Parrot's agent-level FCFS order only"

    def engine(self) -> ParrotEngine:
        return ParrotEngine()


class ParrotEngine(EngineHalf):
    priority_reads_pins_only = True  # an instance's arrival never changes

    def __init__(self) -> None:
        self.instances = Instances()
        self.arrived: dict[str, tuple[float, int]] = {}
        """Instance -> (its first session's arrival, arrival rank)."""
        self._ranks = itertools.count()

    def on_event(self, event: AnyEvent) -> None:
        for task in self.instances.follow(event).forgotten:
            self.arrived.pop(task, None)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        self.instances.join(call.session_id, call.task_id)
        arrived = self.arrived.get(call.task_id)
        if arrived is None:
            arrived = self.arrived[call.task_id] = (call.session_arrival_s, next(self._ranks))
        return (*arrived, call.arrival_s)
