"""MARS (seed 000): co-scheduling of GPU inference and CPU tool execution for agents,
this project's default policy; the paper's MARS (``mars-paper``); and the ablations
(seed 000 §6.5's, and one per mechanism this project added). docs/mars.md is
the design as built, one file per mechanism:

- ``control_plane``: the admission half (Algorithm 1's BalanceAndAdmit), with
  ``pack_queue`` (PackQueue) and ``window`` (UpdateWindow), and the tail guard;
- ``scheduler``: the engine half, with ``coordinator`` (the Priority-Aware
  Coordinator) and ``co_scheduler`` (the Opportunistic Co-Scheduler), the eviction
  to the CPU tier and the loads ahead of need;
- ``kv_tier``: where a parked session's KV waits (GPU, CPU tier, nowhere);
- ``settings``: every constant the paper leaves open.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.policies.mars.control_plane import (
    MarsControlPlane,
    NoTailGuardControlPlane,
    NoTierControlPlane,
    PaperControlPlane,
)
from agentmars.server.policies.mars.scheduler import (
    MarsScheduler,
    NoCoordinatorScheduler,
    NoCoSchedulerScheduler,
    NoPrefetchScheduler,
    PaperScheduler,
)
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.registry import register, settings_signature


@register
class Mars(Policy):
    """MARS: dual-pressure admission, a windowed MLFQ, chunk shrinking and KV kept across
    tool calls only while that pays (seed 000 §3-§4; docs/mars.md), with three
    mechanisms of this project's (issue 39): a CPU KV tier, loads back from it ahead
    of need, and a tail guard in admission.

    Admission (the gateway): the waiting sessions packed by projected KV blocks
    (smallest first; largest first under CPU overload; first-fit when all are long),
    a session waiting past ``tail_guard_factor`` times its predicted service first;
    admitted while fewer than min(W_adm, W_cpu, W_kv) are in flight, W_adm binding
    only under pressure; W_adm moves by AIMD on a control interval, W_cpu from the
    tool and LLM duration EMAs, W_kv a soft cap on the KV the GPU and the CPU tier
    hold together. Engine: calls ordered by a level from their KV footprint, their
    session's windowed service and their wait; a chunk that does not fit shrinks to
    the blocks that do; a session parked at a tool keeps its KV on the GPU, in the
    CPU tier or nowhere, whichever wastes least (``kv_tier``), re-judged as the tool
    runs; under pressure pins go to the tier first, lowest priority first; a
    session's KV comes back from the tier when its tool ends or is due to.
    Settings: ``MarsSettings``."""

    name = "mars"
    variant = (
        "seed 000 §3-§4 (no released code; constants ours, docs/mars.md) with a CPU KV "
        "tier, loads ahead of need and a tail guard (ours)"
    )

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
class MarsPaper(Mars):
    """MARS as seed 000 describes it: no CPU tier, no loads ahead, no tail guard (seed
    000's figures are reproduced with this one)."""

    name = "mars-paper"
    variant = "seed 000 §3-§4 (no released code; constants ours, docs/mars.md)"

    def admission(self) -> AdmissionHalf:
        return PaperControlPlane(replace(self.config))

    def engine(self) -> MarsScheduler:
        return PaperScheduler(replace(self.config))


@register
class MarsNoTier(Mars):
    """MARS without the CPU tier (and so without loads ahead): KV kept or dropped."""

    name = "mars-no-tier"
    variant = "ablation (ours)"

    def admission(self) -> AdmissionHalf:
        return NoTierControlPlane(replace(self.config))

    def engine(self) -> MarsScheduler:
        return PaperScheduler(replace(self.config))


@register
class MarsNoPrefetch(Mars):
    """MARS without loads ahead of need: a session's next call loads its KV."""

    name = "mars-no-prefetch"
    variant = "ablation (ours)"

    def engine(self) -> MarsScheduler:
        return NoPrefetchScheduler(replace(self.config))


@register
class MarsNoTailGuard(Mars):
    """MARS without the tail guard: PackQueue's order alone, W_adm always binding."""

    name = "mars-no-tail-guard"
    variant = "ablation (ours)"

    def admission(self) -> AdmissionHalf:
        return NoTailGuardControlPlane(replace(self.config))


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
