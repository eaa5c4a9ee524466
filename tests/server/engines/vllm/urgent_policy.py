"""A test policy for the plugin's displacement (``EngineHalf.preemptive``;
``test_displacement.py``): calls whose ``vllm_xargs`` name the agent ``urgent`` rank
before all others, ties by arrival. vLLM loads it with
``AGENTMARS_POLICY_MODULES=tests.server.engines.vllm.urgent_policy`` (the repository's
root is on vLLM's ``PYTHONPATH``); it imports nothing but agentmars.

Settings: ``preemptive`` (the engine half's class variable: a waiting urgent call
displaces running ones, else it waits as under vLLM's own rule), ``pin`` (pin every
finished call of a session, so that pins can stand in the way) and ``partial`` (a
waiting call whose whole prompt does not fit may start on a chunk of what does).
"""

from __future__ import annotations

from typing import Any

from agentmars.server.policies.interface import (
    EngineHalf,
    KVDecision,
    Pin,
    Policy,
    Release,
    SortKey,
)
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView

NAME = "test-urgent-first"
URGENT = "urgent"
"""The ``agent`` (``vllm_xargs``) of the calls that rank first."""


class UrgentFirstEngine(EngineHalf):
    def __init__(self, *, pin: bool, partial: bool) -> None:
        self.pin = pin
        self.partial = partial

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        return (0 if call.agent == URGENT else 1, call.arrival_s)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        return Pin() if self.pin else Release()

    def may_start_partial(self, call: CallView, view: EngineView) -> bool:
        return self.partial

    def chunk(self, call: CallView, tokens: int, fit_tokens: int, view: EngineView) -> int:
        # A partial start takes what fits (as MARS's does); else vLLM's chunk.
        return min(tokens, fit_tokens) if self.partial else tokens


class PreemptiveUrgentFirstEngine(UrgentFirstEngine):
    preemptive = True


@register
class UrgentFirst(Policy):
    """Test policy: ``urgent`` calls first; preemptive or not."""

    name = NAME
    variant = "test-only (tests/server/engines/vllm/urgent_policy.py)"

    def __init__(self, preemptive: bool = False, pin: bool = False, partial: bool = False):
        self.preemptive = preemptive
        self.pin = pin
        self.partial = partial

    def settings(self) -> dict[str, Any]:
        return {"preemptive": self.preemptive, "pin": self.pin, "partial": self.partial}

    def engine(self) -> UrgentFirstEngine:
        half = PreemptiveUrgentFirstEngine if self.preemptive else UrgentFirstEngine
        return half(pin=self.pin, partial=self.partial)
