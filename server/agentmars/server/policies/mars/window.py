"""UpdateWindow, the External Admission Controller of MARS's control plane (seed 000
§4.2, Algorithm 1 lines 10-19): how many sessions may be in the data plane.

A raw window W_adm moves by AIMD once per control interval: a multiplicative decrease
(to beta times the sessions in flight, never below W_min, never up) when the CPU or the
KV is overloaded, an additive increase (alpha) when the KV has slack, the CPU is not
overloaded and sessions wait for it. Hysteresis: an overload must persist for
``overload_intervals`` consecutive updates, and KV usage between the slack and the
overload thresholds holds the window. The admission limit is W_adm clamped by the
CPU limit (Little's law on the tool and LLM duration EMAs) and the KV limit (a soft
cap: the share of the available KV a pass may fill shrinks as usage rises).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentmars.server.policies.mars.settings import MarsSettings


@dataclass(frozen=True, slots=True)
class Pressure:
    """The dual-pressure telemetry of one control update (seed 000 Table 1)."""

    cpu_overloaded: bool
    kv_usage: float | None
    """Blocks held by running calls over the pool (None: no KV figures yet)."""


def cpu_limit(
    cpu_ema_s: float | None,
    tool_ema_s: float | None,
    llm_ema_s: float | None,
    tool_cores: int,
    settings: MarsSettings,
) -> float:
    """W_cpu: the fewest sessions whose tool phases keep at least
    ``cpu_target_utilization`` of the tool cores busy, each keeping a core busy for
    cpu / (tool + LLM) of its time (the EMAs of a tool's CPU time and duration, and
    of an LLM call's duration; inf until they are known, or for tools that use no CPU,
    e.g. remote APIs).
    NOTE: ours — rounded up. Rounded down, a limit between two whole sessions (1.7 on
    one core) leaves the cores idle for the rest, so the admitted sessions' throughput
    falls below what the cores can serve and the gateway's queue grows without bound
    wherever the tools are the bottleneck; a real overload above the target is the
    AIMD cut's to answer."""
    if not cpu_ema_s or not tool_ema_s or llm_ema_s is None or tool_cores <= 0:
        return math.inf
    share = cpu_ema_s / (tool_ema_s + llm_ema_s)
    return math.ceil(tool_cores * settings.cpu_target_utilization / share)


def soft_cap_share(kv_usage: float | None, settings: MarsSettings) -> float:
    """The share of the available KV one admission pass may fill: all of it up to
    ``kv_soft_cap_start``, then linearly less, none at ``kv_overload_usage``."""
    if kv_usage is None:
        return 1.0
    span = settings.kv_overload_usage - settings.kv_soft_cap_start
    return min(max((settings.kv_overload_usage - kv_usage) / span, 0.0), 1.0)


def kv_limit(
    active: int, queued_blocks: list[int], available_blocks: int | None, share: float
) -> float:
    """W_kv: the sessions in flight plus those at the head of the packed queue whose
    projected blocks fit in ``share`` of the available blocks (inf without figures).
    NOTE: ours — the head always fits while the window is empty, so an engine never
    idles with work waiting."""
    if available_blocks is None:
        return math.inf
    room = available_blocks * share
    fit = 0
    for need in queued_blocks:
        if need > room and (fit or active):
            break
        room -= need
        fit += 1
    return active + fit


class AdmissionWindow:
    """W_adm and its AIMD updates; ``reason`` says why it last changed."""

    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self.raw = settings.max_window
        self.reason = "start"
        self._last_update_s: float | None = None
        self._overloaded_updates = 0

    def update(self, now: float, pressure: Pressure, active: int, waiting: bool) -> bool:
        """One AIMD step when the control interval has passed; True if it had (the
        step may leave W_adm as it was)."""
        if self._last_update_s is not None and now - self._last_update_s < (
            self.settings.control_interval_s
        ):
            return False
        self._last_update_s = now
        settings = self.settings
        kv_overloaded = pressure.kv_usage is not None and (
            pressure.kv_usage >= settings.kv_overload_usage
        )
        if pressure.cpu_overloaded or kv_overloaded:
            self._overloaded_updates += 1
            if self._overloaded_updates >= settings.overload_intervals:
                self._overloaded_updates = 0
                # From what is in flight, and only below the window: sessions admitted
                # stay until they end, so an overload outlasts the cut that answers it,
                # and cutting again from the cut window would close it to W_min (TCP
                # cuts once per window of data for the same reason).
                cut = max(settings.min_window, math.floor(active * settings.aimd_beta))
                if cut < self.raw:
                    self.raw = cut
                    self.reason = "cpu overload" if pressure.cpu_overloaded else "kv overload"
            return True
        self._overloaded_updates = 0
        slack = pressure.kv_usage is None or pressure.kv_usage < settings.kv_slack_usage
        if slack and waiting and self.raw < settings.max_window:
            self.raw = min(self.raw + settings.aimd_alpha, settings.max_window)
            self.reason = "kv slack"
        return True
