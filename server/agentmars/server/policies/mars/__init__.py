"""MARS (seed 000): co-scheduling of GPU inference and CPU tool execution for agents,
this project's default policy, and its ablations (seed 000 §6.5). docs/mars.md is
the design as built, one file per mechanism:

- ``control_plane``: the admission half (Algorithm 1's BalanceAndAdmit), with
  ``pack_queue`` (PackQueue) and ``window`` (UpdateWindow);
- ``scheduler``: the engine half, with ``coordinator`` (the Priority-Aware
  Coordinator) and ``co_scheduler`` (the Opportunistic Co-Scheduler);
- ``settings``: every constant the paper leaves open.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.policies.mars.control_plane import MarsControlPlane
from agentmars.server.policies.mars.scheduler import (
    MarsScheduler,
    NoCoordinatorScheduler,
    NoCoSchedulerScheduler,
)
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.registry import register, settings_signature


@register
class Mars(Policy):
    """MARS: dual-pressure admission, a windowed MLFQ, chunk shrinking and pins that
    last only while they pay (seed 000 §3-§4; docs/mars.md).

    Admission (the gateway): the waiting sessions packed by projected KV blocks
    (smallest first; largest first under CPU overload; first-fit when all are long),
    admitted while fewer than min(W_adm, W_cpu, W_kv) are in flight; W_adm moves by
    AIMD on a control interval, W_cpu from the tool and LLM duration EMAs, W_kv a soft
    cap on the available KV. Engine: calls ordered by a level from their KV footprint,
    their session's windowed service and their wait; a chunk that does not fit shrinks
    to the blocks that do; a session's KV is pinned across its tool call while the
    prefill it saves outweighs the price of holding it, re-judged as the tool runs;
    pins go before any running call is preempted. Settings: ``MarsSettings``."""

    name = "mars"
    variant = "seed 000 §3-§4 (no released code; constants ours, docs/mars.md)"

    def __init__(self, **settings: Any) -> None:
        self.config = MarsSettings(**settings)

    def settings(self) -> dict[str, Any]:
        return self.config.as_dict()

    __signature__ = settings_signature(MarsSettings)

    def admission(self) -> AdmissionHalf:
        return MarsControlPlane(replace(self.config))

    def engine(self) -> MarsScheduler:
        return MarsScheduler(replace(self.config))


@register
class MarsNoCoordinator(Mars):
    """MARS without the Priority-Aware Coordinator (seed 000 §6.5): FCFS order and
    vLLM's victim inside the engine; admission and the co-scheduler as in ``mars``."""

    name = "mars-no-coordinator"
    variant = "seed 000 §6.5 ablation"

    def engine(self) -> MarsScheduler:
        return NoCoordinatorScheduler(replace(self.config))


@register
class MarsNoControlPlane(Mars):
    """MARS without the External Control Plane (seed 000 §6.5): every session is
    admitted at once; the engine half as in ``mars``."""

    name = "mars-no-control-plane"
    variant = "seed 000 §6.5 ablation"

    def admission(self) -> AdmissionHalf:
        return AdmissionHalf()


@register
class MarsNoCoScheduler(Mars):
    """MARS without the Opportunistic Co-Scheduler (seed 000 §6.5): whole prompts only
    and no pins; admission and the coordinator as in ``mars``."""

    name = "mars-no-coscheduler"
    variant = "seed 000 §6.5 ablation"

    def engine(self) -> MarsScheduler:
        return NoCoSchedulerScheduler(replace(self.config))
