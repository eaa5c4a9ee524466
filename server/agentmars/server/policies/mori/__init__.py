"""``mori``: seed 003's idleness-ranked KV tiering (MORI, "Idleness is Relative"): each
agent program's KV is in one of three tiers, GPU HBM, CPU DRAM or discarded
(Waiting), ranked by a windowed idleness (Eq. 1).

- ``idleness``: Eq. 1 over the last ``k`` cycles, without the time the scheduler
  imposes.
- ``tiers``: the tiers and what the scheduler keeps of each program.
- ``placement``: who is demoted and promoted, in §4.3.1's order.
- ``scheduler``: the engine half: the control loop every tick, lazy demotion, gating,
  typed offloading on the engine's mechanism (§4.3.2).
- ``admission``: the gateway half: new programs after the gated ones, smallest first.
- ``settings``: the constants the paper leaves open.

docs/mori.md: each mechanism, its settings, what runs where.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentmars.server.policies.interface import Policy
from agentmars.server.policies.mori.admission import MoriAdmission
from agentmars.server.policies.mori.scheduler import MoriEngine
from agentmars.server.policies.mori.settings import MoriSettings
from agentmars.server.policies.registry import register, settings_signature


@register
class Mori(Policy):
    """Seed 003's MORI: GPU / CPU / Waiting tiers by relative idleness.

    The module docstring says how; the settings are in ``settings``."""

    name = "mori"
    variant = (
        "seed 003 §4: Eq. 1 idleness over k cycles, sticky demotion (Acting first, most "
        "idle first, lazy for Reasoning) and promotion (CPU, then Waiting, then new "
        "programs smallest first) every tick, per-tier capacity; one replica"
    )

    def __init__(self, **settings: Any) -> None:
        self.options = MoriSettings(**settings)

    __signature__ = settings_signature(MoriSettings)

    def settings(self) -> dict[str, Any]:
        return self.options.as_dict()

    def admission(self) -> MoriAdmission:
        return MoriAdmission()

    def engine(self) -> MoriEngine:
        return MoriEngine(replace(self.options))
