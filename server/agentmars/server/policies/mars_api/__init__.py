"""``mars-api``: seed 001's memory- and API-rooted scheduler for API-augmented
requests (Shahout et al.), the engine half only (seed 001 changes the engine's
scheduler; admission is vLLM's: every request at once).

Before a call is scheduled, its output length before the API call and the API's
duration are predicted per API class (``predictors``), and its KV's handling during
the API call is chosen by the waste equations (``handling``). Waiting and running calls
are ranked together at every step by the area under their memory over time under
that handling (``ranking``), a starving call first (``starvation``), and the running
batch is re-selected from the ranking (Algorithm 1): a waiting call ranked before a
running one that cannot start displaces it (``EngineHalf.preemptive``; preempted as
vLLM preempts, by recompute). When a call reaches its API call, its KV is handled as
chosen: Preserve pins it, Discard releases it, Swap offloads it to the CPU tier (the
copy out and back charged by the engine). The preemption victim under memory pressure
is the last-ranked running call.

Where it runs (docs/policies.md): the simulator and the twin have everything; the
vLLM plugin has no CPU tier (its KV lives in host memory already), so Swap is never
chosen there, and the handling is Preserve or Discard by the same equations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentmars.sdk.events import AnyEvent, SessionEnd
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import (
    EngineHalf,
    KVDecision,
    Offload,
    Pin,
    Policy,
    Release,
    SessionAction,
    SortKey,
)
from agentmars.server.policies.mars_api.handling import Handling, choose_handling
from agentmars.server.policies.mars_api.predictors import ApiPredictors, Prediction
from agentmars.server.policies.mars_api.ranking import memory_time
from agentmars.server.policies.mars_api.starvation import STARVATION_THRESHOLD, StarvationGuard
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView


@register
class MarsApi(Policy):
    """Seed 001's scheduler for API-augmented requests: calls ranked by their memory
    over time, KV handled across API calls by the waste equations.

    The module docstring says how. ``starvation_threshold``: steps a call
    may wait before it is starving (seed 001: 100). ``prediction_error``: the relative
    standard deviation of the Gaussian error multiplied into every prediction, for the
    misprediction study (0: none); ``error_seed`` seeds it."""

    name = "mars-api"
    variant = (
        "seed 001 Algorithm 1: handling by INFERCEPT's waste equations, ranking by memory "
        "over time, starvation threshold 100; predictions are per-class running means "
        "(ours, for the paper's OPT-125M classifier)"
    )

    def __init__(
        self,
        starvation_threshold: int = STARVATION_THRESHOLD,
        prediction_error: float = 0.0,
        error_seed: int = 0,
    ) -> None:
        if isinstance(starvation_threshold, bool) or not isinstance(starvation_threshold, int):
            raise ValueError(
                f"starvation_threshold must be an integer, got {starvation_threshold!r}"
            )
        if starvation_threshold < 1:
            raise ValueError("starvation_threshold must be at least 1")
        if not 0 <= prediction_error <= 10:
            raise ValueError("prediction_error must be between 0 and 10 (a relative sd)")
        self.starvation_threshold = starvation_threshold
        self.prediction_error = float(prediction_error)
        self.error_seed = int(error_seed)

    def settings(self) -> dict[str, object]:
        return {
            "starvation_threshold": self.starvation_threshold,
            "prediction_error": self.prediction_error,
            "error_seed": self.error_seed,
        }

    def engine(self) -> MarsApiEngine:
        return MarsApiEngine(
            StarvationGuard(self.starvation_threshold),
            ApiPredictors(error=self.prediction_error, seed=self.error_seed),
        )


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What is decided for a call before it is scheduled."""

    prediction: Prediction
    handling: Handling | None
    """None: the call calls no API."""


class MarsApiEngine(EngineHalf):
    needs = frozenset({Capability.COSTS, Capability.TICK})
    uses = frozenset({Capability.CPU_TIER})
    tick_interval_s = 0.0
    preemptive = True

    def __init__(self, guard: StarvationGuard, predictors: ApiPredictors) -> None:
        self.guard = guard
        self.predictors = predictors
        self.plans: dict[str, CallPlan] = {}
        self.calls_of: dict[str, set[str]] = {}

    def on_event(self, event: AnyEvent) -> None:
        self.predictors.on_event(event)
        if isinstance(event, SessionEnd):
            # An engine may not report a session's last call as finished (the
            # simulator does not): what was kept for its calls goes with the session.
            for call_id in self.calls_of.pop(event.session_id, ()):
                self._forget(call_id)

    def plan(self, call: CallView, view: EngineView) -> CallPlan:
        """The call's predictions and handling, decided the first time it is seen."""
        plan = self.plans.get(call.call_id)
        if plan is None:
            prediction = self.predictors.predict(call)
            handling = None
            if call.expects_tool:
                others = sum(other.num_tokens for other in view.running if other is not call)
                handling = choose_handling(
                    call.prompt_tokens + prediction.output_tokens,
                    prediction.api_s,
                    others,
                    view,
                    can_swap=view.cpu_total_blocks > 0,
                )
            plan = self.plans[call.call_id] = CallPlan(prediction, handling)
            self.calls_of.setdefault(call.session_id, set()).add(call.call_id)
        return plan

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        plan = self.plan(call, view)
        score = memory_time(call, plan.prediction, plan.handling, view)
        return (self.guard.group(call.call_id), score)

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        return max(running, key=lambda call: (self.priority(call, view), call.arrival_s))

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        self.guard.count_step(view.waiting, view.running)
        return ()

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        self.predictors.observe_output(call)
        plan = self.plans.get(call.call_id)
        handling = plan.handling if plan is not None else None
        self._forget(call.call_id)
        self.calls_of.get(call.session_id, set()).discard(call.call_id)
        if handling is Handling.PRESERVE:
            return Pin()
        if handling is Handling.SWAP:
            return Offload()
        return Release()

    def _forget(self, call_id: str) -> None:
        self.plans.pop(call_id, None)
        self.predictors.forget(call_id)
        self.guard.forget(call_id)
