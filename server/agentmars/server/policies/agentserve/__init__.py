"""``agentserve``: seed 002's phase-aware, TPOT-driven scheduler for agents on one
consumer GPU (Zhang et al., AgentServe), as an engine half (seed 002 changes the
engine; admission is vLLM's: every session at once).

Each call is classified as a cold prefill, a resume prefill or a decode
(``classify``) and queued by Algorithm 1 lines 12-18: decodes and resume prefills of at
most B_prefill new tokens in Q_D, cold prefills and longer resumes in Q_P. Q_D is
served first (``priority``); a Q_P prefill is chunked by the engine's token budget as
any other (``chunk`` is the engine's). Every Delta_t the step-level TPOT moves
B_prefill and the decode SM reservation R_min (``control``, from ``tick``). Where the
engine can partition the SMs (``Capability.SM_PARTITION``: the simulator with a
profile's SM-share curves), the decodes and the Q_D resume prefills run on R_min
rounded up to a Green Context (``partition``), the Q_P prefills on the rest, at the
same time (``decode_sm_share``, ``runs_with_decodes``); elsewhere (the twin, vLLM's CPU
backend, a profile without curves) the scheduling half runs alone: classification,
budget and decode-first order, in one shared step.

docs/agentserve.md: each mechanism, its settings and why, what runs where.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentmars.sdk.events import AnyEvent
from agentmars.server.policies.agentserve.classify import (
    Classified,
    Contexts,
    Queue,
    classify,
    queue_of,
)
from agentmars.server.policies.agentserve.control import TpotControl
from agentmars.server.policies.agentserve.partition import green_context_share
from agentmars.server.policies.agentserve.settings import AgentServeSettings
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import (
    EngineHalf,
    KVDecision,
    Policy,
    SessionAction,
    SortKey,
)
from agentmars.server.policies.registry import register, settings_signature
from agentmars.server.policies.views import CallView, EngineView


@register
class AgentServe(Policy):
    """Seed 002's AgentServe: cold / resume / decode queues, a TPOT-driven resume budget
    and decode SM reservation.

    The module docstring says how; the settings are in ``settings``."""

    name = "agentserve"
    variant = (
        "seed 002 Algorithm 1: Q_D / Q_P by kind and B_prefill, TPOT_step control of "
        "B_prefill and R_min every Delta_t, R_min rounded up to one of ten Green "
        "Contexts; the SM partition in the simulator's step model only; every constant "
        "the paper leaves open is ours (policies/agentserve/settings.py)"
    )

    def __init__(self, **settings: Any) -> None:
        self.options = AgentServeSettings(**settings)

    __signature__ = settings_signature(AgentServeSettings)

    def settings(self) -> dict[str, Any]:
        return self.options.as_dict()

    def engine(self) -> AgentServeEngine:
        # A copy: the halves share no object with the policy (frozen as it is).
        return AgentServeEngine(replace(self.options))


class AgentServeEngine(EngineHalf):
    """AgentServe inside the engine (``AgentServe``)."""

    needs = frozenset({Capability.TICK})
    uses = frozenset({Capability.COSTS, Capability.SM_PARTITION})

    def __init__(self, settings: AgentServeSettings) -> None:
        self.settings = settings
        self.tick_interval_s = settings.control_interval_s
        self.control = TpotControl(settings)
        self.contexts = Contexts()

    def on_event(self, event: AnyEvent) -> None:
        self.contexts.on_event(event)

    def classify(self, call: CallView, view: EngineView) -> Classified:
        return classify(call, self.contexts, view)

    def queue(self, call: CallView, view: EngineView) -> Queue:
        """Q_D or Q_P under the current B_prefill."""
        return queue_of(self.classify(call, view), self.control.b_prefill)

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        # Q_D before Q_P, each first come, first served.
        return (self.queue(call, view) is Queue.PREFILL, call.arrival_s)

    def runs_with_decodes(self, call: CallView, view: EngineView) -> bool:
        return self.queue(call, view) is Queue.DECODE

    def decode_sm_share(self, view: EngineView) -> float:
        return green_context_share(self.control.r_min, self.settings.contexts)

    def tick(self, view: EngineView) -> tuple[SessionAction, ...]:
        self.control.update(view)
        return ()

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        self.contexts.finished(call)
        return super().on_call_finished(call, view)


@register
class AgentServeStatic(AgentServe):
    """Seed 002's "No-Alg" ablation (§IV-D), the static SM split the issue compares
    against: AgentServe's classification, queues and partition with the control loop
    off, so R_min stays at ``r_base`` (rounded up to a Green Context) and B_prefill at
    ``b_max``."""

    name = "agentserve-static"
    variant = "seed 002's No-Alg ablation: AgentServe with a static SM split and budget"

    def engine(self) -> AgentServeEngine:
        return StaticAgentServeEngine(replace(self.options))


class StaticAgentServeEngine(AgentServeEngine):
    def tick(self, view: EngineView) -> tuple[SessionAction, ...]:
        # The step-level TPOT is still measured (its record), never acted on.
        self.control.measure(view)
        return ()
