"""Justitia's admission half (seed 004 Appendix C, Fig. 14): when an agent instance
arrives, its type's model predicts its cost from its input (§4.2), and the prediction
goes on the stream (``task_cost``) for the engine half, which ranks the instance's
calls by it. Justitia admits every session at once: it schedules inside the engine,
not in front of it.

Where it runs: in the gateway (and the simulator's gateway), which reads the agent's
input from its first call's prompt (``SessionView.prompt_text``) and has
scikit-learn; the vLLM engine's environment does not need it.

The predictor starts trained on ``pretrain_per_type`` generated agents of each of
seed 004's ten classes (``workloads.agent_prompts``, drawn as the task-parallel
workloads draw their agents, from a seed of their own), as the paper trains on
earlier runs of the same agents (Appendix A), and learns online: when an instance's
last session ends its true cost, summed from its calls' ``llm_end`` tokens (Eq. 1),
is a new sample of its type (``CostPredictor.observe``).

NOTE: ours, where the paper is silent:
- An instance is learnt from when its last session first ends (a session that starts
  after, as an aggregation step, rejoins it, ``instances``, and is not learnt).
- An instance's input is its first session's first prompt; an instance without text
  (a client whose prompt the gateway could not read) is predicted its type's typical
  cost (``CostPredictor.typical``), and is not learnt from.
- A session without an agent name is of type ``UNNAMED``. A type without a model is
  predicted the typical cost of all types; past ``MAX_AGENT_TYPES`` types a new
  type is not learnt (each keeps up to ``WINDOW`` samples and a model: a client
  naming a new type per session must not grow the gateway without bound).
- A refit (every ``REFIT_EVERY`` agents of a type; 0.3-2 s of one core) runs where
  the instance ends, on the gateway's event loop.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentmars.sdk.events import MAX_COUNT, AnyEvent, LLMEnd, TaskCost
from agentmars.server.policies.instances import Instances
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.justitia.predictor import CostPredictor
from agentmars.server.policies.views import AdmissionView, SessionView
from agentmars.server.workloads.agent_prompts import sample_mix
from agentmars.server.workloads.kv_cost import kv_token_time

UNNAMED = "unnamed"
MAX_AGENT_TYPES = 256
PRETRAIN_SEED = 4004
"""Seed of the generated training agents (ours): apart from any workload's seed, so
that the predictor never trains on the agents it is then asked about."""


@dataclass(slots=True)
class Arrived:
    agent: str
    text: str
    cost: float = 0.0
    """True KV token-time so far: its finished calls' (Eq. 1)."""
    learnt: bool = False
    """Its cost is a sample of its type already (when its last session first ended)."""


@functools.cache
def _pretrained(per_type: int, seed: int) -> CostPredictor:
    predictor = CostPredictor(seed=seed)
    if per_type:
        predictor.fit(sample_mix(per_type, PRETRAIN_SEED + seed))
    return predictor


def pretrained_predictor(per_type: int, seed: int = 0) -> CostPredictor:
    """A predictor trained on ``per_type`` generated agents of every class (trained once
    per process; each caller gets its own copy, which learns on its own)."""
    return copy.deepcopy(_pretrained(per_type, seed))


class CostAdmission(AdmissionHalf):
    """Predicts each agent instance's cost at its arrival and announces it (module
    docstring); admits every session."""

    def __init__(self, predictor: CostPredictor) -> None:
        self.predictor = predictor
        self.instances = Instances()
        self.arrived: dict[str, Arrived] = {}

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        for session in queue:
            self._arrive(session)
        return queue

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, LLMEnd):
            instance = self.arrived.get(self.instances.task_of(event.session_id))
            if instance is not None:
                instance.cost += kv_token_time(event.prompt_tokens or 0, event.output_tokens or 0)
        change = self.instances.follow(event)
        instance = self.arrived.get(change.ended) if change.ended else None
        if instance is not None and not instance.learnt:
            instance.learnt = True
            self._learn(instance)
        for task in change.forgotten:
            self.arrived.pop(task, None)

    def _arrive(self, session: SessionView) -> None:
        task = session.task_id
        self.instances.join(session.session_id, task)
        if task in self.arrived:
            return
        agent = session.agent or UNNAMED
        text = session.prompt_text if session.prompt_text.strip() else ""
        self.arrived[task] = Arrived(agent, text)
        self.publish(
            TaskCost(task_id=task, agent=agent, cost=self._predict(agent, text), source="gateway")
        )

    def _predict(self, agent: str, text: str) -> float:
        """A type without a model (unknown, or past the bound) is predicted the typical
        cost of all; before any cost is known, 0 (the engine half then serves the
        instances in arrival order)."""
        if not self.predictor.types:
            return 0.0
        predicted = self.predictor.predict(agent, text) if text else math.nan
        if not math.isfinite(predicted):
            predicted = self.predictor.typical(agent)
        # A model's output for an input unlike any it was trained on is still a cost
        # an event can carry (a count of at most MAX_COUNT token-iterations).
        return min(max(predicted, 0.0), float(MAX_COUNT))

    def _learn(self, instance: Arrived) -> None:
        types = self.predictor.types
        if instance.agent not in types and len(types) >= MAX_AGENT_TYPES:
            return
        if instance.text and instance.cost > 0:
            self.predictor.observe(instance.agent, instance.text, instance.cost)
