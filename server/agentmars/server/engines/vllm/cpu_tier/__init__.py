"""A CPU KV tier for the vLLM scheduler plugin (``Capability.CPU_TIER``), on vLLM 0.32's
own ``OffloadingConnector``: docs/vllm-plugin.md "The CPU KV tier".

vLLM's connector stores every computed block to the tier as it is computed
(write-through: the tier is inclusive of what the GPU holds), finds a waiting call's
prefix there when the GPU's prefix cache misses it and loads it back. What is ours:
the spec that lets it run on the CPU platform (a host-copy worker), a manager that can
drop a session's chunks, and an eviction order by the sessions' labels, which the
plugin sets from the policy's decisions (``offload``, ``labels``).

This module imports no vLLM: ``kv_transfer_config`` is what ``agentmars serve`` and the
launcher pass to vLLM. ``offload`` (the classes vLLM loads by module path, in its
engine-core process) does.
"""

from __future__ import annotations

import json

MODULE = "agentmars.server.engines.vllm.cpu_tier.offload"
"""Where vLLM finds the spec and the eviction policy (importable in the vLLM
environment, which has agentmars installed)."""
SPEC = "AgentmarsOffloadingSpec"
CACHE_POLICY = "AgentmarsCachePolicy"
CPU_BLOCKS_KEY = "agentmars_cpu_blocks"
"""``kv_connector_extra_config``'s entry for the tier's size in KV blocks (ours; the
spec turns it into vLLM's ``cpu_bytes_to_use``)."""


def kv_transfer_config(cpu_blocks: int) -> str:
    """vLLM's ``--kv-transfer-config`` for a CPU tier of ``cpu_blocks`` KV blocks."""
    if cpu_blocks <= 0:
        raise ValueError("the CPU tier needs a positive number of blocks")
    return json.dumps(
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": SPEC,
                "spec_module_path": MODULE,
                "eviction_policy": CACHE_POLICY,
                "cache_policy_module_path": MODULE,
                CPU_BLOCKS_KEY: cpu_blocks,
                # Decoded tokens are stored too (vLLM's default stores only the
                # prompt, v1/kv_offload/base.py:620-622): an agent's next call
                # resends them as its prompt.
                "offload_prompt_only": False,
            },
        },
        separators=(",", ":"),
    )
