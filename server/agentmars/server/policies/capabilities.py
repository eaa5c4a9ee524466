"""What a policy needs from the engine and the gateway that run its halves, and the
check every host makes at start (docs/policies.md "Capabilities").

Each half of a policy lists what it needs (``needs``); each host (the simulator, the twin,
the vLLM plugin, the gateway) lists what it provides and calls ``refuse_unless`` before
it builds the policy's half, so a policy either starts with everything it uses or is
refused with a message naming what is missing, never failing later inside a step.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Capability(StrEnum):
    COSTS = "costs"
    """Time estimates of prefill, decode and KV transfer (``EngineView.costs``): the
    simulator's cost model; on vLLM, a profile named with ``--profile``."""
    CPU_TIER = "cpu-tier"
    """A CPU KV tier to offload pins and preempted calls to."""
    PREFETCH = "kv-prefetch"
    """The ``prefetch`` session action loads a session's CPU-tier copy back to the GPU
    ahead of its next call (the simulator and the twin); elsewhere the next call loads
    it as it comes."""
    TICK = "tick"
    """The engine half's ``tick`` called every ``tick_interval_s``, also while idle."""
    PAUSE = "pause"
    """The engine can pause a session (drop its KV, hold its calls) and resume it."""
    TOOL_FIGURES = "tool-figures"
    """Tool events of the stream reach the half (active and queued tools, durations);
    on vLLM only through the gateway's side channel."""
    KV_FIGURES = "kv-figures"
    """The engine's KV figures reach the admission half (sampled ``kv_stats``)."""
    AGENT_INSTANCE = "agent-instance"
    """Calls carry the agent instance (task) id of fan-out agents (``CallView.task_id``)."""
    SM_PARTITION = "sm-partition"
    """Prefills and decodes run at the same time in partitions of the GPU's SMs
    (``EngineHalf.decode_sm_share``): the simulator with a profile's SM-share curves;
    a CPU engine has no SMs."""


HOW_TO_PROVIDE = {
    Capability.COSTS: "start the vLLM plugin with a cost profile (--profile NAME or FILE)",
    Capability.CPU_TIER: "use an engine with a CPU KV tier (the simulator; a twin profile "
    "with cpu_kv_blocks; vLLM started by agentmars serve, which gives it one)",
    Capability.PREFETCH: "use the simulator or the twin (the vLLM plugin loads a CPU-tier "
    "copy only when the session's next call asks for it)",
    Capability.TICK: "use an engine that drives the policy's tick",
    Capability.PAUSE: "use an engine that can pause sessions",
    Capability.TOOL_FIGURES: "connect the gateway's side channel (--plugin-hints-addr) so "
    "tool events reach the engine",
    Capability.KV_FIGURES: "connect the gateway to the engine's KV figures "
    "(--plugin-kv-addr, or run behind agentmars serve)",
    Capability.AGENT_INSTANCE: "send the task id with each call (vllm_xargs.task_id)",
    Capability.SM_PARTITION: "use the simulator with a profile that has SM-share curves "
    "(sm_share_curves, e.g. the consumer-GPU profiles)",
}


class PolicyRefused(ValueError):
    """A host cannot serve a policy; the message names what is missing and how to get it."""


def refuse_unless(
    policy: str, needs: Iterable[Capability], provides: Iterable[Capability], host: str
) -> None:
    """Raise ``PolicyRefused`` unless ``host`` provides everything the half of ``policy``
    it runs needs."""
    missing = sorted(set(needs) - set(provides))
    if missing:
        hints = "; ".join(f"{need.value}: {HOW_TO_PROVIDE[need]}" for need in missing)
        raise PolicyRefused(
            f"{host} cannot run policy {policy!r}: it needs "
            f"{', '.join(need.value for need in missing)}, which {host} does not provide "
            f"({hints})"
        )


def runs_without(
    policy: str, uses: Iterable[Capability], provides: Iterable[Capability], host: str
) -> str | None:
    """What a host says at start when it runs a half without some of what it ``uses``
    (None: it has all of it)."""
    missing = sorted(set(uses) - set(provides))
    if not missing:
        return None
    hints = "; ".join(f"{need.value}: {HOW_TO_PROVIDE[need]}" for need in missing)
    return (
        f"{host} runs policy {policy!r} without {', '.join(need.value for need in missing)} "
        f"({hints})"
    )
