"""A test policy for the plugin's CPU KV tier (``test_cpu_tier_on_vllm.py``): a call
whose ``vllm_xargs`` name the agent ``idle`` is offloaded when it finishes (its session
labelled idle in the CPU tier), every other call released (its session inactive).
vLLM loads it with ``AGENTMARS_POLICY_MODULES=tests.server.engines.vllm.offload_policy``
(the repository's root is on vLLM's ``PYTHONPATH``); it imports nothing but agentmars.
"""

from __future__ import annotations

from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import EngineHalf, KVDecision, Offload, Policy, Release
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView

NAME = "test-offload-idle"
IDLE = "idle"
"""The ``agent`` (``vllm_xargs``) of the calls that are offloaded."""


class OffloadIdleEngine(EngineHalf):
    needs = frozenset({Capability.CPU_TIER})

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        return Offload() if call.agent == IDLE else Release()


@register
class OffloadIdle(Policy):
    """Test policy: ``idle`` calls offloaded to the CPU tier, the others released."""

    name = NAME
    variant = "test-only (tests/server/engines/vllm/offload_policy.py)"

    def engine(self) -> OffloadIdleEngine:
        return OffloadIdleEngine()
