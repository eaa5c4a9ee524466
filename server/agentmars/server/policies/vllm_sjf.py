"""vLLM-SJF (Shahout et al., ICLR'25), as seed 004 §5.1 runs it (baseline (b)):
inference-level shortest job first on predicted inference lengths."""

from __future__ import annotations

from collections import defaultdict

from agentmars.sdk.events import AnyEvent, LLMEnd, SessionEnd, SessionStart
from agentmars.server.policies.interface import EngineHalf, Policy, SortKey
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView

MAX_AGENTS = 256
"""Agent types whose means are kept (ours: the names come from clients; past this a
type's calls are predicted by the mean of all calls)."""
MAX_STEPS = 256
"""Steps of a type with a mean of their own; later steps use the type's mean."""


@register
class VllmSJF(Policy):
    """vLLM-SJF: waiting calls by predicted output length, shortest first.

    A call's output is predicted as the mean output of the finished calls of the same
    agent type at the same step (turn) of their session, else of the type, else of all
    calls (0 before any call finished: such calls go first, in arrival order); ties by
    prompt length, then arrival. No agent-level view and no preemption of a running
    call. Variant: seed 004 runs Shahout et al.'s DistilBERT predictor of inference
    durations; ours (NOTE) learns the means online from the stream instead (no model
    is downloaded here), which ranks calls by the same thing, how long they decode,
    less sharply than a model reading each prompt."""

    name = "vllm-sjf"
    variant = "seed 004 §5.1 (b): per-call SJF; output predicted by online per-type/step means"

    def engine(self) -> VllmSJFEngine:
        return VllmSJFEngine()


class _Mean:
    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def value(self) -> float | None:
        return self.total / self.count if self.count else None


class VllmSJFEngine(EngineHalf):
    def __init__(self) -> None:
        self.by_step: defaultdict[tuple[str, int], _Mean] = defaultdict(_Mean)
        self.by_agent: defaultdict[str, _Mean] = defaultdict(_Mean)
        self.overall = _Mean()
        self._agent_of: dict[str, str] = {}

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, SessionStart) and event.agent:
            self._agent_of[event.session_id] = event.agent
        elif isinstance(event, SessionEnd):
            self._agent_of.pop(event.session_id, None)
        elif isinstance(event, LLMEnd) and event.status == "ok" and event.output_tokens:
            self._learn(event)

    def _learn(self, end: LLMEnd) -> None:
        output = float(end.output_tokens or 0)
        agent = self._agent_of.get(end.session_id)
        if agent is not None and (agent in self.by_agent or len(self.by_agent) < MAX_AGENTS):
            self.by_agent[agent].add(output)
            if end.turn is not None and end.turn < MAX_STEPS:
                self.by_step[agent, end.turn].add(output)
        self.overall.add(output)

    def predicted_output(self, call: CallView) -> float:
        for mean in (self.by_step.get((call.agent, call.turn)), self.by_agent.get(call.agent)):
            if mean is not None and (value := mean.value()) is not None:
                return value
        return self.overall.value() or 0.0

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        self._agent_of.setdefault(call.session_id, call.agent)
        return (self.predicted_output(call), call.prompt_tokens, call.arrival_s)
